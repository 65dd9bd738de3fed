"""Where keyed state is kept between epochs: one compacted changelog topic per stateful operator.

Writing goes through the sink (``state_records``: one record per changed partition, produced to that
partition in the epoch's own transaction), so state commits with the output and the offsets or not at all.
Reading is ``StateChangelog.latest``: the last committed record of a partition, read by a consumer outside
the group (``connectors.changelog.ChangelogReader``). The test driver has an in-memory ``StateChangelog``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from connectors.admin import ensure_topic
from connectors.changelog import ChangelogReader, changelog_topic, state_record
from sinks import OutgoingRecord

__all__ = ["KafkaStateChangelog", "StateChangelog", "changelog_topic", "state_records"]


class StateChangelog(Protocol):
    def ensure(self, topic: str, partitions: int, *, compacted: bool) -> None:
        """The topic exists with ``partitions`` partitions (one per source partition); changelogs are
        compacted, the repartition topic is not (every row of it must be read)."""
        ...

    def latest(self, topic: str, partition: int) -> bytes | None:
        """The partition's last committed state, or None when it never committed any."""
        ...

    def close(self) -> None: ...


def state_records(topic: str, snapshots: Mapping[int, bytes], checkpoint_id: int,
                  instance: str) -> list[OutgoingRecord]:
    """The changelog records of one epoch: each changed partition's snapshot, to its own partition."""
    records = []
    for partition, snapshot in snapshots.items():
        key, value, headers = state_record(snapshot, checkpoint_id, instance)
        records.append(OutgoingRecord(topic, partition, value, key, list(headers)))
    return records


class KafkaStateChangelog:
    """Changelog topics on the connector's Kafka; the reader is made on first use (stateless connectors
    never make one)."""

    def __init__(self, bootstrap: str, client_config: Mapping[str, str], timeout: float) -> None:
        self._bootstrap = bootstrap
        self._client_config = dict(client_config)
        self._timeout = timeout
        self._reader: ChangelogReader | None = None

    def ensure(self, topic: str, partitions: int, *, compacted: bool) -> None:
        ensure_topic(self._bootstrap, topic, partitions, self._client_config, compacted=compacted,
                     timeout=self._timeout)

    def latest(self, topic: str, partition: int) -> bytes | None:
        if self._reader is None:
            self._reader = ChangelogReader(self._bootstrap, self._client_config, self._timeout)
        entry = self._reader.latest(topic, partition)
        return None if entry is None else entry.value

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
