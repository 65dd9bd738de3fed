"""``CheckpointCoordinator``: captures every registered operator's state under one checkpoint id.

It persists the capture (``engine.state.files``) and reports success only for an id whose state was
captured *and* durably written. Recovery restores exactly the id Kafka says committed
(``restore_checkpoint``) and deletes the state of ids above it (``discard_above``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from engine.state.errors import (
    CheckpointCaptureFailed,
    CheckpointError,
    CheckpointPersistFailed,
    CheckpointRestoreFailed,
    CheckpointStateMismatch,
)
from engine.state.files import CheckpointMetadata, FileCheckpointStorage, StoredCheckpoint
from engine.state.ids import CheckpointIdLog

log = logging.getLogger(__name__)


@runtime_checkable
class OperatorState(Protocol):
    """State an operator hands to the checkpoint and takes back on recovery."""

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


class CheckpointSettings(BaseModel):
    """Checkpoint configuration: ``path`` is the directory for checkpoint files and ``ids.log``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    path: Path


OutcomeStatus = Literal["completed", "failed", "timed_out", "skipped"]


@dataclass(frozen=True)
class CheckpointOutcome:
    """How one periodic checkpoint attempt ended; ``skipped`` means an earlier attempt still hung."""

    checkpoint_id: int | None
    status: OutcomeStatus
    duration_s: float
    error: str | None = None


@dataclass
class _Capture:
    metadata: CheckpointMetadata
    blobs: dict[str, bytes]
    persisted: bool = False


