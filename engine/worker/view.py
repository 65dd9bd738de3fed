"""What the API shows of a connector: its record, its tasks' statuses and its consumer group, in one answer.

Any worker answers for every connector: the record and the task statuses come from the cluster's topics,
partitions, checkpoint ids, commit ages and lag from the connector's consumer group (``engine.group_status``).
A task status that its worker stopped rewriting is left out (that worker is gone; its partitions have moved
or are moving to the group's other members).

Health is progress, not liveness: a connector meant to run is healthy when it runs and either has nothing
to do or committed an epoch recently (within three checkpoint intervals plus the checkpoint timeout).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from connectors.admin import ClientConfig, TopicAdminError
from engine.config import ConfigError, ConnectorConfig
from engine.group_status import ConnectorStatus, PartitionStatus, read_status
from engine.secrets import SecretReferenceError
from engine.worker.records import ConnectorRecord, TaskState, TaskStatus
from engine.worker.task_config import loaded

log = logging.getLogger(__name__)
GROUP_READ_TIMEOUT_MS = 5_000
MARKER_LAG = 1
"""Lag counts offsets to the high watermark, and an input written in transactions ends in a commit marker:
a partition one offset behind has nothing left to read."""


@dataclass(frozen=True)
class GroupView:
    """The part of a connector's group status the API uses, read at ``read_at`` (wall clock)."""

    status: ConnectorStatus
    read_at: float
    checkpoint_interval_s: float
    checkpoint_timeout_s: float


class GroupReader:
    """Reads connectors' groups from Kafka with the worker's own settings (never a connector's secrets), each
    answer kept ``ttl_s`` (the status page polls every 2 s)."""

    def __init__(self, bootstrap: str, client: ClientConfig | None = None, ttl_s: float = 1.0) -> None:
        self._bootstrap = bootstrap
        self._client = dict(client or {})
        self._ttl_s = ttl_s
        self._cache: dict[tuple[str, int], tuple[float, GroupView | None]] = {}
        self._lock = threading.Lock()

    def read(self, record: ConnectorRecord) -> GroupView | None:
        """None when the group cannot be read now (Kafka slow, the config invalid): fields are then null."""
        key = (record.name, record.version)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and time.monotonic() - cached[0] < self._ttl_s:
            return cached[1]
        view = self._read(record)
        with self._lock:
            self._cache = {k: v for k, v in self._cache.items() if k[0] != record.name}
            self._cache[key] = (time.monotonic(), view)
        return view

    def _read(self, record: ConnectorRecord) -> GroupView | None:
        try:
            with loaded(record.config) as config:
                quick = _quick(config)
                return GroupView(read_status(quick, self._bootstrap, self._client), time.time(),
                                 config.checkpoint.interval / 1000, config.checkpoint.timeout / 1000)
        except (TopicAdminError, ConfigError, SecretReferenceError) as error:
            log.warning("cannot read the connector's group", extra={"connector": record.name, "error": str(error)})
            return None


def _quick(config: ConnectorConfig) -> ConnectorConfig:
    """The config with a short connect timeout: an API answer must not wait 30 s for Kafka."""
    kafka = config.kafka.model_copy(update={"connect_timeout": min(config.kafka.connect_timeout,
                                                                   GROUP_READ_TIMEOUT_MS)})
    quick = config.model_copy(update={"kafka": kafka})
    quick._base_dir = config.base_dir
    return quick


def live_tasks(name: str, statuses: list[TaskStatus], now: float | None = None) -> list[TaskStatus]:
    return sorted((status for status in statuses if status.connector == name and status.fresh(now)),
                  key=lambda status: status.worker_id)


def connector_state(record: ConnectorRecord, tasks: list[TaskStatus]) -> TaskState:
    """One state for the connector that never hides a failed task (a RUNNING connector with a FAILED task is
    the complaint of provectus/kafka-ui #517): any FAILED task makes it FAILED."""
    states = {task.state for task in tasks}
    if "FAILED" in states:
        return "FAILED"
    if record.target != "RUNNING":
        return record.target
    for state in ("RESTARTING", "RUNNING"):
        if state in states:
            return state
    return "UNASSIGNED"


