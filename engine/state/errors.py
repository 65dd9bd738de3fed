"""Every way a checkpoint can fail, as one hierarchy under ``CheckpointError``."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(RuntimeError):
    """Base class of every checkpoint failure."""


class CheckpointCaptureFailed(CheckpointError):
    """An operator's ``snapshot()`` raised (or returned no bytes); no state was captured."""


class CheckpointPersistFailed(CheckpointError):
    """Writing checkpoint state or an id reservation to disk failed (disk full, permissions, ...)."""


class CheckpointCorrupted(CheckpointError):
    """A checkpoint file (or the id log) is truncated, fails its checksum or cannot be parsed."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"checkpoint file {path} is corrupted: {reason}")
        self.path = path
        self.reason = reason


class CheckpointNotFound(CheckpointError):
    """No checkpoint file exists for the requested id."""


class CheckpointStateMismatch(CheckpointError):
    """Stored blobs and registered operators do not match by name, so restoring would lose state."""


class CheckpointRestoreFailed(CheckpointError):
    """An operator's ``restore()`` raised while loading a checkpoint."""


class StateDirLocked(CheckpointError):
    """Another live process owns the checkpoint directory."""
