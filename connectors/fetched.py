"""What a source's consumer fetched, as Arrow columns, and the two ways to fetch it.

- ``RecordColumns``: the records' values, keys, partitions, offsets and timestamps as Arrow arrays;
- ``PartitionEvent``: a message that is not a record (end of partition, an error) and how many records came
  before it, so the source applies it exactly where it happened (an end of partition must not move the
  position past records still waiting to be handed out);
- ``Fetched``: both, split and filtered as the source hands records out;
- fetchers (``make_fetcher``): ``ColumnFetcher`` reads through the C module (``connectors.native_io``), no
  Python object per record; ``MessageFetcher`` through confluent-kafka's ``poll`` and ``consume``, one
  ``Message`` per record. Both hand the source the same ``Fetched``, so everything after the fetch (the
  cut, rebalances, decoding, dead letters) is one code path.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, Message

from connectors.metadata import METADATA_FIELDS, maxima_by_partition
from connectors.native_io import native_io


@dataclass(frozen=True)
class RecordColumns:
    """Records' fields as Arrow arrays. ``timestamps`` are epoch ms, -1 for none (as Kafka reports a missing
    timestamp)."""

    values: pa.BinaryArray
    keys: pa.BinaryArray
    partitions: pa.Int32Array
    offsets: pa.Int64Array
    timestamps: pa.Int64Array

    @classmethod
    def from_lists(cls, values: Sequence[bytes | None], keys: Sequence[bytes | None], partitions: Sequence[int],
                   offsets: Sequence[int], timestamps: Sequence[int]) -> RecordColumns:
        return cls(pa.array(values, pa.binary()), pa.array(keys, pa.binary()), pa.array(partitions, pa.int32()),
                   pa.array(offsets, pa.int64()), pa.array(timestamps, pa.int64()))

    @classmethod
    def of(cls, records: Sequence[Message]) -> RecordColumns:
        """confluent-kafka's messages (records, not events)."""
        return cls.from_lists([m.value() for m in records], [m.key() for m in records],
                              cast(list[int], [m.partition() for m in records]),
                              cast(list[int], [m.offset() for m in records]),
                              [m.timestamp()[1] for m in records])

    @classmethod
    def empty(cls) -> RecordColumns:
        return cls.from_lists([], [], [], [], [])

    def __len__(self) -> int:
        return len(self.partitions)

    def take(self, rows: slice | pa.BooleanArray) -> RecordColumns:
        """The records in ``rows``: a slice (no copy), or a mask."""
        if isinstance(rows, slice):
            start, stop, _ = rows.indices(len(self))
            return RecordColumns(*(column.slice(start, stop - start) for column in self._columns()))
        return RecordColumns(*(column.filter(rows) for column in self._columns()))

    def concat(self, other: RecordColumns) -> RecordColumns:
        if not len(other):
            return self
        return RecordColumns(*(pa.concat_arrays([mine, theirs])
                               for mine, theirs in zip(self._columns(), other._columns(), strict=True)))

    def _columns(self) -> tuple[Any, ...]:
        return self.values, self.keys, self.partitions, self.offsets, self.timestamps

    def record(self, index: int) -> tuple[int, int, bytes | None, bytes | None]:
        """One record's partition, offset, key and value (for a dead letter)."""
        return (self.partitions[index].as_py(), self.offsets[index].as_py(), self.keys[index].as_py(),
                self.values[index].as_py())

    def value_lengths(self) -> np.ndarray[Any, np.dtype[np.int64]]:
        """Each value's length in bytes (0 for a null value), from the column's offsets."""
        offsets = self.values.buffers()[1]
        if offsets is None:  # an empty column made by Arrow
            return np.zeros(0, np.int64)
        start = self.values.offset
        bounds = np.frombuffer(memoryview(offsets), np.int32)[start:start + len(self.values) + 1]
        return np.diff(bounds).astype(np.int64)

    def value_bytes(self) -> int:
        return int(self.value_lengths().sum())

    def partition_set(self) -> set[int]:
        return set(cast(list[int], pc.unique(self.partitions).to_pylist()))

    def next_offsets(self) -> dict[int, int]:
        """Per partition, the offset after its last record here."""
        return {p: offset + 1 for p, offset in maxima_by_partition(self.partitions, self.offsets).items()}

    def metadata_arrays(self) -> list[pa.Array[Any]]:
        """``METADATA_COLUMNS`` as Arrow arrays, in that order."""
        partition, offset, timestamp, key = (f.type for f in METADATA_FIELDS)
        return [self.partitions.cast(partition), self.offsets.cast(offset),
                _null_where_negative(self.timestamps).cast(timestamp), self.keys.cast(key)]


