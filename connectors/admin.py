"""Topic administration the connectors and tests share: create topics, read partition end offsets."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


class TopicAdminError(RuntimeError):
    """A topic could not be created or described."""


def create_topic(bootstrap: str, topic: str, partitions: int = 1, config: dict[str, str] | None = None,
                 timeout: float = 30.0) -> None:
    """Create ``topic`` and wait for the broker to confirm it; an existing topic is left as it is."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})  # warnings and worse
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})],
                                  operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[topic].result(timeout)
    except KafkaException as error:
        if error.args[0].name() != "TOPIC_ALREADY_EXISTS":
            raise TopicAdminError(f"creating topic {topic!r} on {bootstrap} failed: {error}") from error


def partitions_of(bootstrap: str, topic: str, timeout: float = 30.0) -> list[int]:
    """The topic's partition ids; a missing topic is an error that names it."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})  # warnings and worse
    try:
        metadata = admin.list_topics(topic, timeout=timeout)
    except KafkaException as error:
        raise TopicAdminError(f"cannot describe topic {topic!r}: broker {bootstrap} unreachable ({error})") from error
    described = metadata.topics.get(topic)
    if described is None or described.error is not None:
        reason = described.error if described is not None else "not in metadata"
        raise TopicAdminError(f"topic {topic!r} is not available on {bootstrap}: {reason}")
    return sorted(described.partitions)


def end_offsets(bootstrap: str, topic: str, timeout: float = 30.0) -> dict[int, int]:
    """Per partition, the offset a ``read_committed`` reader stops before (the last stable offset)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "epochline-end-offsets",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        ends = {}
        for partition in partitions_of(bootstrap, topic, timeout):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
            ends[partition] = high
        return ends
    finally:
        consumer.close()
