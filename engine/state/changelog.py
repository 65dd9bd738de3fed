"""Where keyed state is kept between epochs: one compacted changelog topic per stateful operator.

Writing goes through the sink (``state_records``: one record per changed partition, produced to that
partition in the epoch's own transaction), so state commits with the output and the offsets or not at all.
Reading is ``StateChangelog.latest``: the last committed record of a partition, read by a consumer outside
the group (``connectors.changelog.ChangelogReader``). The test driver has an in-memory ``StateChangelog``.

``KafkaChangelogStorage`` is both as a ``CheckpointStorage`` (``engine.state.storage``): the storage the
runtime's ``CheckpointCoordinator`` captures keyed state into and restores it from.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Protocol

from connectors.admin import ensure_topic
from connectors.changelog import ChangelogError, ChangelogReader, ChangelogTimeout, changelog_topic, state_record
from engine.state.errors import CheckpointError
from engine.state.storage import StateKey
from sinks import OutgoingRecord, Sink

__all__ = [
    "KafkaChangelogStorage",
    "KafkaStateChangelog",
    "StateChangelog",
    "StateNotPartitioned",
    "StateReadTimedOut",
    "StateUnreadable",
    "changelog_topic",
    "state_records",
]


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


class StateNotPartitioned(CheckpointError):
    """A changelog keeps state per source partition: an operator's whole, unpartitioned state has no place."""


class StateUnreadable(CheckpointError):
    """A piece of committed state cannot be read back; ``key`` and ``topic`` say which."""

    def __init__(self, key: StateKey, topic: str, cause: ChangelogError) -> None:
        super().__init__(f"{key.operator!r} partition {key.partition} cannot be read from {topic!r}: {cause}")
        self.key = key
        self.topic = topic
        self.cause = cause


class StateReadTimedOut(StateUnreadable):
    """Reading timed out (e.g. a dead owner's transaction is still open): waiting may heal it."""


class KafkaChangelogStorage:
    """A ``CheckpointStorage`` of keyed state on changelog topics, written inside the epoch's transaction.

    ``persist`` produces each changed partition's snapshot through ``sink`` into the open transaction (the
    same records ``state_records`` always made); ``complete`` and ``discard`` have nothing to do, because
    the sink's ``commit_epoch`` or ``abort_epoch`` is what makes the records visible or drops them. So a
    checkpoint here is durable exactly when its Kafka transaction committed, together with the output and
    the offsets. A compacted changelog keeps only the newest committed state of each partition: ``load``
    gives that one whatever id it is asked for, which is what recovery wants (the newest committed epoch is
    the one the group's offsets name). ``completed`` lists the ids completed by this process only (the
    durable record of what committed is the offsets' metadata); ``remove`` forgets one (compaction deletes).
    """

    def __init__(self, sink: Sink, changelog: StateChangelog, connector: str, instance: str) -> None:
        self._sink = sink
        self._changelog = changelog
        self._connector = connector
        self._instance = instance
        self._completed: list[int] = []

    def topic(self, operator: str) -> str:
        """The changelog topic of ``operator``."""
        return changelog_topic(self._connector, operator)

    def persist(self, checkpoint_id: int, pieces: Mapping[StateKey, bytes]) -> int:
        by_operator: dict[str, dict[int, bytes]] = {}
        for key, state in pieces.items():
            if key.partition is None:
                raise StateNotPartitioned(f"operator {key.operator!r} has no source partitions; a changelog "
                                          "topic keeps state per partition only")
            by_operator.setdefault(key.operator, {})[key.partition] = state
        return sum(self._sink.write_records(state_records(self.topic(operator), snapshots, checkpoint_id,
                                                          self._instance)).bytes
                   for operator, snapshots in by_operator.items())

    def complete(self, checkpoint_id: int) -> None:
        self._completed.append(checkpoint_id)

    def discard(self, checkpoint_id: int) -> None:
        """Nothing to undo here: aborting the epoch's transaction drops its records."""

    def load(self, checkpoint_id: int | None, keys: Collection[StateKey]) -> dict[StateKey, bytes | None]:
        return {key: self._latest(key) for key in keys}

    def completed(self) -> list[int]:
        return list(self._completed)

    def remove(self, checkpoint_id: int) -> None:
        self._completed.remove(checkpoint_id)

    def _latest(self, key: StateKey) -> bytes | None:
        if key.partition is None:
            raise StateNotPartitioned(f"operator {key.operator!r} has no source partitions to restore")
        topic = self.topic(key.operator)
        try:
            return self._changelog.latest(topic, key.partition)
        except ChangelogTimeout as error:
            raise StateReadTimedOut(key, topic, error) from error
        except ChangelogError as error:
            raise StateUnreadable(key, topic, error) from error
