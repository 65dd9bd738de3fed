"""What a checkpoint stores, and the guarantees each piece gives (DESIGN.md, steps 1, 4 and 6):

- ``ids.CheckpointIdLog``: checkpoint ids that are never reused. An id is appended to a file and fsynced
  *before* it is returned, so after a crash the next id is above everything ever handed out; an abandoned
  id stays burned. A crash in the middle of an append (torn last line) burns the id being written.
- ``files.FileCheckpointStorage``: one checksummed file per id (temp file, fsync, rename, fsync dir); a
  truncated or bit-flipped file raises ``CheckpointCorrupted`` naming the file, never returns wrong state.
- ``lock.StateDirLock``: one live process per checkpoint directory.
- ``snapshots.CheckpointCoordinator``: captures every registered ``OperatorState`` under one id,
  persists it, and reports success only for an id captured *and* durably written.
- ``keyed.KeyedState``: state kept per source partition (snapshot, restore, drop one partition), so that in
  group mode a partition's state moves with the partition through its changelog (DESIGN.md, group mode).

The protocol that decides when these run is ``engine.checkpoint``.
"""

from engine.state.errors import (
    CheckpointCaptureFailed,
    CheckpointCorrupted,
    CheckpointError,
    CheckpointNotFound,
    CheckpointPersistFailed,
    CheckpointRestoreFailed,
    CheckpointStateMismatch,
    StateDirLocked,
)
from engine.state.files import CheckpointMetadata, FileCheckpointStorage, StoredCheckpoint, write_atomically
from engine.state.ids import CheckpointIdLog
from engine.state.keyed import KeyedState
from engine.state.lock import StateDirLock
from engine.state.snapshots import (
    CheckpointCoordinator,
    CheckpointOutcome,
    CheckpointSettings,
    OperatorState,
    OutcomeStatus,
)

__all__ = [
    "CheckpointCaptureFailed",
    "CheckpointCoordinator",
    "CheckpointCorrupted",
    "CheckpointError",
    "CheckpointIdLog",
    "CheckpointMetadata",
    "CheckpointNotFound",
    "CheckpointOutcome",
    "CheckpointPersistFailed",
    "CheckpointRestoreFailed",
    "CheckpointSettings",
    "CheckpointStateMismatch",
    "FileCheckpointStorage",
    "KeyedState",
    "OperatorState",
    "OutcomeStatus",
    "StateDirLock",
    "StateDirLocked",
    "StoredCheckpoint",
    "write_atomically",
]
