"""``CheckpointCoordinator``: the one seam every piece of operator state is checkpointed and restored through.

Operators register their state once (``register_operator``). A checkpoint then goes: ``trigger_checkpoint``
reserves its id durably (``engine.state.CheckpointIdLog``: never handed out again, also across processes,
even when the attempt fails); ``capture_checkpoint`` snapshots every registered operator and hands the
pieces to the storage; ``complete_checkpoint(id, success)`` makes it count or drops it. ``checkpoint()``
does all three in one call. A snapshot that raises fails the checkpoint: nothing is completed, the error is
raised to the caller, and ``completed_count`` and ``latest_checkpoint`` do not move.

Two kinds of state register:

- an ``OperatorState`` (``snapshot()``/``restore(snapshot)``): one piece per checkpoint, e.g. a user's own
  operator;
- an ``engine.state.KeyedState``: one piece per source partition whose state changed, so a partition's state
  moves with the partition (the runtime's windows). Partitions are restored when they arrive
  (``restore_partitions``); ``restore_checkpoint`` restores those a keyed operator holds.

Where the pieces go is the ``CheckpointStorage``'s business (``engine.state.storage``): local files
(``FileCheckpointStorage``, the default) or, in the runtime, the changelog topics inside the epoch's Kafka
transaction (``KafkaChangelogStorage``), where the loop completes the checkpoint only after the
transaction committed (``engine.checkpoint.pipeline``). When a checkpoint is reported complete is thus
exactly when the storage says it is durable.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Self

from engine.state import CheckpointError, CheckpointIdLog, KeyedState
from engine.state.storage import CheckpointStorage, FileCheckpointStorage, StateKey

log = logging.getLogger(__name__)

ID_LOG_NAME = "ids.log"
"""The id log's file name in ``CheckpointCoordinatorConfig.storage_path``."""
DEFAULT_STORAGE_DIR = "checkpoints"
"""Where ``CheckpointCoordinator.new`` keeps checkpoints: a directory beside the id log."""


class OperatorState(Protocol):
    """State an operator keeps whole: what a checkpoint captures and a restore puts back."""

    def snapshot(self) -> bytes:
        """The state as bytes; may raise, which fails the checkpoint."""
        ...

    def restore(self, snapshot: bytes | None) -> None:
        """Replace the state with ``snapshot`` (None: the checkpoint holds nothing of this operator)."""
        ...


class CheckpointFailed(CheckpointError):
    """A checkpoint could not be taken; it was not completed and its id stays burned."""

    def __init__(self, checkpoint_id: int, reason: str) -> None:
        super().__init__(f"checkpoint {checkpoint_id} failed: {reason}")
        self.checkpoint_id = checkpoint_id


class SnapshotFailed(CheckpointFailed):
    """An operator's snapshot raised; ``operator`` names it."""

    def __init__(self, checkpoint_id: int, operator: str, error: BaseException) -> None:
        super().__init__(checkpoint_id, f"the snapshot of operator {operator!r} raised {error!r}")
        self.operator = operator


class UnknownCheckpoint(CheckpointError):
    """The id is not an active checkpoint of this coordinator (never triggered, or already ended)."""


class OperatorAlreadyRegistered(CheckpointError):
    """Two operators under one name would overwrite each other's state in every checkpoint."""


@dataclass(frozen=True)
class CheckpointMetadata:
    """A triggered checkpoint: its durably reserved id and when it was triggered (Unix seconds)."""

    checkpoint_id: int
    triggered_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class CheckpointCoordinatorConfig:
    """A coordinator with file storage: checkpoints and the id log in ``storage_path``."""

    storage_path: Path


@dataclass(frozen=True)
class RestoredOperator:
    """What ``restore_partitions`` put back into one keyed operator."""

    size_bytes: int
    seconds: float


