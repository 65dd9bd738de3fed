"""Watermarks: min over active partitions minus lateness, idle partitions ignored, never backwards; a row is late
only by its own partition's stream time; a quiet partition closes its own open windows, no further."""

from __future__ import annotations

import pyarrow as pa
import pytest

from connectors.watermarks import (
    EventTimeError,
    WatermarkTracker,
    event_times_ms,
    judge_event_time,
    max_event_time_per_partition,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: int) -> None:
        self.now += ms / 1000.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_watermark_is_none_before_any_event(clock: FakeClock) -> None:
    assert WatermarkTracker(0, 30_000, clock).current() is None


def test_watermark_is_min_over_partitions_of_their_max(clock: FakeClock) -> None:
    tracker = WatermarkTracker(0, 30_000, clock)
    tracker.observe(0, 5_000)
    tracker.observe(1, 3_000)
    tracker.observe(0, 9_000)
    assert tracker.current() == 3_000


def test_out_of_order_events_do_not_lower_a_partition_max(clock: FakeClock) -> None:
    tracker = WatermarkTracker(0, 30_000, clock)
    tracker.observe(0, 5_000)
    tracker.observe(0, 2_000)
    assert tracker.current() == 5_000


def test_allowed_lateness_holds_the_watermark_back(clock: FakeClock) -> None:
    tracker = WatermarkTracker(1_500, 30_000, clock)
    tracker.observe(0, 5_000)
    assert tracker.current() == 3_500


def test_assigned_partition_without_events_holds_back_until_idle(clock: FakeClock) -> None:
    tracker = WatermarkTracker(0, 30_000, clock)
    tracker.assign([0, 1])
    tracker.observe(0, 5_000)
    assert tracker.current() is None
    clock.advance_ms(30_000)
    tracker.observe(0, 6_000)
    assert tracker.current() == 6_000


def test_idle_partition_stops_holding_the_watermark_back(clock: FakeClock) -> None:
    tracker = WatermarkTracker(0, 10_000, clock)
    tracker.observe(0, 1_000)
    tracker.observe(1, 50_000)
    assert tracker.current() == 1_000
    clock.advance_ms(8_000)
    tracker.observe(1, 60_000)
    clock.advance_ms(2_000)
    assert tracker.current() == 60_000


def test_all_partitions_idle_follow_the_largest_event_time(clock: FakeClock) -> None:
    tracker = WatermarkTracker(100, 10_000, clock)
    tracker.observe(0, 1_000)
    tracker.observe(1, 7_000)
    clock.advance_ms(10_000)
    assert tracker.current() == 6_900


def test_watermark_never_goes_backwards_when_an_idle_partition_wakes_up(clock: FakeClock) -> None:
    tracker = WatermarkTracker(0, 10_000, clock)
    tracker.observe(0, 1_000)
    tracker.observe(1, 50_000)
    clock.advance_ms(10_000)
    tracker.observe(1, 60_000)
    assert tracker.current() == 60_000
    tracker.observe(0, 2_000)
    assert tracker.current() == 60_000


def test_a_rewind_goes_back_to_the_committed_maxima_and_emitted_watermark(clock: FakeClock) -> None:
    tracker = WatermarkTracker(0, 10_000, clock)
    tracker.observe(0, 4_000)
    tracker.observe(1, 9_000)
    assert tracker.current() == 4_000
    committed = tracker.max_event_times(), tracker.current()
    tracker.observe(0, 8_000)
    assert tracker.current() == 8_000  # an epoch that will be abandoned moved it on
    tracker.rewind(*committed)
    assert tracker.current() == 4_000
    tracker.observe(0, 3_000)
    assert tracker.current() == 4_000
    tracker.observe(0, 12_000)
    assert tracker.current() == 9_000


def test_a_partition_that_moved_away_no_longer_holds_the_watermark_back(clock: FakeClock) -> None:
    tracker = WatermarkTracker(0, 10_000, clock)
    tracker.assign([0, 1])
    tracker.observe(0, 4_000)
    assert tracker.current() is None  # partition 1 has not delivered yet
    tracker.remove([1])
    assert tracker.current() == 4_000
    assert tracker.max_event_time(1) is None


def _batch(times: list[int | None], partitions: list[int] | None = None) -> pa.RecordBatch:
    partitions = partitions or [0] * len(times)
    return pa.record_batch({
        "id": pa.array(range(len(times)), pa.int64()),
        "event_time": pa.array(times, pa.timestamp("us", tz="UTC")),
        "event_ms": pa.array(times, pa.int64()),
        "__kafka_partition": pa.array(partitions, pa.int32()),
        "__kafka_timestamp": pa.array([t + 1 if t is not None else None for t in times],
                                      pa.timestamp("ms", tz="UTC")),
    })


def test_event_times_come_from_a_timestamp_column_of_any_unit() -> None:
    batch = _batch([1_000, None])
    assert event_times_ms(batch, "event_time").to_pylist() == [1, None]


def test_event_times_come_from_an_integer_millisecond_column() -> None:
    assert event_times_ms(_batch([1_000, 2_000]), "event_ms").to_pylist() == [1_000, 2_000]