def _null_where_negative(timestamps: pa.Int64Array) -> pa.Array[Any]:
    """Kafka reports a missing record timestamp as -1; make it null rather than 1969-12-31T23:59:59.999."""
    negative = pc.less(timestamps, pa.scalar(0, pa.int64()))
    if not pc.any(negative).as_py():
        return timestamps
    return cast("pa.Array[Any]", pc.if_else(negative, pa.scalar(None, pa.int64()), timestamps))


@dataclass(frozen=True)
class PartitionEvent:
    """A message that is not a record: ``at`` records of the same fetch came before it."""

    at: int
    partition: int
    offset: int
    error: KafkaError


@dataclass(frozen=True)
class Fetched:
    """Records and events in the order the consumer delivered them."""

    records: RecordColumns
    events: tuple[PartitionEvent, ...] = ()

    @classmethod
    def of(cls, messages: Sequence[Message]) -> Fetched:
        """confluent-kafka's messages, records and events."""
        records: list[Message] = []
        events = []
        for message in messages:
            error = message.error()
            if error is None:
                records.append(message)
            else:
                events.append(PartitionEvent(len(records), cast(int, message.partition()),
                                             cast(int, message.offset()), error))
        return cls(RecordColumns.of(records), tuple(events))

    @classmethod
    def nothing(cls) -> Fetched:
        return cls(RecordColumns.empty())

    def __bool__(self) -> bool:
        return bool(len(self.records) or self.events)

    def then(self, later: Fetched) -> Fetched:
        """These messages, then ``later``'s."""
        shift = len(self.records)
        return Fetched(self.records.concat(later.records),
                       (*self.events, *(_moved(event, event.at + shift) for event in later.events)))

    def split(self, records: int) -> tuple[Fetched, Fetched]:
        """The first ``records`` records with the events up to them, and the rest."""
        head = tuple(event for event in self.events if event.at <= records)
        rest = tuple(_moved(event, event.at - records) for event in self.events if event.at > records)
        return (Fetched(self.records.take(slice(0, records)), head),
                Fetched(self.records.take(slice(records, None)), rest))

    def without(self, partitions: set[int]) -> Fetched:
        """Everything but the records and events of ``partitions``."""
        if not partitions or not (self.partitions() & partitions):
            return self
        keep = pc.invert(pc.is_in(self.records.partitions, pa.array(sorted(partitions), pa.int32())))
        kept_before = np.concatenate([[0], np.cumsum(keep.to_numpy(zero_copy_only=False))])
        events = tuple(_moved(event, int(kept_before[event.at])) for event in self.events
                       if event.partition not in partitions)
        return Fetched(self.records.take(keep), events)

    def partitions(self) -> set[int]:
        """The partitions of the records and events here."""
        return self.records.partition_set() | {event.partition for event in self.events}


def _moved(event: PartitionEvent, at: int) -> PartitionEvent:
    return PartitionEvent(at, event.partition, event.offset, event.error)


class Fetcher(Protocol):
    """How a source gets messages from its consumer. ``fetch`` serves the consumer's callbacks (rebalances,
    errors) too; ``attach`` is called before partitions are assigned, ``detach`` before they go, ``close``
    before the consumer closes."""

    def fetch(self, timeout: float) -> Fetched: ...
    def attach(self, partitions: Sequence[int]) -> None: ...
    def detach(self, partitions: Sequence[int]) -> None: ...
    def close(self) -> None: ...


def ready_messages(consumer: Consumer, max_messages: int, timeout: float) -> list[Message]:
    """Up to ``max_messages`` messages, waiting up to ``timeout`` for the first one only.

    ``consume(n, timeout)`` waits out its whole timeout unless n messages arrive (a reader of a live topic
    would then see each record up to ``timeout`` late), so wait for one message with ``poll`` and add what
    is already fetched with a non-blocking ``consume``."""
    first = consumer.poll(timeout)
    if first is None:
        return []
    if max_messages == 1:
        return [first]
    return [first, *consumer.consume(max_messages - 1, 0)]


class MessageFetcher:
    """confluent-kafka's ``poll`` and ``consume``: one ``Message`` per record."""

    def __init__(self, consumer: Consumer, max_records: int) -> None:
        self._consumer = consumer
        self._max_records = max_records

    def fetch(self, timeout: float) -> Fetched:
        messages = ready_messages(self._consumer, self._max_records, timeout)
        return Fetched.of(messages) if messages else Fetched.nothing()

    def attach(self, partitions: Sequence[int]) -> None:
        pass  # the consumer queue gets every partition's messages

    def detach(self, partitions: Sequence[int]) -> None:
        pass

    def close(self) -> None:
        pass


