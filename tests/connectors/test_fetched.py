"""Specification of what a fetch hands the source: records as Arrow columns, events where they happened."""

from __future__ import annotations

import pyarrow as pa
from confluent_kafka import KafkaError

from connectors.fetched import Fetched, PartitionEvent, RecordColumns

EOF_ERROR = KafkaError(KafkaError._PARTITION_EOF, "end")


def columns(partitions: list[int], offsets: list[int]) -> RecordColumns:
    values = [f"v{p}-{o}".encode() for p, o in zip(partitions, offsets)]
    return RecordColumns.from_lists(values, [None] * len(values), partitions, offsets, [1] * len(values))


def fetched() -> Fetched:
    """p0@10, end of p0 at 11, p1@20, p1@21, end of p1 at 22, p0@11 (p0 written to after its end was seen)."""
    return Fetched(columns([0, 1, 1, 0], [10, 20, 21, 11]),
                   (PartitionEvent(1, 0, 11, EOF_ERROR), PartitionEvent(3, 1, 22, EOF_ERROR)))


def test_a_split_keeps_each_event_with_the_records_before_it() -> None:
    head, rest = fetched().split(2)
    assert head.records.offsets.to_pylist() == [10, 20]
    assert [(e.at, e.partition) for e in head.events] == [(1, 0)]
    assert rest.records.offsets.to_pylist() == [21, 11]
    assert [(e.at, e.partition) for e in rest.events] == [(1, 1)]


def test_an_event_right_after_the_last_record_taken_goes_with_them() -> None:
    head, rest = fetched().split(1)
    assert [e.partition for e in head.events] == [0]
    assert len(rest.records) == 3


def test_without_a_partition_drops_its_records_and_events_and_renumbers_the_others() -> None:
    kept = fetched().without({0})
    assert kept.records.partitions.to_pylist() == [1, 1]
    assert [(e.at, e.partition) for e in kept.events] == [(2, 1)]
    assert fetched().without({7}) == fetched()


def test_then_puts_the_later_fetch_after_this_one() -> None:
    first = Fetched(columns([0], [5]), (PartitionEvent(0, 2, 3, EOF_ERROR),))
    joined = first.then(fetched())
    assert joined.records.offsets.to_pylist() == [5, 10, 20, 21, 11]
    assert [(e.at, e.partition) for e in joined.events] == [(0, 2), (2, 0), (4, 1)]


def test_nothing_fetched_is_false_and_an_event_alone_is_not() -> None:
    assert not Fetched.nothing()
    assert Fetched(RecordColumns.empty(), (PartitionEvent(0, 0, 1, EOF_ERROR),))


def test_record_columns_count_value_bytes_and_next_offsets_per_partition() -> None:
    records = RecordColumns.from_lists([b"ab", None, b"cde"], [None, b"k", None], [0, 1, 0], [5, 6, 7], [1, -1, 3])
    assert records.value_lengths().tolist() == [2, 0, 3]
    assert records.take(slice(1, 3)).value_lengths().tolist() == [0, 3]
    assert records.value_bytes() == 5
    assert records.next_offsets() == {0: 8, 1: 7}
    assert records.record(1) == (1, 6, b"k", None)
    partition, offset, timestamp, key = records.metadata_arrays()
    assert timestamp.to_pylist()[1] is None  # Kafka's -1: no timestamp
    assert (partition.type, offset.type, key.to_pylist()) == (pa.int32(), pa.int64(), [None, b"k", None])
    assert records.take(pa.array([True, False, True])).offsets.to_pylist() == [5, 7]
