"""The C module against the real broker: it reads and produces exactly what confluent-kafka's calls do."""

from __future__ import annotations

import time
import uuid
from types import ModuleType
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from connectors.admin import create_topic
from connectors.fetched import ColumnFetcher, Fetched, Fetcher, MessageFetcher
from connectors.native_io import SWITCH, native_io
from sinks.produce import produce_column

Row = tuple[int, int, bytes | None, bytes | None, int]  # partition, offset, key, value, timestamp


@pytest.fixture
def native() -> ModuleType:
    module = native_io()
    if module is None:
        pytest.skip("the C module (connectors/_native_io.c) was not built")
    return module


def consumer_on(bootstrap: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": f"native-io-{uuid.uuid4().hex}",
                     "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": "read_committed"})


def read_all(fetcher: Fetcher, consumer: Consumer, topic: str,
             partitions: int) -> tuple[list[Row], set[tuple[int, int]]]:
    """Every record and end-of-partition event, read from the beginning until each partition's end."""
    fetcher.attach(range(partitions))
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    rows: list[Row] = []
    ends: set[tuple[int, int]] = set()
    deadline = time.monotonic() + 30
    while len({p for p, _ in ends}) < partitions and time.monotonic() < deadline:
        fetched: Fetched = fetcher.fetch(0.5)
        records = fetched.records
        rows += [(*records.record(i), records.timestamps[i].as_py()) for i in range(len(records))]
        ends |= {(e.partition, e.offset) for e in fetched.events if e.error.code() == KafkaError._PARTITION_EOF}
    fetcher.close()
    consumer.close()
    return rows, ends


def test_the_c_reader_hands_out_what_confluent_kafka_does(kafka_bootstrap: str, unique_topic: str,
                                                          native: ModuleType) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for n in range(60):
        key = None if n % 4 == 0 else f"k{n}".encode()
        value = None if n % 7 == 0 else b"" if n % 11 == 0 else f"value {n}".encode() * (n % 5 + 1)
        producer.produce(unique_topic, value, key, partition=n % 2, timestamp=1_700_000_000_000 + n)
    assert producer.flush(30) == 0

    per_record = consumer_on(kafka_bootstrap)
    expected = read_all(MessageFetcher(per_record, 1000), per_record, unique_topic, 2)
    columns = consumer_on(kafka_bootstrap)
    got = read_all(ColumnFetcher(columns, unique_topic, 7, native), columns, unique_topic, 2)

    assert len(expected[0]) == 60 and expected[1] == {(0, 30), (1, 30)}
    assert sorted(got[0]) == sorted(expected[0])
    assert got[1] == expected[1]


def test_rows_produced_from_arrow_columns_arrive_with_their_keys_and_tombstones(
        kafka_bootstrap: str, unique_topic: str, native: ModuleType) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=2)
    values = pa.array([b"skipped", b"a", None, b"", b"d" * 5000, b"e"], pa.binary()).slice(1)  # offset 1
    keys = pa.array([b"x", b"ka", b"kb", None, b"kd", b""], pa.binary()).slice(1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{unique_topic}",
                         "queue.buffering.max.messages": 2})  # a full queue on the way
    producer.init_transactions(30)
    producer.begin_transaction()
    produce_column(native, producer, unique_topic, values, keys)
    producer.commit_transaction(30)

    consumer = consumer_on(kafka_bootstrap)
    rows, _ = read_all(MessageFetcher(consumer, 100), consumer, unique_topic, 2)
    assert sorted(((key, value) for _, _, key, value, _ in rows), key=_sort_key) == sorted(
        zip(keys.to_pylist(), values.to_pylist()), key=_sort_key)


def _sort_key(pair: tuple[Any, Any]) -> tuple[bool, bytes, bool, bytes]:
    key, value = pair
    return key is None, key or b"", value is None, value or b""


def test_a_record_librdkafka_refuses_raises_instead_of_being_dropped(kafka_bootstrap: str, unique_topic: str,
                                                                     native: ModuleType) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "message.max.bytes": 10_000})
    with pytest.raises(KafkaException) as raised:
        produce_column(native, producer, unique_topic, pa.array([b"ok", b"x" * 20_000], pa.binary()))
    assert raised.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert producer.flush(30) == 0  # the first row was produced


def test_the_switch_turns_the_c_module_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SWITCH, "0")
    native_io.cache_clear()
    try:
        assert native_io() is None
    finally:
        native_io.cache_clear()


def test_the_fetch_that_serves_the_assignment_hands_out_its_records(kafka_bootstrap: str, unique_topic: str,
                                                                    native: ModuleType) -> None:
    """The rebalance callback runs inside the fetch's ``poll`` and attaches the partitions, whose records
    then reach the reader's queue, not the consumer's: a ``poll`` that went on waiting would return nothing
    after its whole timeout (0.1 s of every start and rebalance, before the first record)."""
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for n in range(5):
        producer.produce(unique_topic, f"value {n}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"native-io-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    fetcher = ColumnFetcher(consumer, unique_topic, 100, native)

    def attach(_: Consumer, partitions: list[TopicPartition]) -> None:
        fetcher.attach([tp.partition for tp in partitions])
        consumer.assign(partitions)

    consumer.subscribe([unique_topic], on_assign=attach)
    try:
        first = fetcher.fetch(10.0)
    finally:
        fetcher.close()
        consumer.close()

    assert len(first.records) > 0
