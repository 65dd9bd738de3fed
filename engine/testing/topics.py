"""Writing rows to topics and reading them back, as a test (or a downstream consumer) would.

``read_topic`` reads with ``read_committed`` by default, so a test sees exactly what a downstream consumer
of an exactly-once pipeline sees. It stops at the end offsets taken when it starts, judged by the consumer's
position and end-of-partition events: transaction markers occupy offsets, so "last record offset + 1" never
reaches the end of a transactional topic.
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from connectors.admin import (
    ClientConfig,
    Isolation,
    create_topic,
    partition_offsets,
    partitions_of,
    watermark_offsets,
)
from engine.testing.errors import ProduceFailed, ReadFailed
from schemas import FormatSpec, make_format
from sinks.produce import ANY_PARTITION, produce_waiting


def create_unique_topic(bootstrap: str, prefix: str, partitions: int = 1) -> str:
    """Create a topic named ``<prefix>-<random>`` and return its name; tests sharing a broker never collide."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions)
    return topic


def produce_rows(bootstrap: str, topic: str, rows: list[dict[str, Any]] | pa.Table, format_spec: FormatSpec,
                 transactional: bool = False, abort: bool = False, timeout: float = 30.0,
                 client_config: ClientConfig | None = None) -> int:
    """Encode ``rows`` with the format and write them to ``topic``; returns how many records were written.

    ``transactional`` writes them in one Kafka transaction, committed, or aborted when ``abort`` is set
    (the records then occupy offsets but ``read_committed`` readers never see them). Row dicts become an
    Arrow table with inferred types; pass a ``pa.Table`` to control the types exactly.
    """
    if abort and not transactional:
        raise ValueError("abort=True needs transactional=True: only a transaction can be aborted")
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(rows)
    wire_format = make_format(format_spec)
    payloads = [payload for batch in table.to_batches() for payload in wire_format.encode(batch)]
    if transactional:
        return produce_transactions(bootstrap, topic, [(payloads, not abort)], timeout=timeout,
                                    client_config=client_config)
    writer = _CheckedWriter(bootstrap, topic, transactional=False, client_config=client_config)
    writer.produce(payloads)
    return writer.finish(timeout)


def produce_transactions(bootstrap: str, topic: str, transactions: Sequence[tuple[Sequence[bytes | None], bool]],
                         partitions: int | None = None, timeout: float = 30.0,
                         client_config: ClientConfig | None = None) -> int:
    """Write each ``(values, commit)`` in a transaction of its own, committed or aborted (aborted records
    occupy offsets that ``read_committed`` readers skip). With ``partitions``, value i of a transaction goes
    to partition ``i % partitions``; else the partitioner picks. Returns how many records were written."""
    writer = _CheckedWriter(bootstrap, topic, transactional=True, client_config=client_config)
    writer.producer.init_transactions(timeout)
    for values, commit in transactions:
        writer.producer.begin_transaction()
        writer.produce(values, partitions)
        writer.producer.flush(timeout)
        (writer.producer.commit_transaction if commit else writer.producer.abort_transaction)(timeout)
    return writer.finish(timeout)