class CheckpointCoordinator:
    """Captures, persists, completes and restores checkpoints of the registered operators.

    Success of a checkpoint id means: every operator's snapshot was captured under it and written
    durably (``persist``), and the caller declared it complete (after its Kafka transaction committed).
    Snapshots and file writes run outside the coordinator's lock, so a hung operator cannot block a
    timeout from failing its checkpoint; an attempt failed meanwhile can never become active or persisted.
    """

    OUTCOME_HISTORY = 1000

    def __init__(self, storage: FileCheckpointStorage, ids: CheckpointIdLog) -> None:
        self._storage = storage
        self._ids = ids
        self._lock = threading.RLock()
        self._operators: dict[str, OperatorState] = {}
        self._active: dict[int, _Capture] = {}
        self._completed: dict[int, CheckpointMetadata] = {}
        self._abandoned: set[int] = set()
        self._failed_count = 0
        self._outcomes: deque[CheckpointOutcome] = deque(maxlen=self.OUTCOME_HISTORY)
        self._periodic: _PeriodicCheckpointer | None = None
        self.reserve_above(max(storage.ids(), default=0))

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | CheckpointSettings) -> CheckpointCoordinator:
        """``{"path": dir}``: checkpoint files in ``dir``, id log in ``dir/ids.log``."""
        settings = config if isinstance(config, CheckpointSettings) else CheckpointSettings.model_validate(config)
        return cls(FileCheckpointStorage(settings.path), CheckpointIdLog(settings.path / "ids.log"))

    @property
    def storage(self) -> FileCheckpointStorage:
        return self._storage

    @property
    def id_log(self) -> CheckpointIdLog:
        return self._ids

    def register_operator(self, name: str, state: OperatorState) -> None:
        """Include ``state`` in every checkpoint under ``name``; re-registering a name replaces it."""
        with self._lock:
            self._operators[name] = state

    def reserve_id(self) -> int:
        return self._ids.reserve()

    def reserve_above(self, checkpoint_id: int) -> None:
        """Recovery: make every id reserved from now on larger than ``checkpoint_id`` (e.g. the id Kafka
        names as committed), even if the id log was lost or is behind."""
        self._ids.advance_to(checkpoint_id)

    def trigger_checkpoint(
        self, checkpoint_id: int | None = None, extra: Mapping[str, str] | None = None
    ) -> CheckpointMetadata:
        """Capture every operator's snapshot into memory under ``checkpoint_id`` (a new id when None).

        On any snapshot failure nothing becomes active, the id is completed as a failure (burned) and
        ``CheckpointCaptureFailed`` is raised. One trigger per id: ids come from ``reserve_id``.
        """
        with self._lock:
            if checkpoint_id is None:
                checkpoint_id = self._ids.reserve()
            self._check_usable(checkpoint_id)
            operators = dict(self._operators)
        try:
            blobs = _capture(checkpoint_id, operators)
        except CheckpointCaptureFailed:
            with self._lock:
                self._fail(checkpoint_id)
            raise
        metadata = CheckpointMetadata(
            checkpoint_id=checkpoint_id,
            created_at=time.time(),
            total_bytes=sum(len(blob) for blob in blobs.values()),
            operators={name: len(blob) for name, blob in blobs.items()},
            extra=dict(extra or {}),
        )
        with self._lock:
            if checkpoint_id in self._abandoned:
                raise CheckpointCaptureFailed(f"checkpoint {checkpoint_id} was failed while its state was captured")
            self._active[checkpoint_id] = _Capture(metadata, blobs)
        log.info("checkpoint captured", extra={"checkpoint_id": checkpoint_id, "total_bytes": metadata.total_bytes})
        return metadata

    def persist(self, checkpoint_id: int) -> None:
        """Durably write the captured state of active ``checkpoint_id``; raises ``CheckpointPersistFailed``."""
        with self._lock:
            capture = self._active.get(checkpoint_id)
        if capture is None:
            raise CheckpointPersistFailed(f"checkpoint {checkpoint_id} is not active, nothing to persist")
        self._storage.write(capture.metadata, capture.blobs)
        with self._lock:
            if self._active.get(checkpoint_id) is capture:
                capture.persisted = True
                return
            self._storage.delete(checkpoint_id)
        raise CheckpointPersistFailed(f"checkpoint {checkpoint_id} was failed while it was being written")

    def complete_checkpoint(self, checkpoint_id: int, success: bool) -> None:
        """Mark ``checkpoint_id`` completed (only if persisted) or failed (drops it and deletes its file)."""
        with self._lock:
            if success:
                self._complete_successfully(checkpoint_id)
            else:
                self._fail(checkpoint_id)

    def checkpoint(self, extra: Mapping[str, str] | None = None) -> CheckpointMetadata:
        """Standalone checkpoint: reserve, capture, persist, complete. Fails as a whole and raises."""
        return self._run_checkpoint(self._ids.reserve(), extra)

    def restore_checkpoint(self, checkpoint_id: int) -> CheckpointMetadata:
        """Restore exactly ``checkpoint_id`` into the registered operators (checksum verified)."""
        return self._restore(self._storage.read(checkpoint_id))

    def restore_latest_valid(self, at_most: int | None = None) -> CheckpointMetadata | None:
        """Restore the newest readable checkpoint <= ``at_most``, skipping corrupted ones with a warning.

        For standalone runs. After a Kafka commit of id M, exactly M must be restored
        (``restore_checkpoint``): falling back below M would drop the state of committed epochs.
        """
        stored = self._storage.latest_valid(at_most)
        return None if stored is None else self._restore(stored)

    def discard_above(self, checkpoint_id: int) -> list[int]:
        """Recovery: delete the state of every id above ``checkpoint_id`` (never committed)."""
        with self._lock:
            for larger in [i for i in self._active if i > checkpoint_id]:
                self._fail(larger)
            for larger in [i for i in self._completed if i > checkpoint_id]:
                del self._completed[larger]
            discarded = [i for i in self._storage.ids() if i > checkpoint_id]
            for larger in discarded:
                self._storage.delete(larger)
        if discarded:
            log.info("discarded uncommitted checkpoints", extra={"above": checkpoint_id, "checkpoint_ids": discarded})
        return discarded

    def latest_checkpoint(self) -> CheckpointMetadata | None:
        """The newest successfully completed (or restored) checkpoint."""
        with self._lock:
            return self._completed[max(self._completed)] if self._completed else None

    def active_count(self) -> int:
        with self._lock:
            return len(self._active)

    def completed_count(self) -> int:
        with self._lock:
            return len(self._completed)

    def failed_count(self) -> int:
        """Checkpoint attempts completed as failures since this coordinator was created."""
        with self._lock:
            return self._failed_count

    def outcomes(self) -> list[CheckpointOutcome]:
        """Outcomes of periodic attempts, oldest first (the last ``OUTCOME_HISTORY``)."""
        with self._lock:
            return list(self._outcomes)

    def clear_old_checkpoints(self, keep: int) -> list[int]:
        """Keep the newest ``keep`` completed checkpoints; delete every stored id older than them."""
        if keep < 1:
            raise ValueError(f"keep must be at least 1 (the restore point), got {keep}")
        with self._lock:
            kept = sorted(self._completed)[-keep:]
            if not kept:
                return []
            cleared = [i for i in self._storage.ids() if i < kept[0] and i not in self._active]
            for old in cleared:
                self._storage.delete(old)
                self._completed.pop(old, None)
        return cleared

    def start_periodic(self, interval_s: float, timeout_s: float) -> None:
        """Run ``checkpoint()`` every ``interval_s`` on a thread, each attempt bounded by ``timeout_s``."""
        with self._lock:
            if self._periodic is not None:
                raise CheckpointError("periodic checkpointing is already running")
            self._periodic = _PeriodicCheckpointer(self, interval_s, timeout_s)
        self._periodic.start()

    def stop_periodic(self) -> None:
        """Stop periodic checkpointing; waits for the running attempt up to its timeout."""
        with self._lock:
            periodic, self._periodic = self._periodic, None
        if periodic is not None:
            periodic.stop()

    def _run_checkpoint(self, checkpoint_id: int, extra: Mapping[str, str] | None = None) -> CheckpointMetadata:
        try:
            metadata = self.trigger_checkpoint(checkpoint_id, extra)
            self.persist(checkpoint_id)
            self.complete_checkpoint(checkpoint_id, success=True)
        except CheckpointError:
            self.complete_checkpoint(checkpoint_id, success=False)
            raise
        return metadata

    def _check_usable(self, checkpoint_id: int) -> None:
        if checkpoint_id > self._ids.highest_reserved():
            raise CheckpointError(f"checkpoint id {checkpoint_id} was never reserved in {self._ids.path}")
        if checkpoint_id in self._active or checkpoint_id in self._completed or checkpoint_id in self._abandoned:
            raise CheckpointError(f"checkpoint id {checkpoint_id} was used already; ids are never reused")

    def _complete_successfully(self, checkpoint_id: int) -> None:
        capture = self._active.get(checkpoint_id)
        if capture is None:
            raise CheckpointError(f"checkpoint {checkpoint_id} is not active, it cannot complete")
        if not capture.persisted:
            raise CheckpointError(f"checkpoint {checkpoint_id} was not persisted, it cannot complete successfully")
        del self._active[checkpoint_id]
        self._completed[checkpoint_id] = capture.metadata
        log.info(
            "checkpoint completed",
            extra={"checkpoint_id": checkpoint_id, "total_bytes": capture.metadata.total_bytes,
                   "operators": capture.metadata.operators},
        )

    def _fail(self, checkpoint_id: int) -> None:
        if checkpoint_id in self._completed:
            raise CheckpointError(f"checkpoint {checkpoint_id} completed successfully already, it cannot fail")
        self._active.pop(checkpoint_id, None)
        first_failure = checkpoint_id not in self._abandoned
        self._abandoned.add(checkpoint_id)
        self._storage.delete(checkpoint_id)
        if first_failure:
            self._failed_count += 1
            log.warning("checkpoint failed", extra={"checkpoint_id": checkpoint_id})

    def _restore(self, stored: StoredCheckpoint) -> CheckpointMetadata:
        checkpoint_id = stored.metadata.checkpoint_id
        with self._lock:
            operators = dict(self._operators)
            unregistered = sorted(set(stored.blobs) - set(operators))
            missing = sorted(set(operators) - set(stored.blobs))
            if unregistered or missing:
                raise CheckpointStateMismatch(
                    f"checkpoint {checkpoint_id} in {self._storage.path_of(checkpoint_id)}: "
                    f"state for unregistered operators {unregistered}, no state for registered operators {missing}"
                )
            for name, state in operators.items():
                try:
                    state.restore(stored.blobs[name])
                except Exception as error:
                    raise CheckpointRestoreFailed(
                        f"operator {name!r} failed to restore checkpoint {checkpoint_id}: {error!r}"
                    ) from error
            self._completed[checkpoint_id] = stored.metadata
        log.info(
            "checkpoint restored", extra={"checkpoint_id": checkpoint_id, "total_bytes": stored.metadata.total_bytes}
        )
        return stored.metadata

    def _record_outcome(self, outcome: CheckpointOutcome) -> None:
        with self._lock:
            self._outcomes.append(outcome)

    def _fail_unless_completed(self, checkpoint_id: int) -> OutcomeStatus:
        """Fail a timed-out attempt; if it completed in the meantime, it did so with durable state."""
        with self._lock:
            if checkpoint_id in self._completed:
                return "completed"
            self._fail(checkpoint_id)
            return "timed_out"


