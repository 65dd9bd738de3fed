"""In-memory stand-ins for what the worker's REST API (``engine.worker.api``) talks to, for tests and demos.

They replace the three things behind a ``WorkerContext`` that need a Kafka cluster:

- ``MemoryClusterStore`` stands in for ``KafkaClusterStore`` (the ``<cluster>-configs`` and ``<cluster>-status``
  compacted topics): the latest record per key, kept in dicts behind a lock, so a write is visible to the
  next read at once (the read-your-writes the real store waits for);
- ``FakeGroups`` stands in for ``GroupReader`` (the connectors' consumer groups): a ``GroupView`` set per
  connector name, None (the group cannot be read) for any other;
- ``FakeConnectorKafka`` stands in for ``KafkaConnectorOps`` (offsets and keyed state on the broker): it records
  each call, and refuses with ``GroupNotEmpty`` when told the group still has members.

``api_context`` puts them together as worker ``w1`` of cluster ``test``::

    store = MemoryClusterStore()
    client = TestClient(create_app(api_context(store=store)))
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from connectors.admin import GroupNotEmpty, StoredRecord
from engine.worker.api import GroupSource, WorkerContext
from engine.worker.guard import RequestGuard
from engine.worker.kafka_ops import ConnectorKafka
from engine.worker.records import ConnectorRecord, TaskStatus, status_key
from engine.worker.store import ClusterStore
from engine.worker.view import GroupView

WORKER_ID = "w1"
CLUSTER = "test"
KAFKA_CLUSTER_ID = "test-cluster"


class MemoryClusterStore:
    """``ClusterStore`` in memory: one record per connector name, one status per ``<connector>/<worker>`` key
    (as compaction keeps them), safe to use from the API's worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connectors: dict[str, ConnectorRecord] = {}
        self._statuses: dict[bytes, TaskStatus] = {}
        self.closed = False

    def connectors(self) -> dict[str, ConnectorRecord]:
        with self._lock:
            return dict(self._connectors)

    def put_connector(self, record: ConnectorRecord) -> None:
        with self._lock:
            self._connectors[record.name] = record

    def delete_connector(self, name: str) -> None:
        with self._lock:
            self._connectors.pop(name, None)

    def statuses(self) -> list[TaskStatus]:
        with self._lock:
            return list(self._statuses.values())

    def put_status(self, status: TaskStatus) -> None:
        with self._lock:
            self._statuses[status.key] = status

    def delete_status(self, connector: str, worker_id: str) -> None:
        with self._lock:
            self._statuses.pop(status_key(connector, worker_id), None)

    def close(self) -> None:
        self.closed = True


class FakeGroups:
    """The connectors' consumer groups as configured: ``views[name]``, else None (unreadable now)."""

    def __init__(self, views: dict[str, GroupView] | None = None) -> None:
        self._lock = threading.Lock()
        self._views: dict[str, GroupView] = dict(views or {})
        self.reads: list[str] = []
        """The connector names read, in order."""

    def set(self, name: str, view: GroupView | None) -> None:
        """Answer ``view`` for connector ``name`` from now on (None: its group cannot be read)."""
        with self._lock:
            if view is None:
                self._views.pop(name, None)
            else:
                self._views[name] = view

    def read(self, record: ConnectorRecord) -> GroupView | None:
        with self._lock:
            self.reads.append(record.name)
            return self._views.get(record.name)


@dataclass
class FakeConnectorKafka:
    """``ConnectorKafka`` that changes nothing: each call is appended to its list (the record as the API
    passed it). ``group_not_empty`` makes every call raise ``GroupNotEmpty`` as the broker does while
    instances still run; ``had_offsets`` is what ``reset_offsets`` answers; ``changelogs`` what
    ``reset_state`` says it deleted; ``records`` what each topic holds, oldest first, for ``last_records``."""

    group_not_empty: bool = False
    had_offsets: bool = True
    changelogs: list[str] = field(default_factory=list)
    altered: list[tuple[ConnectorRecord, list[tuple[str, int, int]]]] = field(default_factory=list)
    offset_resets: list[ConnectorRecord] = field(default_factory=list)
    state_resets: list[ConnectorRecord] = field(default_factory=list)
    records: dict[str, list[StoredRecord]] = field(default_factory=dict)

    def alter_offsets(self, record: ConnectorRecord, offsets: list[tuple[str, int, int]]) -> None:
        self._refuse_when_not_empty(record)
        self.altered.append((record, list(offsets)))

    def reset_offsets(self, record: ConnectorRecord) -> bool:
        self._refuse_when_not_empty(record)
        self.offset_resets.append(record)
        return self.had_offsets

    def reset_state(self, record: ConnectorRecord) -> list[str]:
        self._refuse_when_not_empty(record)
        self.state_resets.append(record)
        return list(self.changelogs)

    def last_records(self, topic: str, count: int) -> list[StoredRecord]:
        return list(reversed(self.records.get(topic, [])))[:count]

    def _refuse_when_not_empty(self, record: ConnectorRecord) -> None:
        if self.group_not_empty:
            raise GroupNotEmpty(f"consumer group 'epochline-{record.name}' refused: it still has members "
                                "(stop every instance first)")


TEST_CLIENT_GUARD = RequestGuard.serving("127.0.0.1", ["testserver"])
"""The worker's request guard, also answering to ``testserver``: the Host Starlette's ``TestClient`` sends."""


def api_context(store: ClusterStore | None = None, groups: GroupSource | None = None,
                kafka: ConnectorKafka | None = None, token: str | None = None) -> WorkerContext:
    """A ``WorkerContext`` for worker ``w1`` of cluster ``test`` (Kafka cluster id ``test-cluster``) over the
    fakes given, fresh empty ones for the others; metrics are empty."""
    return WorkerContext(store=store if store is not None else MemoryClusterStore(),
                         groups=groups if groups is not None else FakeGroups(),
                         kafka=kafka if kafka is not None else FakeConnectorKafka(),
                         worker_id=WORKER_ID, cluster=CLUSTER, kafka_cluster_id=KAFKA_CLUSTER_ID, token=token,
                         metrics=lambda: b"", guard=TEST_CLIENT_GUARD)


__all__ = ["FakeConnectorKafka", "FakeGroups", "MemoryClusterStore", "api_context"]