class _CheckedWriter:
    """A producer that remembers every failed delivery, so ``finish`` can refuse to report success."""

    def __init__(self, bootstrap: str, topic: str, *, transactional: bool,
                 client_config: ClientConfig | None = None) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        config: dict[str, str | int | bool] = {**(client_config or {}), "bootstrap.servers": bootstrap,
                                               "enable.idempotence": True, "linger.ms": 5, "log_level": 0}
        if transactional:
            config["transactional.id"] = f"epochline-testing-{uuid.uuid4().hex}"
        self.producer = Producer(config)
        self.written = 0
        self._failures: list[str] = []

    def _remember_failure(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._failures.append(f"partition {message.partition()}: {error}")

    def produce(self, values: Sequence[bytes | None], partitions: int | None = None) -> None:
        for index, value in enumerate(values):
            partition = index % partitions if partitions else ANY_PARTITION
            produce_waiting(self.producer, self.topic, value, partition=partition,
                            on_delivery=self._remember_failure, wait_s=0.1)
        self.written += len(values)

    def finish(self, timeout: float) -> int:
        unacknowledged = self.producer.flush(timeout)
        if self._failures or unacknowledged:
            raise ProduceFailed(
                f"producing {self.written} records to {self.topic} on {self.bootstrap}: {len(self._failures)} "
                f"failed, {unacknowledged} unacknowledged after {timeout:.0f}s; first failures: {self._failures[:3]}"
            )
        return self.written


def read_topic(bootstrap: str, topic: str, format_spec: FormatSpec, isolation: Isolation = "read_committed",
               timeout: float = 30.0, client_config: ClientConfig | None = None) -> pa.Table:
    """Read every partition of ``topic`` from the beginning up to its end offsets at the time of the call
    and decode the records, in partition then offset order.

    With ``read_committed`` the end is the last stable offset: records of aborted transactions are
    filtered by the broker, a transaction that committed a moment ago is waited for (``MARKER_GRACE_S``,
    until its markers are written), and records of open ones are not waited for beyond that. A record the
    format cannot decode is an error naming its partition and offset. ``client_config``: security settings
    (an authenticated broker).
    """
    return _decode(_read_records(bootstrap, topic, isolation, timeout, client_config), topic, format_spec)


def read_values(bootstrap: str, topic: str, isolation: Isolation = "read_committed",
                timeout: float = 60.0, client_config: ClientConfig | None = None) -> list[bytes | None]:
    """The raw values ``read_topic`` would decode, in partition then offset order."""
    return [record.value for record in _read_records(bootstrap, topic, isolation, timeout, client_config)]


def _read_records(bootstrap: str, topic: str, isolation: Isolation, timeout: float,
                  client_config: ClientConfig | None) -> list[_Record]:
    consumer = Consumer({
        **(client_config or {}),
        "bootstrap.servers": bootstrap,
        "group.id": f"epochline-testing-{uuid.uuid4().hex}",
        "isolation.level": isolation,
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "log_level": 0,
    })
    try:
        ends = _end_offsets(consumer, bootstrap, topic, isolation, timeout, client_config)
        return _consume_until_ends(consumer, topic, ends, timeout)
    finally:
        consumer.close()


MARKER_GRACE_S = 1.0
"""How long a ``read_committed`` read waits for a partition's last stable offset to reach its high watermark."""


def _end_offsets(consumer: Consumer, bootstrap: str, topic: str, isolation: Isolation, timeout: float,
                 client_config: ClientConfig | None) -> dict[int, int]:
    """Per partition with records, where a reader with this consumer's isolation level stops (the last
    stable offset for read_committed, else the high watermark); empty partitions are left out."""
    partitions = partitions_of(bootstrap, topic, timeout, client_config)
    offsets = watermark_offsets(consumer, topic, partitions, timeout)
    if isolation == "read_committed":
        offsets = _stable_after_recent_commits(consumer, bootstrap, topic, offsets, timeout, client_config)
    return {partition: high for partition, (low, high) in offsets.items() if high > low}


def _stable_after_recent_commits(consumer: Consumer, bootstrap: str, topic: str,
                                 stable: dict[int, tuple[int, int]], timeout: float,
                                 client_config: ClientConfig | None) -> dict[int, tuple[int, int]]:
    """The last stable offsets once the markers of transactions that just ended are written.

    ``commit_transaction`` returns once the coordinator has logged the commit; the markers that move each
    partition's last stable offset past the transaction's records are written a moment later. A read right
    after a commit could end before that epoch's records (seen in this project's CI), so while a partition's
    last stable offset is below its high watermark, ask again, for up to ``MARKER_GRACE_S``. A transaction
    that is still open keeps it there: its records are not waited for beyond that."""
    highs = partition_offsets(bootstrap, topic, timeout, client_config, isolation="read_uncommitted",
                              partitions=list(stable))
    high_watermarks = {partition: high for partition, (_, high) in highs.items()}
    deadline = time.monotonic() + MARKER_GRACE_S
    while any(end < high_watermarks.get(partition, end) for partition, (_, end) in stable.items()):
        if time.monotonic() >= deadline:
            break
        time.sleep(0.02)
        stable = watermark_offsets(consumer, topic, list(stable), timeout)
    return stable


@dataclass(frozen=True)
class _Record:
    partition: int
    offset: int
    value: bytes | None


def _consume_until_ends(consumer: Consumer, topic: str, ends: dict[int, int], timeout: float) -> list[_Record]:
    """Consume until every partition's position (or an end-of-partition event) is at its end offset."""
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING) for partition in ends])
    records: list[_Record] = []
    pending = dict(ends)
    deadline = time.monotonic() + timeout
    while pending:
        for message in consumer.consume(10_000, 0.2):
            error = message.error()
            if error is None:
                partition, offset = _position_of(message)
                if offset < ends[partition]:
                    records.append(_Record(partition, offset, message.value()))
            elif error.code() == KafkaError._PARTITION_EOF:
                partition, offset = _position_of(message)
                if offset >= pending.get(partition, 0):
                    pending.pop(partition, None)
            else:
                raise ReadFailed(f"reading {topic} partition {message.partition()} failed: {error}")
        for partition, position in _positions(consumer, topic, pending).items():
            if position >= pending[partition]:
                del pending[partition]
        if pending and time.monotonic() > deadline:
            raise ReadFailed(
                f"reading {topic} did not reach its end offsets within {timeout:.0f}s; still pending "
                f"(partition: position/end): {_describe_positions(consumer, topic, pending)}"
            )
    records.sort(key=lambda record: (record.partition, record.offset))
    return records


def _position_of(message: Message) -> tuple[int, int]:
    """The partition and offset of a record or an end-of-partition event. librdkafka sets both for those;
    ``Message.partition()``/``offset()`` return None only for events that belong to no partition."""
    return cast(int, message.partition()), cast(int, message.offset())


def _positions(consumer: Consumer, topic: str, partitions: dict[int, int]) -> dict[int, int]:
    """The consumer's next offset per partition (negative while it has no position yet)."""
    try:
        positions = consumer.position([TopicPartition(topic, partition) for partition in partitions])
    except KafkaException:
        return {}
    return {position.partition: position.offset for position in positions}


def _describe_positions(consumer: Consumer, topic: str, pending: dict[int, int]) -> str:
    positions = _positions(consumer, topic, pending)
    return ", ".join(f"{partition}: {positions.get(partition)}/{end}" for partition, end in pending.items())


def _decode(records: list[_Record], topic: str, format_spec: FormatSpec) -> pa.Table:
    decoded = make_format(format_spec).decode([record.value for record in records])
    if decoded.failures:
        described = defaultdict(list)
        for failure in decoded.failures[:5]:
            record = records[failure.index]
            described[f"partition {record.partition} offset {record.offset}"].append(failure.reason)
        raise ReadFailed(
            f"{len(decoded.failures)} records of {topic} did not decode as {format_spec.format}: {dict(described)}"
        )
    return pa.Table.from_batches([decoded.batch])
