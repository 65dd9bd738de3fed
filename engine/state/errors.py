"""What the local state of an instance can fail with, under ``CheckpointError``: its id log and its lock."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(RuntimeError):
    """Base class of every failure of an instance's local checkpoint state."""


class CheckpointPersistFailed(CheckpointError):
    """Writing the checkpoint id log to disk failed (disk full, permissions, ...)."""


class CheckpointCorrupted(CheckpointError):
    """The checkpoint id log has a complete line that is not an id: guessing past it could reuse an id."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"checkpoint id log {path} is corrupted: {reason}")
        self.path = path
        self.reason = reason


class StateDirLocked(CheckpointError):
    """Another live process owns the instance's state directory."""
