"""The worker cluster: connectors deployed over a Kafka-Connect-shaped REST API, run as supervised tasks.

One module per idea:

- ``records``: what the cluster's two compacted topics hold (a record per connector, a status per task);
- ``store``: those topics read whole by every worker (``KafkaClusterStore``), read-your-writes;
- ``supervisor``: this worker's tasks, an ``epochline run`` child process per connector, restarted with
  backoff, FAILED after repeated failures; ``child``: the contract with those processes; ``warm``: the
  process kept ahead with a task's modules imported, that the next task starts in;
- ``task_config``: a stored config (schemas inline) as the files a task runs, validated as ``epochline validate``;
- ``view``: a connector's status and health from its record, its tasks and its consumer group;
- ``kafka_ops``: offsets and keyed-state resets of a stopped connector;
- ``api``: the REST endpoints (FastAPI); ``metrics``: ``/metrics`` across the tasks; ``ui/``: the status page;
- ``worker``: ``run_worker``, the process that ties them together;
- ``client`` and ``apply``: the other side, used by ``epochline connectors``.

Exactly once across deploys, updates, pauses and worker losses is the run protocol's (DESIGN.md): the
worker only starts and stops tasks, one per connector at a time, and a task always resumes from what its
group committed.

The web framework loads only when a worker starts (``engine.worker.worker``): ``epochline run``, which every
task is, does not pay for it.
"""

from __future__ import annotations

from typing import Any

from engine.worker.errors import StoreError, WorkerConfigError

_WORKER_NAMES = ("WorkerOptions", "check_bind", "run_worker")


def __getattr__(name: str) -> Any:
    if name in _WORKER_NAMES:
        from engine.worker import worker

        return getattr(worker, name)
    raise AttributeError(f"module 'engine.worker' has no attribute {name!r}")


__all__ = ["StoreError", "WorkerConfigError", "WorkerOptions", "check_bind", "run_worker"]
