"""Event-time alignment: a source's partitions are released in event-time order, each in offset order, and
the cut never covers a row still held."""

from __future__ import annotations

import pyarrow as pa
import pytest

from connectors.alignment import EventTimeAligner
from connectors.batch import SourceBatch
from connectors.dead_letter import DeadLetter

NEVER = -(2**63)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def fetch(partition: int, first_offset: int, times: list[int | None],
          dead_at: list[int] | None = None) -> SourceBatch:
    """Rows of one partition at consecutive offsets (a dead letter takes an offset of its own)."""
    dead_at = dead_at or []
    offsets = [o for o in range(first_offset, first_offset + len(times) + len(dead_at)) if o not in dead_at]
    batch = pa.record_batch({
        "t": pa.array(times, pa.int64()),
        "__kafka_partition": pa.array([partition] * len(times), pa.int32()),
        "__kafka_offset": pa.array(offsets, pa.int64()),
    })
    letters = [DeadLetter("in", partition, offset, None, b"?", "bad", "decode") for offset in dead_at]
    return SourceBatch("source", batch, letters, 10 * len(times))


def hold(aligner: EventTimeAligner, batch: SourceBatch, end: int | None = None) -> None:
    """``batch`` fetched; ``end``: the consumer then reported the partition's end at that offset."""
    partition = batch.batch.column("__kafka_partition")[0].as_py()
    last = max([*batch.batch.column("__kafka_offset").to_pylist(), *(d.offset for d in batch.dead_letters)])
    aligner.hold(batch, {partition: last + 1}, {} if end is None else {partition: end})


def released(aligner: EventTimeAligner, handed_out: dict[int, int] | None = None) -> list[tuple[int, int]]:
    batch, _ = aligner.release(handed_out or {})
    if batch is None:
        return []
    return list(zip(batch.batch.column("__kafka_partition").to_pylist(), batch.batch.column("t").to_pylist(),
                    strict=True))


def test_a_backlog_of_two_partitions_is_released_in_event_time_order(clock: FakeClock) -> None:
    aligner = EventTimeAligner("t", 1000, 1 << 20, clock=clock)
    aligner.assign({0: 0, 1: 0})
    hold(aligner, fetch(0, 0, [1, 2, 3, 4, 5, 6]))
    assert released(aligner) == []  # partition 1 may still bring rows of that moment
    hold(aligner, fetch(1, 0, [2, 4]))
    assert released(aligner) == [(0, 1), (0, 2), (0, 3), (0, 4), (1, 2), (1, 4)]  # up to partition 1's 4
    hold(aligner, fetch(1, 2, [7, 9]))
    assert released(aligner) == [(0, 5), (0, 6)]  # up to partition 0's 6: it may still bring a 7
    assert released(aligner, {0: 6, 1: 4}) == []  # partition 0, still being read, handed out up to 6


def test_the_cut_stops_at_each_partitions_first_row_still_held(clock: FakeClock) -> None:
    aligner = EventTimeAligner("t", 1000, 1 << 20, clock=clock)
    aligner.assign({0: 10, 1: 20})
    hold(aligner, fetch(0, 10, [1, 5, 2, 8]))
    hold(aligner, fetch(1, 20, [3, 4]))
    batch, cuts = aligner.release({})
    # frontier 4: partition 0 releases 1 and stops at 5 (offset 11), although 2 comes after it
    assert batch is not None and batch.batch.column("__kafka_offset").to_pylist() == [10, 20, 21]
    assert cuts == {0: 11, 1: 22}


def test_a_caught_up_partition_holds_fresh_rows_back_only_for_the_grace(clock: FakeClock) -> None:
    aligner = EventTimeAligner("t", 1000, 1 << 20, clock=clock)
    aligner.assign({0: 0, 1: 0})
    aligner.hold(None, {}, {1: 0})  # partition 1 is empty: its end is where it starts
    hold(aligner, fetch(0, 0, [5, 6]))
    assert aligner.release({}) == (None, {0: 0, 1: 0})  # it may still bring rows of that moment...
    clock.now += 0.25  # ...but not after the grace
    batch, cuts = aligner.release({})
    assert batch is not None and batch.batch.num_rows == 2
    assert cuts == {0: 2, 1: 0}


def test_a_partition_read_up_to_its_reported_end_is_caught_up_and_one_whose_end_moves_reads_again(
        clock: FakeClock) -> None:
    ends = {0: 2, 1: 1}
    aligner = EventTimeAligner("t", 1000, 1 << 20, reported_end=ends.get, clock=clock)
    aligner.assign({0: 0, 1: 0})
    hold(aligner, fetch(1, 0, [1]))  # partition 1 at its end: caught up without an end-of-partition event
    hold(aligner, fetch(0, 0, [5, 6]))
    clock.now += 0.25
    assert released(aligner, {1: 1}) == [(1, 1), (0, 5), (0, 6)]
    ends[1] = 3  # the broker reports records past what partition 1 fetched: it holds the others back again
    hold(aligner, fetch(0, 2, [7]))
    clock.now += 0.25
    assert released(aligner, {0: 6, 1: 1}) == []
    hold(aligner, fetch(1, 1, [7, 8]))
    assert released(aligner, {0: 6, 1: 1}) == [(0, 7), (1, 7)]


