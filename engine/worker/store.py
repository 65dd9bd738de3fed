"""The worker cluster's shared memory: two compacted Kafka topics, read whole by every worker.

Why Kafka and nothing else: as in Kafka Connect, the configs and status topics are the only state the
workers share, so a worker needs nothing but the bootstrap address to join, any worker answers for all, and
the broker's replication is the cluster's durability. ``<cluster>-configs`` has one partition, so every worker
sees connector changes in one order; both topics are compacted, so they hold the latest record per key.

Read-your-writes: a change returns once this worker's reader has read it back, so a ``POST`` followed by a
``GET`` on the same worker sees the connector. Two workers changing the same connector at the same moment
are ordered by the topic: the later record wins (there is no leader that serialises requests, unlike
Connect; the changes a REST call makes are whole records, so the result is always one of them).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from connectors.admin import ClientConfig, ensure_topic
from connectors.clients import kafka_client_config
from connectors.kafka_errors import kafka_error_text
from engine.worker.errors import RecordTooLarge, StoreError
from engine.worker.records import ConnectorRecord, TaskStatus, status_key

log = logging.getLogger(__name__)


class ClusterStore(Protocol):
    """What the API and the supervisor need of the shared state (``KafkaClusterStore``; a fake in tests)."""

    def connectors(self) -> dict[str, ConnectorRecord]: ...
    def put_connector(self, record: ConnectorRecord) -> None: ...
    def delete_connector(self, name: str) -> None: ...
    def statuses(self) -> list[TaskStatus]: ...
    def put_status(self, status: TaskStatus) -> None: ...
    def delete_status(self, connector: str, worker_id: str) -> None: ...
    def close(self) -> None: ...


def topic_names(cluster: str) -> tuple[str, str]:
    """``(<cluster>-configs, <cluster>-status)``."""
    return f"{cluster}-configs", f"{cluster}-status"


class KafkaClusterStore:
    """Both topics, created when missing (one partition each, compacted), read by a background thread."""

    def __init__(self, bootstrap: str, cluster: str, client_config: ClientConfig | None = None,
                 timeout_s: float = 30.0) -> None:
        self.configs_topic, self.status_topic = topic_names(cluster)
        self._timeout_s = timeout_s
        for topic in (self.configs_topic, self.status_topic):
            ensure_topic(bootstrap, topic, 1, client_config, compacted=True, timeout=timeout_s)
        common = kafka_client_config(bootstrap, client_config or {})
        # A write not acknowledged within the timeout fails for good (it is not left queued to land later).
        self._producer = Producer({**common, "acks": "all", "enable.idempotence": True, "linger.ms": 0,
                                   "message.timeout.ms": int(timeout_s * 1000)})
        self._consumer = Consumer({**common, "group.id": f"{cluster}-store-reader", "enable.auto.commit": False})
        self._changed = threading.Condition()
        self._connectors: dict[str, ConnectorRecord] = {}
        self._statuses: dict[bytes, TaskStatus] = {}
        self._positions = {self.configs_topic: 0, self.status_topic: 0}
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, name=f"{cluster}-store", daemon=True)
        try:
            ends = self._end_offsets()
            self._consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING) for topic in self._positions])
            self._reader.start()
            for topic, end in ends.items():
                self._await_position(topic, end)
        except BaseException:
            self.close()
            raise

    def connectors(self) -> dict[str, ConnectorRecord]:
        with self._changed:
            return dict(self._connectors)

    def statuses(self) -> list[TaskStatus]:
        with self._changed:
            return list(self._statuses.values())

    def put_connector(self, record: ConnectorRecord) -> None:
        self._write(self.configs_topic, record.name.encode(), record.encode())

    def delete_connector(self, name: str) -> None:
        self._write(self.configs_topic, name.encode(), None)

    def put_status(self, status: TaskStatus) -> None:
        """Statuses are sent, not awaited: each is rewritten every few seconds, and a supervisor must not
        wait on Kafka (its tasks' stop deadlines run meanwhile)."""
        self._send(self.status_topic, status.key, status.encode())

    def delete_status(self, connector: str, worker_id: str) -> None:
        self._send(self.status_topic, status_key(connector, worker_id), None)

    def _send(self, topic: str, key: bytes, value: bytes | None) -> None:
        try:
            self._producer.produce(topic, key=key, value=value)
        except (KafkaException, BufferError) as error:
            raise StoreError(f"writing to {topic!r}: {kafka_error_text(error)}") from error
        self._producer.poll(0)

    def close(self) -> None:
        self._closed.set()
        with self._changed:
            self._changed.notify_all()
        if self._reader.ident is not None:
            self._reader.join(timeout=5)
        self._producer.flush(5)
        self._consumer.close()

    def _write(self, topic: str, key: bytes, value: bytes | None) -> None:
        """Produce, wait for the broker's acknowledgement, then for this worker's reader to have read it. A
        record too large for the producer or the topic is ``RecordTooLarge``, naming its size."""
        delivered: list[Message] = []
        try:
            self._producer.produce(topic, key=key, value=value,
                                   on_delivery=lambda error, msg: delivered.append(msg))
        except KafkaException as error:
            raise _write_error(topic, value, error.args[0]) from error
        self._producer.flush(self._timeout_s)
        if not delivered:
            raise StoreError(f"writing to {topic!r}: no acknowledgement within {self._timeout_s:g}s")
        refused = delivered[0].error()
        if refused is not None:
            raise _write_error(topic, value, refused)
        offset = delivered[0].offset()
        assert offset is not None
        self._await_position(topic, offset + 1)

    def _await_position(self, topic: str, position: int) -> None:
        deadline = time.monotonic() + self._timeout_s
        with self._changed:
            while self._positions[topic] < position:
                if self._closed.is_set() or (self._reader.ident is not None and not self._reader.is_alive()):
                    raise StoreError(f"reading {topic!r}: the reader has stopped")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StoreError(f"reading {topic!r} back to offset {position}: only at "
                                     f"{self._positions[topic]} after {self._timeout_s:g}s")
                self._changed.wait(min(remaining, 0.5))

    def _end_offsets(self) -> dict[str, int]:
        ends = {}
        for topic in self._positions:
            try:
                _, high = self._consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=self._timeout_s)
            except KafkaException as error:
                raise StoreError(f"reading the end of {topic!r}: {error.args[0].str()}") from error
            ends[topic] = high
        return ends

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                message = self._consumer.poll(0.2)
            except (KafkaException, RuntimeError) as failure:
                log.warning("reading the worker cluster's topics", extra={"error": str(failure)})
                continue
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("reading the worker cluster's topics", extra={"error": error.str()})
                continue
            self._apply(message)

    def _apply(self, message: Message) -> None:
        topic, key, value, offset = message.topic(), message.key(), message.value(), message.offset()
        assert topic is not None and offset is not None
        with self._changed:
            if key is not None:
                try:
                    self._apply_record(topic, key, value)
                except (ValueError, TypeError, KeyError, AttributeError) as error:  # never stop the reader
                    log.warning("skipping an unreadable record of the worker cluster's topics",
                                extra={"topic": topic, "offset": offset, "error": str(error)})
            self._positions[topic] = offset + 1
            self._changed.notify_all()

    def _apply_record(self, topic: str, key: bytes, value: bytes | None) -> None:
        if topic == self.configs_topic:
            if value is None:
                self._connectors.pop(key.decode(), None)
            else:
                self._connectors[key.decode()] = ConnectorRecord.decode(value)
        elif value is None:
            self._statuses.pop(key, None)
        else:
            self._statuses[key] = TaskStatus.decode(value)


def _write_error(topic: str, value: bytes | None, error: KafkaError) -> StoreError:
    if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
        return RecordTooLarge(f"the record of {len(value or b'')} bytes is larger than {topic!r} takes (the "
                              "broker's max.message.bytes, the producer's message.max.bytes)")
    return StoreError(f"writing to {topic!r} failed: {error.name()}: {error.str()}")
