"""Event-time watermarks per source: how far event time has surely progressed, and which rows came too late.

Per partition (what a running connector uses): a row is late when its event time is below its partition's
largest event time minus the allowed lateness (``late_thresholds``), and windows of a partition close by the
same value, like Kafka Streams' stream time per task. Partitions move between instances with their largest
event time (committed in the offset metadata), so a partition taken over with a backlog is judged by its own
history.

Across partitions (``current()``): the minimum over the *active* partitions of the largest event time seen
on each, minus the allowed lateness. A partition that delivered nothing for ``idle_timeout_ms`` stops
holding it back; when every partition is idle it follows the largest event time seen anywhere. It never
goes backwards. A quiet partition's own watermark follows it, so one quiet partition's windows still
close when the others move on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc

from connectors.metadata import PARTITION, TIMESTAMP, maxima_by_partition
from schemas.event_time import EventTimeError, event_time_ms, is_event_time_type

__all__ = ["EventTimeError", "WatermarkTracker", "event_times_ms", "filter_late_rows", "max_event_time_per_partition",
           "observe_batch"]


class WatermarkTracker:
    def __init__(self, allowed_lateness_ms: int, idle_timeout_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.allowed_lateness_ms = allowed_lateness_ms
        self.idle_timeout_s = idle_timeout_ms / 1000.0
        self._clock = clock
        self._max_event_time: dict[int, int] = {}
        self._last_seen: dict[int, float] = {}
        self._emitted: int | None = None

    def assign(self, partitions: Iterable[int]) -> None:
        """Partitions that hold the watermark back until they deliver events or turn idle."""
        now = self._clock()
        for partition in partitions:
            self._last_seen.setdefault(partition, now)

    def remove(self, partitions: Iterable[int]) -> None:
        """Partitions that moved to another instance: they no longer hold the watermark back. The emitted
        watermark stays (it never goes backwards)."""
        for partition in partitions:
            self._last_seen.pop(partition, None)
            self._max_event_time.pop(partition, None)

    def max_event_time(self, partition: int) -> int | None:
        """The largest event time seen on ``partition``: committed with its offset, so it moves with it."""
        return self._max_event_time.get(partition)

    def observe(self, partition: int, max_event_time_ms: int) -> None:
        now = self._clock()
        self._last_seen[partition] = now
        previous = self._max_event_time.get(partition)
        if previous is None or max_event_time_ms > previous:
            self._max_event_time[partition] = max_event_time_ms

    def current(self) -> int | None:
        """The watermark in epoch milliseconds, or None while no partition allows one yet."""
        candidate = self._candidate(self._clock())
        if candidate is not None and (self._emitted is None or candidate > self._emitted):
            self._emitted = candidate
        return self._emitted

    def _candidate(self, now: float) -> int | None:
        active = [p for p, seen in self._last_seen.items() if now - seen < self.idle_timeout_s]
        if active:
            if any(p not in self._max_event_time for p in active):
                return None
            return min(self._max_event_time[p] for p in active) - self.allowed_lateness_ms
        if self._max_event_time:
            return max(self._max_event_time.values()) - self.allowed_lateness_ms
        return None

    def late_thresholds(self) -> dict[int, int]:
        """Per partition, the event time below which its rows are late: its own largest event time minus
        the allowed lateness (as Kafka Streams judges a record by its task's stream time). Per partition, not
        the instance's watermark, because partitions move between instances: a partition taken over with a
        backlog is judged by its own history (committed with its offsets), not by the partitions its new
        owner had already read further. Window state is per partition too, so a row on time for its
        partition never lands in a window already emitted for it. A partition quiet for ``idle_timeout_ms``
        follows ``current()`` instead (when that is further), so its windows still close; old rows it
        delivers when it wakes up are late."""
        thresholds = {p: t - self.allowed_lateness_ms for p, t in self._max_event_time.items()}
        overall = self.current()
        if overall is None:
            return thresholds
        now = self._clock()
        for partition, seen in self._last_seen.items():  # a quiet partition follows the others, as before
            if now - seen >= self.idle_timeout_s:
                thresholds[partition] = max(thresholds.get(partition, overall), overall)
        return thresholds

    def max_event_times(self) -> dict[int, int]:
        return dict(self._max_event_time)

    def rewind(self, max_event_times: Mapping[int, int], emitted: int | None) -> None:
        """Back to what was committed (an epoch was abandoned): per-partition maxima and the emitted
        watermark, so replayed rows are judged as they were the first time. Rewound partitions count as
        just seen (idleness is wall-clock time of this process)."""
        now = self._clock()
        self._max_event_time = dict(max_event_times)
        for partition in self._last_seen:
            self._last_seen[partition] = now
        self._emitted = emitted


def event_times_ms(batch: pa.RecordBatch, column: str | None) -> pa.Array[pa.Int64Scalar]:
    """Event time of every row as int64 epoch milliseconds: from ``column`` (a timestamp of any unit, or an
    integer already in milliseconds) or, when ``column`` is None, from the Kafka record timestamp."""
    name = column or TIMESTAMP
    index = batch.schema.get_field_index(name)
    if index < 0:
        raise EventTimeError(f"event-time column {name!r} is not in the batch (columns: {batch.schema.names})")
    values = batch.column(index)
    if not is_event_time_type(values.type):
        raise EventTimeError(f"event-time column {name!r} has type {values.type}; expected a timestamp "
                             "or integer milliseconds")
    return event_time_ms(values)


def max_event_time_per_partition(batch: pa.RecordBatch, column: str | None) -> dict[int, int]:
    """Per Kafka partition, the largest event time in ``batch`` (rows without an event time ignored)."""
    return maxima_by_partition(batch.column(PARTITION), event_times_ms(batch, column))


def filter_late_rows(batch: pa.RecordBatch, watermark: int | Mapping[int, int] | None,
                     column: str | None) -> tuple[pa.RecordBatch, pa.RecordBatch]:
    """Split ``batch`` into (on time, late): a row is late when its event time is below ``watermark``, or,
    given per-partition thresholds (``WatermarkTracker.late_thresholds``), below its partition's.

    Rows without an event time are on time (they cannot be judged), so every row lands in exactly one part;
    so are rows of partitions without a threshold. Compare against thresholds from *before* this batch.
    """
    if watermark is None or (isinstance(watermark, Mapping) and not watermark):
        return batch, batch.slice(0, 0)
    times = event_times_ms(batch, column)
    if _none_below(times, max(watermark.values()) if isinstance(watermark, Mapping) else watermark):
        return batch, batch.slice(0, 0)  # the common case, without a per-row threshold or a copy of the batch
    threshold: pa.Array[Any] | pa.Scalar[Any]
    if isinstance(watermark, Mapping):
        partitions = pa.array(list(watermark), pa.int32())
        positions = pc.index_in(batch.column(PARTITION).cast(pa.int32()), value_set=partitions)
        threshold = pc.take(pa.array(list(watermark.values()), pa.int64()), positions)
    else:
        threshold = pa.scalar(watermark, pa.int64())
    behind = pc.less(times, threshold)
    late = cast(pa.BooleanArray, pc.fill_null(behind, pa.scalar(False)))
    return batch.filter(pc.invert(late)), batch.filter(late)


def _none_below(times: pa.Array[pa.Int64Scalar], threshold: int) -> bool:
    """Whether no event time is below ``threshold`` (rows without one are never late)."""
    earliest = pc.min(times).as_py()
    return earliest is None or earliest >= threshold


def observe_batch(tracker: WatermarkTracker, batch: pa.RecordBatch, column: str | None) -> None:
    """Advance ``tracker`` with the largest event time of each partition in ``batch``."""
    if batch.num_rows:
        for partition, event_time in max_event_time_per_partition(batch, column).items():
            tracker.observe(partition, event_time)