ASSIGNMENT_WAIT_SLICE_S = 0.01
"""How long one ``poll`` waits for an assignment while no partition is attached. The rebalance callback
runs inside ``poll``, which then goes on waiting for a message on the consumer queue; but an attached
partition's records go to the reader's queue, so one long ``poll`` would wait out its whole timeout with
records ready (0.1 s of every start-up and rebalance). Short polls see the attachment within a slice."""


class ColumnFetcher:
    """Reads attached partitions through the C module into Arrow buffers: their messages go to the reader's
    own queue, while the consumer's ``consume`` (called first on every fetch, without waiting) keeps serving
    rebalance callbacks and consumer-wide errors.

    librdkafka clears a partition's forwarding whenever its fetch stops (unassign, a new assignment), and a
    fetch that starts unforwarded delivers to the consumer queue. So every fetch forwards the attached
    partitions again first, then takes what reached the consumer queue, and reads the reader's queue only
    when the consumer queue had nothing: records there came before anything forwarded since, so a partition's
    records are handed out in offset order either way."""

    def __init__(self, consumer: Consumer, topic: str, max_records: int, module: ModuleType) -> None:
        self._consumer = consumer
        self._topic = topic
        self._max_records = max_records
        self._reader = module.ColumnReader(consumer)
        self._attached: set[int] = set()

    def fetch(self, timeout: float) -> Fetched:
        deadline = time.monotonic() + timeout
        while not self._attached:  # nothing to read yet: wait for an assignment on the consumer queue
            remaining = deadline - time.monotonic()
            message = self._consumer.poll(max(0.0, min(ASSIGNMENT_WAIT_SLICE_S, remaining)))
            if message is not None or remaining <= ASSIGNMENT_WAIT_SLICE_S:
                return _served(message)
        self._reader.attach(self._topic, sorted(self._attached))
        served = self._consumer.consume(self._max_records, 0)
        if served or not self._attached:  # (a rebalance callback inside consume may detach everything)
            return Fetched.of(served)
        return self._read(max(0, int((deadline - time.monotonic()) * 1000)))

    def _read(self, wait_ms: int) -> Fetched:
        count, values, keys, partitions, offsets, stamps, events = self._reader.read(self._max_records, wait_ms)
        records = RecordColumns(
            cast(pa.BinaryArray, _binary(count, values)), cast(pa.BinaryArray, _binary(count, keys)),
            cast(pa.Int32Array, pa.Array.from_buffers(pa.int32(), count, [None, pa.py_buffer(partitions)])),
            cast(pa.Int64Array, pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(offsets)])),
            cast(pa.Int64Array, pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(stamps)])))
        return Fetched(records, tuple(PartitionEvent(at, partition, offset, _kafka_error(code, text))
                                      for at, partition, offset, code, text in events))

    def attach(self, partitions: Sequence[int]) -> None:
        self._reader.attach(self._topic, list(partitions))
        self._attached.update(partitions)

    def detach(self, partitions: Sequence[int]) -> None:
        gone = self._attached.intersection(partitions)
        if gone:
            self._reader.detach(self._topic, sorted(gone))
            self._attached -= gone

    def close(self) -> None:
        """Detach everything and drop what the reader still holds: the consumer's close waits for the
        records of its partitions that sit in any queue."""
        self.detach(sorted(self._attached))
        while self._read(0):
            pass
        self._reader.close()


def _served(message: Message | None) -> Fetched:
    return Fetched.of([message]) if message is not None else Fetched.nothing()


def _binary(count: int, buffers: tuple[bytes, bytes, bytes | None]) -> pa.Array[Any]:
    data, offsets, validity = buffers
    bitmap = pa.py_buffer(validity) if validity is not None else None
    return pa.Array.from_buffers(pa.binary(), count, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)])


def _kafka_error(code: int, text: str) -> KafkaError:
    return KafkaError(code, text, fatal=code == KafkaError._FATAL)


def make_fetcher(consumer: Consumer, topic: str, max_records: int) -> Fetcher:
    """The C reader when it is built and not switched off (``connectors.native_io``), else confluent-kafka's
    per-record calls."""
    module = native_io()
    if module is None:
        return MessageFetcher(consumer, max_records)
    return ColumnFetcher(consumer, topic, max_records, module)
