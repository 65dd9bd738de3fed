"""Topic administration the connectors, batch jobs and tests share: create topics, describe them, and read
partition offsets. Every partition start/end offset look-up in epochline goes through ``watermark_offsets``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # the class confluent_kafka.admin re-exports without declaring it

log = logging.getLogger(__name__)  # librdkafka's own lines too (the clients' ``logger``)

_QUIET = 4  # librdkafka log level: warnings and worse

COORDINATOR_NOT_READY = frozenset({
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
})
"""A group's coordinator moves or loads right after the broker starts: librdkafka does not flag these as
retriable for ``committed()``, but they clear within seconds."""


class TopicAdminError(RuntimeError):
    """A topic could not be created or described, or its offsets could not be read."""


def _admin_client(bootstrap: str) -> AdminClient:
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "log_level": _QUIET, "logger": log}
    return AdminClient(config)


def create_topic(bootstrap: str, topic: str, partitions: int = 1, config: dict[str, str] | None = None,
                 timeout: float = 30.0) -> None:
    """Create ``topic`` and wait for the broker to confirm it; an existing topic is left as it is."""
    admin = _admin_client(bootstrap)
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})],
                                  operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[topic].result(timeout)
    except KafkaException as error:
        if error.args[0].name() != "TOPIC_ALREADY_EXISTS":
            raise TopicAdminError(f"creating topic {topic!r} on {bootstrap} failed: {error}") from error


def partitions_of(bootstrap: str, topic: str, timeout: float = 30.0) -> list[int]:
    """The topic's partition ids; a missing topic is an error that names it."""
    admin = _admin_client(bootstrap)
    try:
        metadata = admin.list_topics(topic, timeout=timeout)
    except KafkaException as error:
        raise TopicAdminError(f"cannot describe topic {topic!r}: broker {bootstrap} unreachable ({error})") from error
    described = metadata.topics.get(topic)
    if described is None or described.error is not None:
        reason = described.error if described is not None else "not in metadata"
        raise TopicAdminError(f"topic {topic!r} is not available on {bootstrap}: {reason}")
    return sorted(described.partitions)


def watermark_offsets(consumer: Consumer, topic: str, partitions: list[int],
                      timeout: float = 30.0) -> dict[int, tuple[int, int]]:
    """Per partition, ``(log start, end)`` as ``consumer``'s isolation level sees them: for
    ``read_committed`` the end is the last stable offset (what such a reader stops before), else the high
    watermark. Transaction markers occupy offsets, so the end is not "last record offset + 1"."""
    offsets = {}
    for partition in partitions:
        try:
            offsets[partition] = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
        except KafkaException as error:
            raise TopicAdminError(f"offsets of topic {topic!r} partition {partition} unavailable: {error}") from error
    return offsets


def partition_offsets(bootstrap: str, topic: str, timeout: float = 30.0) -> dict[int, tuple[int, int]]:
    """``watermark_offsets`` of every partition of ``topic``, read as a ``read_committed`` consumer."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "epochline-end-offsets",
                         "isolation.level": "read_committed", "enable.auto.commit": False, "log_level": _QUIET,
                         "logger": log})
    try:
        return watermark_offsets(consumer, topic, partitions_of(bootstrap, topic, timeout), timeout)
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, timeout: float = 30.0) -> dict[int, int]:
    """Per partition, the offset a ``read_committed`` reader stops before (the last stable offset)."""
    return {partition: end for partition, (_, end) in partition_offsets(bootstrap, topic, timeout).items()}


def committed_offsets(consumer: Consumer, partitions: list[TopicPartition], timeout: float = 30.0,
                      ) -> list[TopicPartition]:
    """The consumer's group's committed offsets (with metadata) for ``partitions``, retrying retriable errors
    and a coordinator that is not ready yet until ``timeout``; then ``TopicAdminError``."""
    deadline = time.monotonic() + timeout
    backoff = 0.1
    while True:
        try:
            return list(consumer.committed(partitions, timeout=max(0.1, deadline - time.monotonic())))
        except KafkaException as exc:
            error = exc.args[0]
            transient = error.retriable() or error.code() in COORDINATOR_NOT_READY
            if not transient or time.monotonic() + backoff > deadline:
                raise TopicAdminError(f"committed offsets unavailable: {error}") from exc
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)
