"""What the API does to Kafka beyond the cluster's topics: a connector's committed offsets and keyed state,
and the last records of its dead-letter topic.

Offsets and state only while no instance of the connector runs (the broker refuses offset changes for a group with
members; changelog topics are only deleted when the group is empty), so what is changed is exactly what the
connector will resume from: offsets as committed here, keyed state empty.
"""

from __future__ import annotations

from typing import Protocol

from confluent_kafka import TopicPartition

from connectors.admin import (
    ClientConfig,
    GroupMissing,
    GroupNotEmpty,
    StoredRecord,
    alter_group_offsets,
    delete_group,
    delete_topics,
    describe_group,
    last_committed_records,
    matching_topics,
)
from engine.group_status import OPERATOR_NAME
from engine.worker.records import ConnectorRecord
from engine.worker.task_config import loaded

TIMEOUT_S = 10.0


class ConnectorKafka(Protocol):
    """The Kafka side of the offsets endpoints and of a keyed-state reset (a fake in unit tests)."""

    def alter_offsets(self, record: ConnectorRecord, offsets: list[tuple[str, int, int]]) -> None: ...
    def reset_offsets(self, record: ConnectorRecord) -> bool: ...
    def reset_state(self, record: ConnectorRecord) -> list[str]: ...
    def last_records(self, topic: str, count: int) -> list[StoredRecord]: ...


class KafkaConnectorOps:
    """With the worker's own Kafka settings: a connector's secrets are resolved only inside its tasks."""

    def __init__(self, bootstrap: str, client: ClientConfig | None = None) -> None:
        self._bootstrap = bootstrap
        self._client = dict(client or {})

    def alter_offsets(self, record: ConnectorRecord, offsets: list[tuple[str, int, int]]) -> None:
        with loaded(record.config) as config:
            alter_group_offsets(self._bootstrap, config.group_id,
                                [TopicPartition(topic, partition, offset) for topic, partition, offset in offsets],
                                TIMEOUT_S, self._client)

    def reset_offsets(self, record: ConnectorRecord) -> bool:
        with loaded(record.config) as config:
            return delete_group(self._bootstrap, config.group_id, TIMEOUT_S, self._client)

    def last_records(self, topic: str, count: int) -> list[StoredRecord]:
        """The last ``count`` committed records of ``topic`` (a dead-letter topic), newest first."""
        return last_committed_records(self._bootstrap, topic, count, TIMEOUT_S, self._client)

    def reset_state(self, record: ConnectorRecord) -> list[str]:
        """Delete the connector's changelog topics (its keyed state); the next run creates them empty."""
        with loaded(record.config) as config:
            client = self._client
            try:
                if describe_group(self._bootstrap, config.group_id, TIMEOUT_S, client).members:
                    raise GroupNotEmpty(f"consumer group {config.group_id!r} still has members: stop every "
                                        "instance before resetting its keyed state")
            except GroupMissing:
                pass
            prefix = f"{config.name}-"
            topics = [topic for topic in matching_topics(self._bootstrap, prefix, "-changelog", TIMEOUT_S, client)
                      if OPERATOR_NAME.fullmatch(topic[len(prefix):-len("-changelog")])]
            delete_topics(self._bootstrap, topics, TIMEOUT_S, client)
            return topics