class PeriodicCheckpointing:
    """A background thread taking a checkpoint every ``interval`` seconds until ``stop()``.

    A failed checkpoint (a snapshot that raised, the storage or the id log failing) is logged and kept in
    ``failures``; the next one is tried at the next interval.
    """

    def __init__(self, coordinator: CheckpointCoordinator, interval: float) -> None:
        if interval <= 0:
            raise ValueError(f"the checkpoint interval must be positive, got {interval}")
        self._coordinator = coordinator
        self._interval = interval
        self._stopped = threading.Event()
        self.failures: list[CheckpointError] = []
        self._thread = threading.Thread(target=self._run, name="periodic-checkpoints", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """No checkpoint starts after this call; waits (up to ``timeout``, None: for ever) for the one in
        progress to end."""
        self._stopped.set()
        self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            try:
                self._coordinator.checkpoint()
            except CheckpointError as failure:
                log.error("periodic checkpoint failed", extra={"error": str(failure)})
                self.failures.append(failure)


class CheckpointCoordinator:
    """Captures every registered operator into a checkpoint, persists it, completes it, restores from it.

    Thread-safe: one lock orders registration, checkpoints and restores (periodic checkpointing runs on a
    thread of its own). Registered states are called under that lock; they must not be mutated by another
    thread meanwhile.
    """

    def __init__(self, ids: CheckpointIdLog, storage: CheckpointStorage) -> None:
        self._ids = ids
        self._storage = storage
        self._operators: dict[str, OperatorState | KeyedState] = {}
        self._active: dict[int, CheckpointMetadata] = {}
        self._failed: set[int] = set()
        self._lock = threading.RLock()

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def new(cls, ids: CheckpointIdLog) -> CheckpointCoordinator:
        """Ids reserved in ``ids``; checkpoints as files in a ``checkpoints`` directory beside it."""
        return cls(ids, FileCheckpointStorage(ids.path.parent / DEFAULT_STORAGE_DIR))

    @classmethod
    def from_config(cls, config: CheckpointCoordinatorConfig) -> CheckpointCoordinator:
        """Checkpoints as files in ``config.storage_path``, ids in its ``ids.log``: a new process given the
        same path restores what an earlier one completed and reserves ids above all it reserved."""
        return cls(CheckpointIdLog(config.storage_path / ID_LOG_NAME), FileCheckpointStorage(config.storage_path))

    def with_storage(self, storage: CheckpointStorage) -> Self:
        """This coordinator, keeping checkpoints in ``storage`` from now on (before the first checkpoint)."""
        with self._lock:
            if self._active:
                raise CheckpointError("the storage cannot change while a checkpoint is active")
            self._storage = storage
            return self

    @property
    def storage(self) -> CheckpointStorage:
        return self._storage

    # -- operators ---------------------------------------------------------------------------------
    def register_operator(self, name: str, state: OperatorState | KeyedState) -> None:
        """Include ``state`` in every checkpoint from now on, under ``name`` (unique)."""
        with self._lock:
            if name in self._operators:
                raise OperatorAlreadyRegistered(f"an operator named {name!r} is already registered")
            self._operators[name] = state

    @property
    def operator_count(self) -> int:
        return len(self._operators)

    # -- checkpoints -------------------------------------------------------------------------------
    def checkpoint(self) -> int:
        """Trigger, capture, persist and complete one checkpoint; its id once it is durably complete.
        Raises ``CheckpointFailed`` (after failing the checkpoint) when any step does not succeed."""
        with self._lock:
            checkpoint_id = self.trigger_checkpoint().checkpoint_id
            try:
                self.capture_checkpoint(checkpoint_id)
                self.complete_checkpoint(checkpoint_id, success=True)
            except CheckpointFailed:
                raise
            except (OSError, CheckpointError) as error:  # the storage's: not written, or not completed
                raise CheckpointFailed(checkpoint_id, f"the storage failed: {error}") from error
            return checkpoint_id

    def trigger_checkpoint(self) -> CheckpointMetadata:
        """Reserve the next id durably and make it active; nothing is captured yet."""
        with self._lock:
            metadata = CheckpointMetadata(self._ids.reserve())
            self._active[metadata.checkpoint_id] = metadata
            return metadata

    def capture_checkpoint(self, checkpoint_id: int) -> int:
        """Snapshot every registered operator (a keyed one: its changed partitions) and persist the pieces
        under the active ``checkpoint_id``; the bytes persisted. Not complete yet. On any failure the
        checkpoint is failed first (``SnapshotFailed`` for a snapshot, else the storage's error)."""
        with self._lock:
            self._require_active(checkpoint_id)
            try:
                size = self._storage.persist(checkpoint_id, self._capture(checkpoint_id))
            except BaseException:
                self.complete_checkpoint(checkpoint_id, success=False)
                raise
            for state in self._keyed_states().values():
                state.clear_changed()
            return size

    def complete_checkpoint(self, checkpoint_id: int, success: bool) -> None:
        """End an active checkpoint: ``success`` makes the storage complete it (it counts from then on),
        otherwise it is discarded. Failing a checkpoint that already failed does nothing (a failed capture
        ends its checkpoint itself)."""
        with self._lock:
            if not success and checkpoint_id in self._failed:
                return
            self._require_active(checkpoint_id)
            del self._active[checkpoint_id]
            if not success:
                self._failed.add(checkpoint_id)
                self._storage.discard(checkpoint_id)
                return
            try:
                self._storage.complete(checkpoint_id)
            except BaseException:
                self._failed.add(checkpoint_id)
                self._storage.discard(checkpoint_id)
                raise

    def _capture(self, checkpoint_id: int) -> dict[StateKey, bytes]:
        pieces: dict[StateKey, bytes] = {}
        for name, state in self._operators.items():
            try:
                if isinstance(state, KeyedState):
                    pieces.update({StateKey(name, partition): state.snapshot_partition(partition)
                                   for partition in sorted(state.changed_partitions())})
                else:
                    pieces[StateKey(name)] = state.snapshot()
            except Exception as error:
                raise SnapshotFailed(checkpoint_id, name, error) from error
        return pieces

    def _require_active(self, checkpoint_id: int) -> None:
        if checkpoint_id not in self._active:
            raise UnknownCheckpoint(f"checkpoint {checkpoint_id} is not active")

    @property
    def active_count(self) -> int:
        return len(self._active)

    @property
    def active_metadata(self) -> list[CheckpointMetadata]:
        """The active checkpoints, oldest first."""
        with self._lock:
            return [self._active[checkpoint_id] for checkpoint_id in sorted(self._active)]

    @property
    def completed_count(self) -> int:
        """How many completed checkpoints the storage holds."""
        return len(self._storage.completed())

    @property
    def latest_checkpoint(self) -> int | None:
        """The newest completed checkpoint the storage holds; None before the first."""
        return max(self._storage.completed(), default=None)

    def clear_old_checkpoints(self, keep: int) -> list[int]:
        """Delete every completed checkpoint but the newest ``keep``; the ids deleted."""
        if keep < 0:
            raise ValueError(f"keep must not be negative, got {keep}")
        with self._lock:
            completed = self._storage.completed()
            old = completed[:max(len(completed) - keep, 0)]
            for checkpoint_id in old:
                self._storage.remove(checkpoint_id)
            return old

    def start_periodic_checkpointing(self, interval: float) -> PeriodicCheckpointing:
        """Take a checkpoint every ``interval`` seconds on a background thread; ``stop()`` the handle."""
        return PeriodicCheckpointing(self, interval)

    # -- restore -----------------------------------------------------------------------------------
    def restore_checkpoint(self, checkpoint_id: int) -> None:
        """Put every registered operator back to completed checkpoint ``checkpoint_id``: an
        ``OperatorState`` whole, a keyed operator on the partitions it holds. Raises
        ``engine.state.storage.CheckpointNotFound`` for an id that never completed."""
        with self._lock:
            keys = [StateKey(name) for name, state in self._operators.items() if not isinstance(state, KeyedState)]
            keys += [StateKey(name, partition) for name, state in self._keyed_states().items()
                     for partition in sorted(state.partitions())]
            loaded = self._storage.load(checkpoint_id, keys)
            for key in keys:
                self._restore_piece(key, loaded[key])

    def restore_partitions(self, partitions: Collection[int]) -> dict[str, RestoredOperator]:
        """Give every keyed operator these source partitions' state from the newest completed checkpoint
        (partitions just assigned, or rewound after an abandoned epoch); per operator, what was restored."""
        restored = {}
        with self._lock:
            for name in self._keyed_states():
                started = time.monotonic()
                keys = [StateKey(name, partition) for partition in partitions]
                loaded = self._storage.load(None, keys)
                for key in keys:
                    self._restore_piece(key, loaded[key])
                restored[name] = RestoredOperator(sum(len(data or b"") for data in loaded.values()),
                                                  time.monotonic() - started)
        return restored

    def _restore_piece(self, key: StateKey, data: bytes | None) -> None:
        state = self._operators[key.operator]
        if isinstance(state, KeyedState):
            assert key.partition is not None
            state.restore_partition(key.partition, data)
        else:
            state.restore(data)

    def _keyed_states(self) -> dict[str, KeyedState]:
        return {name: state for name, state in self._operators.items() if isinstance(state, KeyedState)}

