"""Event-time watermarks per source: how far event time has surely progressed, and which rows came too late.

Event time judges only what holds event-time state (windows): a connector without one tracks watermarks
for its metrics and status and judges nothing (the engine decides; see ``engine.checkpoint.pipeline``).

Per partition, like Kafka Streams' stream time per task: a partition's *stream time* is the largest event
time it has delivered. A row is late when its event time is below its own partition's stream time minus the
allowed lateness (``late_thresholds``), never by another partition's progress: partitions move between
instances with their stream time (committed in the offset metadata), so a partition taken over with a
backlog, or one that wakes after a quiet spell, is judged by its own history alone.

Windows close by the same per-partition value (``closing_watermarks``), with one exception that exists so
a quiet partition's results still come out: a partition that delivered nothing for ``idle_timeout_ms`` and
has nothing waiting follows the watermark across partitions (``current()``), but only as far as the end of
its own last open window. So its open windows are emitted while it is quiet, and a row it delivers later is
late only if it belongs to one of the windows it already had: never because other partitions moved on.

Across partitions (``current()``): the minimum over the *active* partitions of their stream time, minus the
allowed lateness. A partition that delivered nothing for ``idle_timeout_ms`` stops holding it back; when
every partition is idle it follows the largest event time seen anywhere. It never goes backwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc

from connectors.metadata import PARTITION, TIMESTAMP, maxima_by_partition
from schemas.event_time import EventTimeError, event_time_ms, is_event_time_type

__all__ = ["EventTimeError", "EventTimeJudgement", "WatermarkTracker", "event_times_ms", "judge_event_time",
           "max_event_time_per_partition", "observe_batch"]


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
        """Per partition, the event time below which its rows are late: its own stream time minus the
        allowed lateness (Kafka Streams judges a record by its task's stream time). Never another
        partition's: not the instance's watermark (a partition taken over with a backlog is judged by its
        own history, committed with its offsets), and not while the partition was quiet (its rows written
        after it woke up are judged by what it delivered itself)."""
        return {p: t - self.allowed_lateness_ms for p, t in self._max_event_time.items()}

    def idle_partitions(self) -> set[int]:
        """Partitions that delivered nothing for ``idle_timeout_ms``."""
        now = self._clock()
        return {p for p, seen in self._last_seen.items() if now - seen >= self.idle_timeout_s}

    def closing_watermarks(self, open_until: Mapping[int, int], busy: Collection[int] = ()) -> dict[int, int]:
        """Per partition, how far its windows may close: its late threshold, except that an idle partition
        (quiet for ``idle_timeout_ms`` and not in ``busy``, the partitions with records waiting to be read)
        follows ``current()`` up to ``open_until[partition]``, the end of its last open window. Capped so, a
        quiet partition's open windows are emitted, yet nothing it delivers later is judged by how far the
        other partitions went: only a row that belongs to a window it already had can be late."""
        closing = self.late_thresholds()
        idle = self.idle_partitions() - set(busy)
        if not idle:
            return closing
        overall = self.current()
        if overall is None:
            return closing
        for partition in idle:
            end = open_until.get(partition)
            if end is not None:
                followed = min(overall, end)
                closing[partition] = max(closing.get(partition, followed), followed)
        return closing

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


@dataclass(frozen=True)
class EventTimeJudgement:
    """A batch split by event time: every row in exactly one part."""

    on_time: pa.RecordBatch
    late: pa.RecordBatch
    """Rows below their partition's threshold."""
    untimed: pa.RecordBatch
    """Rows without an event time: nothing can place them in a window."""


def judge_event_time(batch: pa.RecordBatch, thresholds: Mapping[int, int], column: str | None) -> EventTimeJudgement:
    """Split ``batch`` by ``thresholds`` (per partition, from ``WatermarkTracker.late_thresholds`` as they
    were *before* this batch): a row is late when its event time is below its partition's threshold; rows of
    partitions without one are on time; rows without an event time are set apart."""
    times = event_times_ms(batch, column)
    empty = batch.slice(0, 0)
    earliest = pc.min(times).as_py()
    if not times.null_count and (not thresholds or earliest is None or earliest >= max(thresholds.values())):
        return EventTimeJudgement(batch, empty, empty)  # the common case, without a per-row threshold or a copy
    untimed = pc.is_null(times)
    if thresholds:
        partitions = pa.array(list(thresholds), pa.int32())
        positions = pc.index_in(batch.column(PARTITION).cast(pa.int32()), value_set=partitions)
        threshold = pc.take(pa.array(list(thresholds.values()), pa.int64()), positions)
        late = cast(pa.BooleanArray, pc.fill_null(pc.less(times, threshold), pa.scalar(False)))
    else:
        late = pa.array([False] * batch.num_rows, pa.bool_())
    on_time = pc.invert(pc.or_(late, untimed))
    return EventTimeJudgement(batch.filter(on_time), batch.filter(late), batch.filter(untimed))


def observe_batch(tracker: WatermarkTracker, batch: pa.RecordBatch, column: str | None) -> None:
    """Advance ``tracker`` with the largest event time of each partition in ``batch``."""
    if batch.num_rows:
        for partition, event_time in max_event_time_per_partition(batch, column).items():
            tracker.observe(partition, event_time)
