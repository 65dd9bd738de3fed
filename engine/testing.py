"""Helpers for testing epochline pipelines against a real Kafka, in a few lines per test.

    topic = create_unique_topic(kafka_bootstrap, "orders")
    produce_rows(kafka_bootstrap, topic, [{"id": 1, "amount": 2.5}], FormatSpec(format="json"))
    run_pipeline(config_path, kafka_bootstrap)
    table = read_topic(kafka_bootstrap, "orders-clean", FormatSpec(format="json"))

``read_topic`` reads with ``read_committed`` by default, so a test sees exactly what a downstream consumer
of an exactly-once pipeline sees. It stops at the end offsets taken when it starts, judged by the consumer's
position and end-of-partition events: transaction markers occupy offsets, so "last record offset + 1" never
reaches the end of a transactional topic.

``KafkaContainer`` runs one single-node KRaft broker in a Docker container through testcontainers
(used by the pytest plugin, usable on its own). The container shares the host's network namespace, so the
broker listens on 127.0.0.1 like the embedded broker and no port mapping is involved (Linux Docker engines).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from connectors.admin import create_topic, partitions_of
from engine.local_broker import KAFKA_VERSION, BrokerStartFailed, server_properties, free_port
from engine.local_broker import wait_until_transactions_work
from schemas import FormatSpec, make_format

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer

log = logging.getLogger(__name__)

IMAGE_ENV = "EPOCHLINE_KAFKA_IMAGE"
DEFAULT_IMAGE = f"apache/kafka:{KAFKA_VERSION}"
CONTAINER_DATA_DIR = Path("/tmp/epochline-kafka")  # writable in apache/kafka (runs as appuser) and ours

Isolation = Literal["read_committed", "read_uncommitted"]


class KafkaTestError(RuntimeError):
    """A testing helper could not do what it was asked; the message names topic, broker or image."""


class ContainerStartFailed(KafkaTestError):
    """The Kafka container could not be created, or its broker did not accept transactions in time."""


class ProduceFailed(KafkaTestError):
    """Some rows were not acknowledged by the broker."""


class ReadFailed(KafkaTestError):
    """A topic could not be read to its end offsets in time, or a record did not decode."""


def kafka_image() -> str:
    """The Kafka image containers use: ``EPOCHLINE_KAFKA_IMAGE``, else the official ``apache/kafka``."""
    return os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE


def docker_unavailable_reason() -> str | None:
    """None when a Docker engine answers a ping (``DOCKER_HOST`` or the default socket), else why not."""
    import docker
    import requests

    try:
        client = docker.from_env(timeout=5)
    except docker.errors.DockerException as error:
        return f"no Docker engine is reachable ({error})"
    try:
        client.ping()
    except (docker.errors.DockerException, requests.RequestException) as error:
        return f"the Docker engine did not answer a ping ({error})"
    finally:
        client.close()
    return None


def broker_environment(port: int, controller_port: int) -> dict[str, str]:
    """The container's settings in the official apache/kafka image's convention (``KAFKA_LOG_DIRS`` means
    ``log.dirs``), taken from the embedded broker's settings so both brokers behave the same: single-node
    KRaft, replication 1 for offsets and transaction state, listeners on 127.0.0.1."""
    settings = dict(
        line.split("=", 1)
        for line in server_properties(CONTAINER_DATA_DIR, port, controller_port).splitlines()
    )
    environment = {_property_to_env(key): value for key, value in settings.items()}
    environment["CLUSTER_ID"] = uuid.uuid4().hex[:22]
    return environment


def _property_to_env(key: str) -> str:
    """``transaction.state.log.min.isr`` -> ``KAFKA_TRANSACTION_STATE_LOG_MIN_ISR`` ('_' is doubled, '-'
    tripled), the inverse of what the image's KafkaDockerWrapper applies."""
    return "KAFKA_" + key.replace("_", "__").replace("-", "___").replace(".", "_").upper()


