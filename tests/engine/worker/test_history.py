"""The worker's in-memory history of each connector's throughput and lag (``engine.worker.history``)."""

from __future__ import annotations

import threading

from engine.testing.worker import FakeGroups
from engine.worker.history import ConnectorHistory, Sample, records_per_s
from engine.worker.records import ConnectorRecord


def test_the_history_keeps_one_window_of_samples_per_connector_and_no_more() -> None:
    history = ConnectorHistory(window_s=60, interval_s=5)
    for n in range(100):
        history.record("a", Sample(float(n * 5), n * 10, n))
    samples = history.series("a")["samples"]
    assert len(samples) == 13  # 60 s / 5 s, both ends included
    assert (samples[0]["at"], samples[-1]["at"]) == (435.0, 495.0)
    assert samples[0]["records_per_s"] is None  # nothing before it is kept
    assert samples[-1]["records_per_s"] == 2.0


def test_throughput_is_unknown_across_an_unreadable_group_or_an_offset_reset() -> None:
    assert records_per_s(Sample(0, 100, 0), Sample(4, 300, 0)) == 50.0
    assert records_per_s(Sample(0, None, None), Sample(4, 300, 0)) is None
    assert records_per_s(Sample(0, 300, 0), Sample(4, 0, 300)) is None


def test_sampling_reads_every_connector_and_forgets_deleted_ones() -> None:
    history = ConnectorHistory()
    a, b = ConnectorRecord("a", {}), ConnectorRecord("b", {})
    groups = FakeGroups()
    history.sample_all([a, b], groups.read)
    history.sample_all([a], groups.read)
    assert groups.reads == ["a", "b", "a"]
    assert [s["lag"] for s in history.series("a")["samples"]] == [None, None]  # groups unreadable: unknown
    assert history.series("b")["samples"] == []


def test_the_sampling_loop_stops_when_told() -> None:
    history = ConnectorHistory(interval_s=0.01)
    stop = threading.Event()
    loop = threading.Thread(target=history.run, args=(lambda: [ConnectorRecord("a", {})], FakeGroups().read, stop))
    loop.start()
    while not history.series("a")["samples"]:
        stop.wait(0.01)
    stop.set()
    loop.join(5)
    assert not loop.is_alive()