def _capture(checkpoint_id: int, operators: Mapping[str, OperatorState]) -> dict[str, bytes]:
    blobs = {}
    for name, state in operators.items():
        try:
            blob = state.snapshot()
        except Exception as error:
            log.warning("operator snapshot failed", extra={"checkpoint_id": checkpoint_id, "operator": name})
            raise CheckpointCaptureFailed(
                f"operator {name!r} failed to snapshot for checkpoint {checkpoint_id}: {error!r}"
            ) from error
        if not isinstance(blob, bytes | bytearray | memoryview):
            raise CheckpointCaptureFailed(
                f"operator {name!r} returned {type(blob).__name__} from snapshot for checkpoint {checkpoint_id}, "
                "expected bytes"
            )
        blobs[name] = bytes(blob)
    return blobs


class _PeriodicCheckpointer:
    """Runs standalone checkpoints on a timer; each attempt runs on its own thread so it can time out.

    A Python thread cannot be killed: a timed-out attempt is failed at once (so it can never become
    active, persisted or completed) and left to finish in the background; while it still runs, further
    attempts are recorded as ``skipped`` instead of piling up threads.
    """

    def __init__(self, coordinator: CheckpointCoordinator, interval_s: float, timeout_s: float) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError(f"interval_s and timeout_s must be positive, got {interval_s} and {timeout_s}")
        self._coordinator = coordinator
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="epochline-checkpoints", daemon=True)
        self._attempt: threading.Thread | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stopping.wait(self._interval_s):
            self._coordinator._record_outcome(self._attempt_once())

    def _attempt_once(self) -> CheckpointOutcome:
        started = time.monotonic()
        if self._attempt is not None and self._attempt.is_alive():
            return CheckpointOutcome(None, "skipped", 0.0, "the previous attempt is still running")
        try:
            checkpoint_id = self._coordinator.reserve_id()
        except CheckpointError as error:
            return CheckpointOutcome(None, "failed", time.monotonic() - started, str(error))
        errors: list[BaseException] = []
        self._attempt = threading.Thread(
            target=self._run, args=(checkpoint_id, errors), name=f"epochline-checkpoint-{checkpoint_id}", daemon=True
        )
        self._attempt.start()
        self._attempt.join(self._timeout_s)
        duration = time.monotonic() - started
        if self._attempt.is_alive():
            status = self._coordinator._fail_unless_completed(checkpoint_id)
            reason = None if status == "completed" else f"no durable state within {self._timeout_s} s"
            return CheckpointOutcome(checkpoint_id, status, duration, reason)
        if errors:
            return CheckpointOutcome(checkpoint_id, "failed", duration, str(errors[0]))
        return CheckpointOutcome(checkpoint_id, "completed", duration)

    def _run(self, checkpoint_id: int, errors: list[BaseException]) -> None:
        try:
            self._coordinator._run_checkpoint(checkpoint_id)
        except Exception as error:  # noqa: BLE001 - the thread boundary: every failure becomes an outcome
            errors.append(error)