@dataclass
class KafkaContainer:
    """One single-node KRaft Kafka broker in a container on the host network, started by testcontainers.

    ``start`` returns only once a transactional producer can ``init_transactions``, and ``stop`` removes
    the container with its volumes. Ryuk (testcontainers' reaper for crashed sessions) follows
    ``TESTCONTAINERS_RYUK_DISABLED``; without registry access it must be disabled.
    """

    image: str = field(default_factory=kafka_image)
    startup_timeout: float = 120.0
    bootstrap: str | None = None
    _container: DockerContainer | None = None

    def start(self) -> str:
        import docker
        from testcontainers.core.container import DockerContainer

        port, controller_port = free_port(), free_port()
        container = (
            DockerContainer(self.image)
            .with_envs(**broker_environment(port, controller_port))
            .with_kwargs(network_mode="host", labels={"org.epochline.role": "kafka-test-broker"})
        )
        try:
            container.start()
        except docker.errors.DockerException as error:
            raise ContainerStartFailed(f"starting a container from {self.image} failed: {error}") from error
        self._container = container
        bootstrap = f"127.0.0.1:{port}"
        try:
            wait_until_transactions_work(bootstrap, self.startup_timeout, self._is_running)
        except BrokerStartFailed as failure:
            output = self._output_tail()
            self.stop()
            raise ContainerStartFailed(f"{failure} (image {self.image})\nlast container output:\n{output}") from None
        self.bootstrap = bootstrap
        log.info("kafka container started",
                 extra={"image": self.image, "container": container.get_wrapped_container().short_id,
                        "bootstrap": bootstrap})
        return bootstrap

    def _is_running(self) -> bool:
        assert self._container is not None
        self._container.reload()
        return self._container.status == "running"

    def _output_tail(self, lines: int = 20) -> str:
        assert self._container is not None
        stdout, stderr = self._container.get_logs()
        return "\n".join((stdout + stderr).decode(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Remove the container (forced, with its anonymous volumes); a stopped container is a no-op."""
        if self._container is not None:
            self._container.stop()
            log.info("kafka container removed", extra={"image": self.image, "bootstrap": self.bootstrap})
        self._container = None
        self.bootstrap = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()


def create_unique_topic(bootstrap: str, prefix: str, partitions: int = 1) -> str:
    """Create a topic named ``<prefix>-<random>`` and return its name; tests sharing a broker never collide."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions)
    return topic


def produce_rows(bootstrap: str, topic: str, rows: list[dict] | pa.Table, format_spec: FormatSpec,
                 transactional: bool = False, abort: bool = False, timeout: float = 30.0) -> int:
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
    config = {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, "log_level": 0}
    if transactional:
        config["transactional.id"] = f"epochline-testing-{uuid.uuid4().hex}"
    producer = Producer(config)
    failures: list[str] = []

    def remember_failure(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            failures.append(f"partition {message.partition()}: {error}")

    if transactional:
        producer.init_transactions(timeout)
        producer.begin_transaction()
    for payload in payloads:
        _produce_waiting_for_room(producer, topic, payload, remember_failure)
    if transactional:
        producer.flush(timeout)
        (producer.abort_transaction if abort else producer.commit_transaction)(timeout)
    unacknowledged = producer.flush(timeout)
    if failures or unacknowledged:
        raise ProduceFailed(
            f"producing {len(payloads)} records to {topic} on {bootstrap}: {len(failures)} failed, "
            f"{unacknowledged} unacknowledged after {timeout:.0f}s; first failures: {failures[:3]}"
        )
    return len(payloads)


def _produce_waiting_for_room(producer: Producer, topic: str, payload: bytes, on_delivery) -> None:
    """Produce one record; when the client's queue is full, serve delivery reports until it has room."""
    while True:
        try:
            producer.produce(topic, payload, on_delivery=on_delivery)
            return
        except BufferError:
            producer.poll(0.1)


def read_topic(bootstrap: str, topic: str, format_spec: FormatSpec, isolation: Isolation = "read_committed",
               timeout: float = 30.0) -> pa.Table:
    """Read every partition of ``topic`` from the beginning up to its end offsets at the time of the call
    and decode the records, in partition then offset order.

    With ``read_committed`` the end is the last stable offset: records of aborted transactions are
    filtered by the broker and records of open ones are not waited for. A record the format cannot decode
    is an error naming its partition and offset.
    """
    return _decode(_read_records(bootstrap, topic, isolation, timeout), topic, format_spec)


def read_values(bootstrap: str, topic: str, isolation: Isolation = "read_committed",
                timeout: float = 60.0) -> list[bytes | None]:
    """The raw values ``read_topic`` would decode, in partition then offset order."""
    return [record.value for record in _read_records(bootstrap, topic, isolation, timeout)]


def _read_records(bootstrap: str, topic: str, isolation: Isolation, timeout: float) -> list[_Record]:
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"epochline-testing-{uuid.uuid4().hex}",
        "isolation.level": isolation,
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "log_level": 0,
    })
    try:
        ends = _end_offsets(consumer, bootstrap, topic, timeout)
        return _consume_until_ends(consumer, topic, ends, timeout)
    finally:
        consumer.close()


def _end_offsets(consumer: Consumer, bootstrap: str, topic: str, timeout: float) -> dict[int, int]:
    """Per partition with records, where a reader with this consumer's isolation level stops (the last
    stable offset for read_committed, else the high watermark); empty partitions are left out."""
    ends = {}
    for partition in partitions_of(bootstrap, topic, timeout):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
        if high > low:
            ends[partition] = high
    return ends


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
            if message.error() is None:
                if message.offset() < ends[message.partition()]:
                    records.append(_Record(message.partition(), message.offset(), message.value()))
            elif message.error().code() == KafkaError._PARTITION_EOF:
                if message.offset() >= pending.get(message.partition(), 0):
                    pending.pop(message.partition(), None)
            else:
                raise ReadFailed(f"reading {topic} partition {message.partition()} failed: {message.error()}")
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


def run_pipeline(config: Path, bootstrap: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
    """Run ``epochline run CONFIG --bootstrap-servers BOOTSTRAP --stop-at-end`` as a separate process, as
    a user would, and return once it has committed all input present at its start; a non-zero exit is an
    error that carries the command's output."""
    command = [sys.executable, "-m", "engine.cli", "run", str(config), "--bootstrap-servers", bootstrap,
               "--stop-at-end"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        raise KafkaTestError(f"'epochline run {config}' did not finish within {timeout:.0f}s:\n"
                             f"{_text(expired.stdout)}{_text(expired.stderr)}") from None
    if done.returncode != 0:
        raise KafkaTestError(f"'epochline run {config}' exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done


def _text(output: bytes | str | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")
