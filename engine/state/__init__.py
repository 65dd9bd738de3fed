"""What an instance keeps of a checkpoint, and where (DESIGN.md, steps 1 and 4, and group mode).

Kafka alone says what committed: a partition's offset and event time are in the group's committed offsets'
metadata, its keyed operator state in the operator's compacted changelog topic, written in the epoch's
transaction. Locally, in the instance's state directory, only what must never be shared or lost is kept:

- ``ids.CheckpointIdLog``: checkpoint ids that are never reused. An id is appended to ``ids.log`` and
  fsynced *before* it is returned, so after a crash the next id is above everything ever handed out; an
  abandoned id stays burned. A crash in the middle of an append (torn last line) burns the id being written.
- ``lock.StateDirLock``: one live process per instance state directory (``owner.lock``).
- ``keyed.KeyedState``: state kept per source partition (snapshot, restore, drop one partition), so that a
  partition's state moves with the partition through its changelog.
- ``changelog``: the changelog topics (``<connector>-<operator>-changelog``) keyed state is written to and
  restored from.
- ``storage``: the ``CheckpointStorage`` protocol a checkpoint's operator state is written through (by
  ``engine.checkpoint.CheckpointCoordinator``) and ``FileCheckpointStorage``, its durable local files;
  ``changelog.KafkaChangelogStorage`` is the runtime's, on the changelog topics.
- ``files.write_atomically``: a small local file replaced whole and durably (temp file, fsync, rename,
  fsync dir), for the id log, the generated instance name and batch plans.

Failures of the id log and the lock are subclasses of ``errors.CheckpointError``. The protocol that decides
when all of this runs is ``engine.checkpoint``.
"""

from engine.state.errors import CheckpointCorrupted, CheckpointError, CheckpointPersistFailed, StateDirLocked
from engine.state.files import write_atomically
from engine.state.ids import CheckpointIdLog
from engine.state.keyed import KeyedState
from engine.state.lock import StateDirLock
from engine.state.storage import (
    CheckpointNotFound,
    CheckpointStorage,
    FileCheckpointStorage,
    StateKey,
    StoredCheckpointCorrupted,
)

__all__ = [
    "CheckpointCorrupted",
    "CheckpointError",
    "CheckpointIdLog",
    "CheckpointNotFound",
    "CheckpointPersistFailed",
    "CheckpointStorage",
    "FileCheckpointStorage",
    "KeyedState",
    "StateDirLock",
    "StateDirLocked",
    "StateKey",
    "StoredCheckpointCorrupted",
    "write_atomically",
]
