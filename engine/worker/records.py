"""What the worker cluster keeps in its two compacted topics: one record per connector, one per task.

``<cluster>-configs`` holds a ``ConnectorRecord`` per connector (key = name, tombstone = deleted): the config
as submitted (secret references unresolved, schemas inline), the target state, and counters that tell every
worker what changed. ``<cluster>-status`` holds a ``TaskStatus`` per connector and worker (key =
``<connector>/<worker>``), rewritten by its worker every few seconds, so any worker answers for all and a
status that stops being rewritten is a worker that is gone.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import orjson

TargetState = Literal["RUNNING", "PAUSED", "STOPPED"]
TaskState = Literal["RUNNING", "PAUSED", "STOPPED", "FAILED", "RESTARTING", "UNASSIGNED"]
STATUS_TTL_S = 15.0
"""A task status not rewritten for this long belongs to a worker that is gone (its instance left the group)."""


@dataclass(frozen=True)
class ConnectorRecord:
    """A connector as the cluster wants it.

    ``version`` moves with every config change (the workers restart their task on it), ``restart`` with every
    restart request (``restart_only_failed`` says whether healthy tasks are spared). ``incarnation`` is new
    each time the name is created, so a worker that sees a delete and a re-create at once still replaces
    the old task."""

    name: str
    config: dict[str, Any]
    target: TargetState = "RUNNING"
    version: int = 1
    restart: int = 0
    restart_only_failed: bool = False
    incarnation: str = field(default_factory=lambda: uuid.uuid4().hex)

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, value: bytes) -> ConnectorRecord:
        fields = orjson.loads(value)
        if not isinstance(fields, dict) or not isinstance(fields.get("config"), dict):
            raise ValueError("a connector record must be a JSON object with a config object")
        return cls(**fields)

    def with_target(self, target: TargetState) -> ConnectorRecord:
        return replace(self, target=target)


@dataclass(frozen=True)
class TaskError:
    """Why a task failed: the exception's class and message, the exit code, when."""

    type: str
    message: str
    exit_code: int | None
    at: str


@dataclass(frozen=True)
class TaskStatus:
    """One worker's task of one connector, as that worker last wrote it."""

    connector: str
    worker_id: str
    state: TaskState
    pid: int | None = None
    restarts: int = 0
    version: int = 0
    error: TaskError | None = None
    trace: str | None = None
    updated_at: float = field(default_factory=time.time)

    @property
    def key(self) -> bytes:
        return status_key(self.connector, self.worker_id)

    def fresh(self, now: float | None = None) -> bool:
        return (now if now is not None else time.time()) - self.updated_at < STATUS_TTL_S

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, value: bytes) -> TaskStatus:
        fields = orjson.loads(value)
        if not isinstance(fields, dict):
            raise ValueError(f"a task status must be a JSON object, not {type(fields).__name__}")
        error = fields.pop("error", None)
        known = {name: value for name, value in fields.items() if name in _TASK_STATUS_FIELDS}
        return cls(**known, error=TaskError(**error) if error else None)


_TASK_STATUS_FIELDS = frozenset(TaskStatus.__dataclass_fields__) - {"error"}
"""What ``TaskStatus.decode`` reads: a status written by another version of the worker (one that had a field
this one dropped, such as its process's own dead-letter count) still decodes, by the fields both know."""


def status_key(connector: str, worker_id: str) -> bytes:
    return f"{connector}/{worker_id}".encode()
