"""Reading a source's partitions in event-time order, so a backlog gives the results a live run gives.

Why: librdkafka fetches a backlog partition by partition (a fetch response holds up to a MiB of each), so a
source reading six partitions hands out long runs of one partition, then of the next. Where the rows of many
partitions meet, as on a repartition topic feeding a window, one partition's run can carry the stream time
minutes ahead, and the next partition's rows of the same moment arrive late. A live run interleaves the
partitions by time as the records are written. Kafka Streams synchronises a task's partitions by timestamp
(KIP-353, ``max.task.idle.ms``); Flink aligns watermarks across splits. ``EventTimeAligner`` does the same
for one source: it holds what the consumer fetched, decoded, and releases rows up to a *frontier*, the
event time every partition that may still deliver older rows has reached.

The frontier is the minimum over the source's partitions that are not caught up (a partition is caught up
when its consumer reported the end of the partition and nothing was fetched after it):

- a partition with rows held: the largest event time of its held rows (its next rows come after them);
- a partition with nothing held: the largest event time it handed out before, while it was heard from (rows
  fetched, or assigned) less than ``wait_s`` ago; a partition never heard from holds everything back for
  that long. Past ``wait_s`` it no longer holds others back (it may be stuck; alignment gives up on it, and
  says so).

Rows of every partition at or before the frontier are released, each partition's in offset order: a
partition's rows are released up to its first held row past the frontier, so the cut (``cuts``) stays
exact: per partition, the offset of its first row still held, or where its fetching has got when nothing
of it is held. Held rows are after the cut, so a checkpoint never covers them and a restart reads them again.
Rows without an event time are never held back by it. Decode failures (dead letters) are released with the
rows around them.

The bound (what "aligned" means): rows are released in frontier order, so a row released after another is
older than it only when its own partition is out of order (by at most that partition's disorder), or when
the alignment gave up: a partition not heard from for ``wait_s``, or more than ``max_rows`` rows or
``max_bytes`` held (a partition that fetches far slower than the others), when only the partitions with rows
held count. Across instances of a group nothing aligns: each instance reads its own partitions.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc

from connectors.batch import SourceBatch
from connectors.metadata import OFFSET, PARTITION, maxima_by_partition
from connectors.watermarks import event_times_ms

log = logging.getLogger(__name__)

ALIGNMENT_WAIT_S = 2.0
"""How long a partition with nothing held may hold the others back since it was last heard from."""
ALIGNMENT_GRACE_S = 0.2
"""How long freshly fetched rows wait for caught-up partitions, which may still bring rows of the same moment:
records a producer writes together reach the broker's partitions in separate batches (its ``linger.ms``)
and the consumer's fetches, milliseconds apart (Kafka Streams' ``max.task.idle.ms``). Windows emit when
their end passes, so a fifth of a second on the rows of a windowed connector costs little."""


@dataclass(frozen=True)
class _Chunk:
    """One fetch's rows still held, with what releases ask of them every time, computed once."""

    decoded: SourceBatch
    times: pa.Array[Any]
    fetched_at: float
    latest: dict[int, int]
    """Per partition, the largest event time of its rows here."""
    first: dict[int, int]
    """Per partition, the offset of its first row or dead letter here."""

    @classmethod
    def of(cls, decoded: SourceBatch, times: pa.Array[Any], fetched_at: float) -> _Chunk:
        partitions, offsets = decoded.batch.column(PARTITION), decoded.batch.column(OFFSET)
        first = {partition: -negated for partition, negated in maxima_by_partition(partitions,
                                                                                   pc.negate(offsets)).items()}
        for letter in decoded.dead_letters:
            first[letter.partition] = min(first.get(letter.partition, letter.offset), letter.offset)
        return cls(decoded, times, fetched_at, maxima_by_partition(partitions, times), first)

    @property
    def partitions(self) -> pa.Array[Any]:
        return self.decoded.batch.column(PARTITION)

    @property
    def offsets(self) -> pa.Array[Any]:
        return self.decoded.batch.column(OFFSET)