def test_a_partition_with_nothing_held_holds_others_back_to_what_it_handed_out(clock: FakeClock) -> None:
    aligner = EventTimeAligner("t", 1000, 1 << 20, clock=clock)
    aligner.assign({0: 0, 1: 0})
    hold(aligner, fetch(1, 0, [3]))
    hold(aligner, fetch(0, 0, [1, 2, 3, 4]))
    assert sorted(released(aligner)) == [(0, 1), (0, 2), (0, 3), (1, 3)]  # in the order fetched
    assert released(aligner, {1: 3}) == []  # partition 1 is still being read and handed out up to 3
    clock.now += 2.5  # ...but it has been silent longer than the wait: alignment gives up on it
    assert released(aligner, {1: 3}) == [(0, 4)]


def test_a_partition_never_heard_from_is_waited_for_a_bounded_time(clock: FakeClock) -> None:
    aligner = EventTimeAligner("t", 1000, 1 << 20, clock=clock)
    aligner.assign({0: 0, 1: 0})
    hold(aligner, fetch(0, 0, [1, 2]))
    assert released(aligner) == []
    clock.now += 2.5
    assert released(aligner) == [(0, 1), (0, 2)]


def test_too_much_held_releases_what_the_partitions_with_rows_allow(clock: FakeClock) -> None:
    aligner = EventTimeAligner("t", 5, 1 << 20, clock=clock)
    aligner.assign({0: 0, 1: 0, 2: 0})
    hold(aligner, fetch(0, 0, [1, 2, 3, 4, 5, 6]))
    hold(aligner, fetch(1, 0, [2, 9]))
    assert released(aligner) == [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (0, 6), (1, 2)]


def test_rows_without_event_time_and_dead_letters_go_with_the_rows_around_them(clock: FakeClock) -> None:
    aligner = EventTimeAligner("t", 1000, 1 << 20, clock=clock)
    aligner.assign({0: 0, 1: 0})
    hold(aligner, fetch(0, 0, [1, None, 9], dead_at=[1, 4]))  # offsets: 0 row, 1 dead, 2 row, 3 row, 4 dead
    hold(aligner, fetch(1, 0, [5]))
    batch, cuts = aligner.release({})
    assert batch is not None and batch.batch.column("__kafka_offset").to_pylist() == [0, 2, 0]
    assert [letter.offset for letter in batch.dead_letters] == [1]
    assert cuts[0] == 3  # the row at 9 (offset 3) is held, and the dead letter after it


def test_a_rewound_or_revoked_partition_loses_what_was_held_of_it(clock: FakeClock) -> None:
    aligner = EventTimeAligner("t", 1000, 1 << 20, clock=clock)
    aligner.assign({0: 0, 1: 0})
    hold(aligner, fetch(0, 0, [4, 5]))
    hold(aligner, fetch(1, 0, [6, 7]))
    aligner.forget([1])
    assert aligner.held_partitions() == {0}
    aligner.assign({0: 1})  # rewound to offset 1: held rows of partition 0 go too; it is read again
    assert aligner.held_partitions() == set()
    assert aligner.release({}) == (None, {0: 1})


def test_released_rows_keep_one_schema_and_a_later_schema_waits_its_turn(clock: FakeClock) -> None:
    aligner = EventTimeAligner("t", 1000, 1 << 20, clock=clock)
    aligner.assign({0: 0})
    hold(aligner, fetch(0, 0, [1]), end=None)
    wider = fetch(0, 1, [2])
    wider = SourceBatch("source", wider.batch.append_column("extra", pa.array(["x"])), [], 10)
    hold(aligner, wider, end=2)
    clock.now += 0.25  # past the grace a caught-up partition gives the rows just fetched
    assert released(aligner) == [(0, 1)]
    assert released(aligner) == [(0, 2)]
    assert aligner.release({}) == (None, {0: 2})


def test_a_fetch_of_dead_letters_alone_without_value_columns_is_released_and_the_rows_after_it_too(
        clock: FakeClock) -> None:
    """A format that takes its columns from the first record it decodes (protobuf-confluent without
    ``message``) hands out a fetch of undecodable records alone as dead letters and metadata columns only; its
    event times are none, and releasing it leaves nothing behind that would hold the later rows' turn."""
    aligner = EventTimeAligner("t", 1000, 1 << 20, clock=clock)
    aligner.assign({0: 0, 1: 0})
    no_columns = pa.record_batch({"__kafka_partition": pa.array([], pa.int32()),
                                  "__kafka_offset": pa.array([], pa.int64())})
    letter = DeadLetter("in", 0, 0, None, b"?", "bad", "decode")
    aligner.hold(SourceBatch("source", no_columns, [letter], 0), {0: 1}, {})
    hold(aligner, fetch(0, 1, [1, 2]), end=3)
    hold(aligner, fetch(1, 0, [3]), end=1)
    letters, _ = aligner.release({})
    assert letters is not None and letters.dead_letters == [letter] and letters.batch.num_rows == 0
    rows, cuts = aligner.release({})  # the rows have other columns: released in a turn of their own
    assert rows is not None and rows.dead_letters == []
    assert rows.batch.to_pydict() == {"t": [1, 2], "__kafka_partition": [0, 0], "__kafka_offset": [1, 2]}
    assert cuts == {0: 3, 1: 0}  # partition 1's 3 waits while partition 0 may still bring older rows