def test_event_times_default_to_the_kafka_timestamp() -> None:
    assert event_times_ms(_batch([1_000, 2_000]), None).to_pylist() == [1_001, 2_001]


def test_event_time_column_must_exist_and_be_a_time() -> None:
    batch = _batch([1_000]).append_column("name", pa.array(["x"]))
    with pytest.raises(EventTimeError, match="'missing'"):
        event_times_ms(batch, "missing")
    with pytest.raises(EventTimeError, match="'name' has type string"):
        event_times_ms(batch, "name")


def test_max_event_time_per_partition_ignores_nulls() -> None:
    batch = _batch([5, 9, None, 3, None], partitions=[0, 0, 0, 1, 2])
    assert max_event_time_per_partition(batch, "event_ms") == {0: 9, 1: 3}


def test_rows_below_their_partitions_threshold_are_late_and_rows_without_event_time_are_set_apart() -> None:
    judged = judge_event_time(_batch([10, 3, 7, 5, None]), {0: 5}, "event_ms")
    assert judged.on_time.column("id").to_pylist() == [0, 2, 3]
    assert judged.late.column("id").to_pylist() == [1]
    assert judged.untimed.column("id").to_pylist() == [4]
    assert judged.on_time.schema == judged.late.schema == judged.untimed.schema


def test_without_thresholds_only_rows_without_event_time_are_set_apart() -> None:
    judged = judge_event_time(_batch([1, None, 2]), {}, "event_ms")
    assert judged.on_time.column("id").to_pylist() == [0, 2]
    assert judged.late.num_rows == 0
    assert judged.untimed.column("id").to_pylist() == [1]


def test_a_batch_with_no_late_row_is_handed_on_as_it_is() -> None:
    batch = _batch([7, 9, 6, 5], partitions=[0, 1, 1, 0])
    judged = judge_event_time(batch, {0: 5, 1: 2}, "event_ms")
    assert judged.on_time is batch
    assert judged.late.num_rows == judged.untimed.num_rows == 0 and judged.late.schema == batch.schema


def test_per_partition_thresholds_judge_rows_the_highest_threshold_would_not_let_pass() -> None:
    """A row above its own partition's threshold stays even when another partition's is higher."""
    judged = judge_event_time(_batch([6, 4, 30, 21], partitions=[0, 0, 1, 1]), {0: 5, 1: 20}, "event_ms")
    assert judged.on_time.column("id").to_pylist() == [0, 2, 3]
    assert judged.late.column("id").to_pylist() == [1]


def test_rows_of_a_partition_without_a_threshold_are_on_time() -> None:
    judged = judge_event_time(_batch([1, 2], partitions=[3, 3]), {0: 50}, "event_ms")
    assert judged.on_time.column("id").to_pylist() == [0, 1]


def test_a_partition_is_judged_by_its_own_stream_time_even_after_a_quiet_spell(clock: FakeClock) -> None:
    """Kafka Streams' stream time per partition: a quiet partition's rows are never judged by the others."""
    tracker = WatermarkTracker(1_000, 10_000, clock)
    tracker.observe(0, 5_000)
    tracker.observe(1, 20_000)
    assert tracker.late_thresholds() == {0: 4_000, 1: 19_000}  # partition 0 is not judged by partition 1
    clock.advance_ms(11_000)
    tracker.observe(1, 30_000)  # partition 0 has been quiet for longer than the idle timeout
    assert tracker.idle_partitions() == {0}
    assert tracker.late_thresholds() == {0: 4_000, 1: 29_000}


def partition_zero_quiet(clock: FakeClock, allowed_lateness_ms: int) -> WatermarkTracker:
    """Partition 0 at 5 s goes quiet past the idle timeout (10 s) while partition 1 moves from 20 s to 30 s."""
    tracker = WatermarkTracker(allowed_lateness_ms, 10_000, clock)
    tracker.observe(0, 5_000)
    tracker.observe(1, 20_000)
    assert tracker.closing_watermarks({0: 10_000}) == {0: 5_000 - allowed_lateness_ms,
                                                       1: 20_000 - allowed_lateness_ms}  # nobody idle yet
    clock.advance_ms(11_000)
    tracker.observe(1, 30_000)
    return tracker


def test_a_quiet_partition_closes_its_open_windows_by_the_others_progress_and_no_further(clock: FakeClock) -> None:
    tracker = partition_zero_quiet(clock, 1_000)
    # partition 0 is idle: its last open window ends at 10 s, so it closes through 10 s, not 29 s
    assert tracker.closing_watermarks({0: 10_000}) == {0: 10_000, 1: 29_000}
    # with no open window it has nothing to close, so its own stream time stays its bound
    assert tracker.closing_watermarks({}) == {0: 4_000, 1: 29_000}
    # the others' watermark is the cap when it is lower than the end of the open window
    assert tracker.closing_watermarks({0: 60_000}) == {0: 29_000, 1: 29_000}


def test_a_quiet_partition_with_records_waiting_closes_nothing_early(clock: FakeClock) -> None:
    tracker = partition_zero_quiet(clock, 0)
    assert tracker.closing_watermarks({0: 10_000}, busy={0}) == {0: 5_000, 1: 30_000}