class EventTimeAligner:
    """Holds a source's fetched rows and releases them in event-time order across its partitions (see the
    module docstring). Not thread-safe: the source's poll loop owns it."""

    def __init__(self, column: str | None, max_rows: int, max_bytes: int, *,
                 reported_end: Callable[[int], int | None] = lambda partition: None,
                 wait_s: float = ALIGNMENT_WAIT_S, grace_s: float = ALIGNMENT_GRACE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``reported_end``: a partition's end as the broker last reported it (its high watermark, or None
        while unknown); asked without a request."""
        self._column = column
        self._reported_end = reported_end
        self._grace_s = grace_s
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._wait_s = wait_s
        self._clock = clock
        self._chunks: list[_Chunk] = []
        self._fetched_to: dict[int, int] = {}
        """Per partition read, the offset after what was fetched of it (records, or the end reported)."""
        self._caught_up: set[int] = set()
        self._heard_at: dict[int, float] = {}
        self._given_up: set[int] = set()

    # -- partitions come, go and rewind ------------------------------------------------------------------

    def assign(self, starts: Mapping[int, int]) -> None:
        """Partitions read from these offsets on (new ones, or rewound ones: what was held of them goes)."""
        self.forget(starts)
        now = self._clock()
        for partition, offset in starts.items():
            self._fetched_to[partition] = offset
            self._heard_at[partition] = now

    def forget(self, partitions: Iterable[int]) -> None:
        """Partitions no longer read (or about to be read again): drop what is held of them."""
        gone = set(partitions)
        if not gone:
            return
        for partition in gone:
            self._fetched_to.pop(partition, None)
            self._heard_at.pop(partition, None)
            self._caught_up.discard(partition)
            self._given_up.discard(partition)
        drop = pa.array(sorted(gone), pa.int32())
        chunks = []
        for chunk in self._chunks:
            keep = pc.invert(pc.is_in(chunk.partitions.cast(pa.int32()), value_set=drop))
            letters = [letter.partition not in gone for letter in chunk.decoded.dead_letters]
            rest = _filtered(chunk.decoded, keep, letters)
            if rest.batch.num_rows or rest.dead_letters:
                chunks.append(_Chunk.of(rest, chunk.times.filter(keep), chunk.fetched_at))
        self._chunks = chunks

    def held_partitions(self) -> set[int]:
        """Partitions with rows or dead letters held."""
        return {partition for chunk in self._chunks for partition in chunk.first}

    # -- fetches in, rows out ------------------------------------------------------------------------------

    def hold(self, decoded: SourceBatch | None, next_offsets: Mapping[int, int], ends: Mapping[int, int]) -> None:
        """One fetch: its decoded records (None when it had none), per partition the offset after its last
        record, and the ends of partitions the consumer reported reaching (after those records). A partition
        read up to its reported end is caught up at once: librdkafka sends the end-of-partition event only
        with a later, empty fetch response, up to ``fetch.wait.max.ms`` after the last records."""
        now = self._clock()
        for partition, offset in next_offsets.items():
            self._fetched_to[partition] = max(self._fetched_to.get(partition, offset), offset)
            self._heard_at[partition] = now
            self._caught_up.discard(partition)
            self._given_up.discard(partition)
            if self._at_reported_end(partition):
                self._caught_up.add(partition)
        for partition, end in ends.items():
            reached = max(self._fetched_to.get(partition, end), end)
            self._fetched_to[partition] = reached
            if end >= reached:
                self._caught_up.add(partition)
        if decoded is not None and (decoded.batch.num_rows or decoded.dead_letters):
            self._chunks.append(_Chunk.of(decoded, self._event_times(decoded.batch), now))

    def _event_times(self, batch: pa.RecordBatch) -> pa.Array[Any]:
        """The event times of ``batch``'s rows. A fetch of dead letters alone has no rows to time and may lack
        the value columns: a format that takes its columns from the first record it decodes (protobuf-confluent
        without ``message``, avro-confluent without a reader schema) has none before that record."""
        if not batch.num_rows:
            return pa.array([], pa.int64())
        return event_times_ms(batch, self._column)

    def release(self, handed_out: Mapping[int, int]) -> tuple[SourceBatch | None, dict[int, int]]:
        """The rows (and dead letters) at or before the frontier, and every partition's cut after them.
        ``handed_out``: per partition, the largest event time it handed out before (its stream time)."""
        if not self._chunks:
            return None, dict(self._fetched_to)
        frontier = self._frontier(handed_out)
        first_held = None if frontier is None else self._first_held_after(frontier)
        released: list[SourceBatch] = []
        kept: list[_Chunk] = []
        for index, chunk in enumerate(self._chunks):
            if released and released[0].batch.schema != chunk.decoded.batch.schema:
                kept += self._chunks[index:]  # rows released together share one schema; the rest wait their turn
                break
            out, rest = _split(chunk, first_held)
            released.append(out)
            if rest is not None:
                kept.append(rest)
        self._chunks = kept
        return _joined(released), self._cuts()

    def _frontier(self, handed_out: Mapping[int, int]) -> int | None:
        """The event time every partition that may still deliver older rows has reached (None: no such
        partition, release everything)."""
        held = self._held_maxima()
        over = (sum(chunk.decoded.batch.num_rows for chunk in self._chunks) > self._max_rows
                or sum(chunk.decoded.value_bytes for chunk in self._chunks) > self._max_bytes)
        now = self._clock()
        fresh = not over and any(now - chunk.fetched_at < self._grace_s for chunk in self._chunks)
        bounds: list[int] = []
        for partition in self._fetched_to:
            if partition in self._caught_up and not self._reading_again(partition, now):
                if fresh:  # it may still bring rows of the moment just fetched from the others
                    bounds.append(held.get(partition, handed_out.get(partition, -(2**63))))
            elif partition in held:
                bounds.append(held[partition])
            elif not over and now - self._heard_at.get(partition, now) < self._wait_s:
                bounds.append(handed_out.get(partition, -(2**63)))
            elif partition not in self._given_up:
                self._given_up.add(partition)
                log.warning("event-time alignment no longer waits for a partition", extra={
                    "partition": partition, "why": "too much held" if over else f"silent for {self._wait_s}s",
                    "held_rows": sum(chunk.decoded.batch.num_rows for chunk in self._chunks)})
        return min(bounds) if bounds else None

    def _at_reported_end(self, partition: int) -> bool:
        end = self._reported_end(partition)
        return end is not None and end <= self._fetched_to[partition]

    def _reading_again(self, partition: int, now: float) -> bool:
        """A caught-up partition whose reported end moved past what was fetched: records arrived for it, so
        it holds the others back again (and counts as heard from now)."""
        end = self._reported_end(partition)
        if end is None or end <= self._fetched_to[partition]:
            return False
        self._caught_up.discard(partition)
        self._heard_at[partition] = now
        self._given_up.discard(partition)
        return True

    def _held_maxima(self) -> dict[int, int]:
        maxima: dict[int, int] = {}
        for chunk in self._chunks:
            for partition, value in chunk.latest.items():
                maxima[partition] = max(maxima.get(partition, value), value)
        return maxima

    def _first_held_after(self, frontier: int) -> dict[int, int]:
        """Per partition, the offset of its first held row past ``frontier``: it and what follows stay."""
        firsts: dict[int, int] = {}
        bound = pa.scalar(frontier, pa.int64())
        for chunk in self._chunks:
            past = cast(pa.BooleanArray, pc.fill_null(pc.greater(chunk.times, bound), pa.scalar(False)))
            for partition, negated in maxima_by_partition(chunk.partitions.filter(past),
                                                          pc.negate(chunk.offsets.filter(past))).items():
                firsts[partition] = min(firsts.get(partition, -negated), -negated)
        return firsts

    def _cuts(self) -> dict[int, int]:
        """Per partition, the offset of its first row or dead letter still held, else where fetching got."""
        cuts = dict(self._fetched_to)
        held: dict[int, int] = {}
        for chunk in self._chunks:
            for partition, offset in chunk.first.items():
                held[partition] = min(held.get(partition, offset), offset)
        for partition, offset in held.items():
            if partition in cuts:
                cuts[partition] = offset
        return cuts


def _split(chunk: _Chunk, first_held: Mapping[int, int] | None) -> tuple[SourceBatch, _Chunk | None]:
    """The chunk's part before each partition's ``first_held`` offset, and the rest (None when empty)."""
    if first_held is None or not first_held:
        return chunk.decoded, None
    partitions = pa.array(list(first_held), pa.int32())
    limits = pc.take(pa.array(list(first_held.values()), pa.int64()),
                     pc.index_in(chunk.partitions.cast(pa.int32()), value_set=partitions))
    before = cast(pa.BooleanArray, pc.fill_null(pc.less(chunk.offsets, limits), pa.scalar(True)))
    letters_before = [letter.offset < first_held.get(letter.partition, letter.offset + 1)
                      for letter in chunk.decoded.dead_letters]
    if pc.all(before, min_count=0).as_py() and all(letters_before):  # min_count=0: a chunk of no rows is all before
        return chunk.decoded, None
    out = _filtered(chunk.decoded, before, letters_before)
    after = pc.invert(before)
    rest = _filtered(chunk.decoded, after, [not kept for kept in letters_before])
    return out, _Chunk.of(rest, chunk.times.filter(after), chunk.fetched_at)


def _filtered(decoded: SourceBatch, rows: pa.Array[Any], letters: list[bool]) -> SourceBatch:
    """The rows of ``decoded`` where ``rows`` is true and its dead letters where ``letters`` is, with their
    share of its value bytes."""
    batch = decoded.batch.filter(rows)
    total = decoded.batch.num_rows
    share = decoded.value_bytes * batch.num_rows // total if total else 0
    return SourceBatch(decoded.source, batch,
                       [letter for letter, keep in zip(decoded.dead_letters, letters, strict=True) if keep], share)


def _joined(parts: list[SourceBatch]) -> SourceBatch | None:
    """The released parts as one batch (they share a schema), or None when nothing was released."""
    parts = [part for part in parts if part.batch.num_rows or part.dead_letters]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    rows = pa.Table.from_batches([part.batch for part in parts]).combine_chunks().to_batches()
    batch = rows[0] if rows else parts[0].batch.slice(0, 0)
    return SourceBatch(parts[0].source, batch, [letter for part in parts for letter in part.dead_letters],
                       sum(part.value_bytes for part in parts))
