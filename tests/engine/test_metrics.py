"""Metrics: plain counters readable in tests, and the same numbers on a Prometheus endpoint."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.metrics import NS_PER_SECOND as NS
from engine.metrics import Metrics


@pytest.fixture
def metrics() -> Iterator[Metrics]:
    created = Metrics()
    yield created
    created.close()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the endpoint, by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_cycles_accumulate_records_batches_bytes_and_time_per_phase(metrics: Metrics) -> None:
    metrics.record_cycle(records_in=10, batches=2, elapsed_ns=20, bytes_in=1000,
                         phase_ns={"poll": 5, "operators": 7})
    metrics.record_cycle(records_in=1, batches=1, elapsed_ns=9, bytes_in=100, phase_ns={"poll": 2, "sink": 3})
    snapshot = metrics.snapshot()
    assert (snapshot["cycles"], snapshot["records_in"], snapshot["batches_in"]) == (2, 11, 3)
    assert (snapshot["bytes_in"], snapshot["cycle_ns"]) == (1100, 29)
    assert snapshot["phase_ns"] == {"poll": 7, "operators": 7, "sink": 3}
    assert snapshot["last_cycle_phase_ns"] == {"poll": 2, "sink": 3}


def test_records_out_accumulate_rows_and_bytes(metrics: Metrics) -> None:
    metrics.records_out(4, bytes_out=400)
    metrics.records_out(1)
    assert (metrics.snapshot()["records_out"], metrics.snapshot()["bytes_out"]) == (5, 400)


def test_checkpoints_keep_totals_and_the_last_duration_and_size(metrics: Metrics) -> None:
    metrics.checkpoint(duration_s=0.75, size_bytes=500)
    metrics.checkpoint(duration_s=0.25, size_bytes=200)
    snapshot = metrics.snapshot()
    assert (snapshot["checkpoints"], snapshot["checkpoint_seconds_total"], snapshot["checkpoint_bytes_total"]) == (
        2, 1.0, 700)
    assert (snapshot["last_checkpoint_seconds"], snapshot["last_checkpoint_bytes"]) == (0.25, 200)


def test_consumer_lag_is_the_latest_value_per_source_and_partition(metrics: Metrics) -> None:
    metrics.lag("orders-eu", {0: 50, 1: 7})
    metrics.lag("orders-us", {0: 1})
    metrics.lag("orders-eu", {0: 3})
    assert metrics.snapshot()["consumer_lag"] == {"orders-eu": {0: 3}, "orders-us": {0: 1}}


def test_late_rows_dead_letters_and_failed_cycles_are_counted(metrics: Metrics) -> None:
    metrics.late_rows(2, diverted=False)
    metrics.late_rows(4, diverted=True)
    metrics.dead_letters(3)
    metrics.cycle_failed()
    snapshot = metrics.snapshot()
    assert (snapshot["late_rows_dropped"], snapshot["late_rows_diverted"]) == (2, 4)
    assert (snapshot["dead_letters"], snapshot["cycles_failed"]) == (3, 1)


def test_snapshot_is_a_copy_that_later_records_do_not_change(metrics: Metrics) -> None:
    metrics.record_cycle(records_in=1, phase_ns={"poll": 1})
    before = metrics.snapshot()
    metrics.record_cycle(records_in=1, phase_ns={"poll": 1})
    assert (before["cycles"], before["phase_ns"]) == (1, {"poll": 1})


def test_served_endpoint_returns_the_counters(metrics: Metrics) -> None:
    metrics.record_cycle(records_in=10, batches=2, elapsed_ns=3 * NS, bytes_in=1000, phase_ns={"poll": 2 * NS})
    metrics.records_out(4, bytes_out=400)
    metrics.checkpoint(duration_s=0.5, size_bytes=4096)
    metrics.lag("orders-eu", {2: 12})
    metrics.late_rows(1, diverted=False)
    metrics.late_rows(2, diverted=True)
    metrics.dead_letters(5)
    metrics.cycle_failed()
    samples = scrape(metrics.serve(0))
    assert samples[("epochline_cycles_total", ())] == 1
    assert samples[("epochline_batches_in_total", ())] == 2
    assert samples[("epochline_records_in_total", ())] == 10
    assert samples[("epochline_bytes_in_total", ())] == 1000
    assert samples[("epochline_records_out_total", ())] == 4
    assert samples[("epochline_bytes_out_total", ())] == 400
    assert samples[("epochline_cycle_seconds_total", ())] == 3.0
    assert samples[("epochline_phase_seconds_total", (("phase", "poll"),))] == 2.0
    assert samples[("epochline_checkpoints_total", ())] == 1
    assert samples[("epochline_last_checkpoint_seconds", ())] == 0.5
    assert samples[("epochline_last_checkpoint_bytes", ())] == 4096
    assert samples[("epochline_consumer_lag", (("partition", "2"), ("source", "orders-eu")))] == 12
    assert samples[("epochline_late_rows_total", (("outcome", "dropped"),))] == 1
    assert samples[("epochline_late_rows_total", (("outcome", "diverted"),))] == 2
    assert samples[("epochline_dead_letters_total", ())] == 5
    assert samples[("epochline_cycles_failed_total", ())] == 1


def test_endpoint_shows_values_recorded_after_it_started(metrics: Metrics) -> None:
    port = metrics.serve(0)
    metrics.dead_letters(1)
    assert scrape(port)[("epochline_dead_letters_total", ())] == 1


def test_two_instances_serve_their_own_counters_side_by_side() -> None:
    first, second = Metrics(), Metrics()
    try:
        first.dead_letters(1)
        second.dead_letters(2)
        ports = first.serve(0), second.serve(0)
        assert [scrape(port)[("epochline_dead_letters_total", ())] for port in ports] == [1, 2]
    finally:
        first.close()
        second.close()


def test_close_stops_the_endpoint(metrics: Metrics) -> None:
    port = metrics.serve(0)
    metrics.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_serving_twice_is_refused(metrics: Metrics) -> None:
    metrics.serve(0)
    with pytest.raises(RuntimeError, match="already served"):
        metrics.serve(0)