def _source_partitions(group: GroupView | None) -> list[PartitionStatus]:
    return [p for p in group.status.partitions if p.role == "source"] if group is not None else []


def _commit_age(partitions: list[PartitionStatus], now: float) -> float | None:
    times = [p.committed_at for p in partitions if p.committed_at is not None]
    return round(max(0.0, now - max(times) / 1000), 3) if times else None


def _lag(partitions: list[PartitionStatus]) -> int | None:
    known = [p.lag for p in partitions if p.lag is not None]
    return sum(known) if known else None


def _dead_letters(group: GroupView | None, instance: str | None = None) -> int | None:
    """Dead letters of committed epochs (of those ``instance`` committed last, if given), summed over every
    input (source and repartition) from the commits' metadata (``connectors.offset_metadata``): the same after
    a task restarts, and equal to what the dead-letter topic holds read_committed."""
    inputs = group.status.partitions if group is not None else []
    known = [p.dead_letters for p in inputs
             if p.dead_letters is not None and (instance is None or p.instance == instance)]
    return sum(known) if known else None


def _checkpoint(partitions: list[PartitionStatus]) -> int | None:
    ids = [p.checkpoint for p in partitions if p.checkpoint is not None]
    return max(ids) if ids else None


def task_view(task: TaskStatus, group: GroupView | None, now: float) -> dict[str, Any]:
    members = [m for m in group.status.members if m.instance == task.worker_id] if group is not None else []
    held = [p for p in _source_partitions(group) if p.held_by == task.worker_id]
    committed = [p for p in _source_partitions(group) if p.instance == task.worker_id]
    return {"id": task.worker_id, "worker_id": task.worker_id, "state": task.state, "pid": task.pid,
            "partitions": [partition for member in members for partition in member.partitions],
            "restarts": task.restarts, "checkpoint": _checkpoint(committed),
            "last_commit_age_s": _commit_age(committed, now), "lag": _lag(held),
            "dead_letters": _dead_letters(group, task.worker_id),
            "error": asdict(task.error) if task.error is not None else None, "trace": task.trace}


def partition_view(partition: PartitionStatus) -> dict[str, Any]:
    """One input partition as the status page's lag table shows it."""
    return {"topic": partition.topic, "role": partition.role, "partition": partition.partition,
            "committed": partition.committed, "end": partition.end, "lag": partition.lag,
            "held_by": partition.held_by, "dead_letters": partition.dead_letters}


def connector_view(record: ConnectorRecord, statuses: list[TaskStatus], group: GroupView | None) -> dict[str, Any]:
    now = time.time()
    tasks = live_tasks(record.name, statuses, now)
    sources = _source_partitions(group)
    return {"name": record.name,
            "connector": {"state": connector_state(record, tasks), "target": record.target,
                          "worker_id": tasks[0].worker_id if tasks else None},
            "tasks": [task_view(task, group, now) for task in tasks],
            "lag": _lag(sources), "checkpoint": _checkpoint(sources), "last_commit_age_s": _commit_age(sources, now),
            "dead_letters": _dead_letters(group), "type": "source",
            "partitions": [partition_view(p) for p in group.status.partitions] if group is not None else []}


def health_problem(record: ConnectorRecord, view: dict[str, Any], group: GroupView | None) -> str | None:
    """Why a connector meant to run is not making progress, or None."""
    if record.target != "RUNNING":
        return None
    state = view["connector"]["state"]
    if state != "RUNNING":
        failed = [task["error"]["message"] for task in view["tasks"] if task["error"]]
        return f"{record.name}: {state}" + (f" ({failed[0]})" if failed else "")
    if group is None:
        return f"{record.name}: its consumer group cannot be read"
    behind = [p for p in _source_partitions(group) if p.lag is None or p.lag > MARKER_LAG]
    if not behind:
        return None
    expected = 3 * group.checkpoint_interval_s + group.checkpoint_timeout_s
    age = view["last_commit_age_s"]
    if age is None:
        return f"{record.name}: {len(behind)} partition(s) to read and no epoch committed yet"
    if age > expected:
        return (f"{record.name}: {len(behind)} partition(s) behind and the last epoch committed {age:.0f} s ago "
                f"(expected within {expected:g} s)")
    return None
