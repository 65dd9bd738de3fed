"""Where a checkpoint's operator state is kept: the ``CheckpointStorage`` protocol and its local file storage.

A checkpoint is a set of *pieces*, each the bytes of one operator's state (``StateKey(operator, None)``) or of
one source partition of a keyed operator (``StateKey(operator, partition)``). A storage takes the pieces of
checkpoint N in two steps, so that it can take part in a larger commit: ``persist`` writes them, not yet
complete; ``complete`` makes N count (or ``discard`` drops it). Only a completed checkpoint is ever loaded.

Two storages implement it:

- ``FileCheckpointStorage`` (here): one file per checkpoint in a local directory, for state that lives with
  one process. Every file holds the whole state (the pieces of N laid over those of the newest completed
  checkpoint), so any completed checkpoint restores alone and old ones can be deleted freely.
- ``engine.state.changelog.KafkaChangelogStorage``: the runtime's, a keyed operator's partitions written to
  its compacted changelog topic inside the epoch's Kafka transaction, so that the commit of that
  transaction is what completes the checkpoint.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import NamedTuple, Protocol

import orjson

from engine.state.errors import CheckpointError
from engine.state.files import fsync_directory, write_atomically

__all__ = [
    "CheckpointNotFound",
    "CheckpointStorage",
    "FileCheckpointStorage",
    "StateKey",
    "StoredCheckpointCorrupted",
]

PENDING_SUFFIX = ".pending"
"""A checkpoint persisted but not (yet) complete: never loaded, removed when discarded."""
COMPLETE_SUFFIX = ".checkpoint"
"""A completed checkpoint: renamed from its pending file, so it appears whole or not at all."""


class StateKey(NamedTuple):
    """One piece of a checkpoint: an operator's whole state (``partition`` None) or one source partition's."""

    operator: str
    partition: int | None = None


class CheckpointNotFound(CheckpointError):
    """The storage holds no completed checkpoint with that id."""


class StoredCheckpointCorrupted(CheckpointError):
    """A stored checkpoint fails its checksum or cannot be parsed: restoring a guess would corrupt state."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"stored checkpoint {path} is corrupted: {reason}")
        self.path = path


class CheckpointStorage(Protocol):
    """Keeps the pieces of each checkpoint; a checkpoint counts only once ``complete`` returned."""

    def persist(self, checkpoint_id: int, pieces: Mapping[StateKey, bytes]) -> int:
        """Write the pieces captured for ``checkpoint_id`` (only those that changed, for a keyed operator);
        not complete yet. Returns the bytes written."""
        ...

    def complete(self, checkpoint_id: int) -> None:
        """Make the persisted ``checkpoint_id`` count: from now on it is loaded and listed."""
        ...

    def discard(self, checkpoint_id: int) -> None:
        """Drop a persisted ``checkpoint_id`` that will never complete (its id stays burned)."""
        ...

    def load(self, checkpoint_id: int | None, keys: Collection[StateKey]) -> dict[StateKey, bytes | None]:
        """Each key's state as of completed checkpoint ``checkpoint_id`` (None: the newest), None for a key
        it holds nothing of. Raises ``CheckpointNotFound`` for an id that never completed."""
        ...

    def completed(self) -> list[int]:
        """The ids of the completed checkpoints held, oldest first."""
        ...

    def remove(self, checkpoint_id: int) -> None:
        """Delete a completed checkpoint (it is older than those kept)."""
        ...


class FileCheckpointStorage:
    """Checkpoints as files in ``directory``, durable once ``complete`` returned, also across processes.

    ``persist`` writes ``<id>.pending`` with ``write_atomically`` (temp file, fsync, rename, fsync of the
    directory); ``complete`` renames it to ``<id>.checkpoint`` and fsyncs the directory. A crash at any
    point leaves either the old set of completed checkpoints or the new one, never a half-written file
    counted as complete; a stale pending file is never loaded. Each file starts with the SHA-256 of the
    rest, checked on every load. The guarantees hold on a local POSIX file system that honours fsync
    (not on a network share that acknowledges early). One process writes a directory at a time.
    """

    def __init__(self, directory: Path) -> None:
        self._directory = Path(directory)

    def persist(self, checkpoint_id: int, pieces: Mapping[StateKey, bytes]) -> int:
        latest = self._latest()
        merged = self._read(latest) if latest is not None else {}
        merged.update(pieces)
        content = _encode(checkpoint_id, merged)
        self._directory.mkdir(parents=True, exist_ok=True)
        write_atomically(self._path(checkpoint_id, PENDING_SUFFIX), [content])
        return len(content)

    def complete(self, checkpoint_id: int) -> None:
        pending = self._path(checkpoint_id, PENDING_SUFFIX)
        if not pending.exists():
            raise CheckpointNotFound(f"checkpoint {checkpoint_id} was not persisted in {self._directory}")
        os.replace(pending, self._path(checkpoint_id, COMPLETE_SUFFIX))
        fsync_directory(self._directory)

    def discard(self, checkpoint_id: int) -> None:
        self._path(checkpoint_id, PENDING_SUFFIX).unlink(missing_ok=True)

    def load(self, checkpoint_id: int | None, keys: Collection[StateKey]) -> dict[StateKey, bytes | None]:
        chosen = self._latest() if checkpoint_id is None else checkpoint_id
        pieces = self._read(chosen) if chosen is not None else {}
        return {key: pieces.get(key) for key in keys}

    def completed(self) -> list[int]:
        if not self._directory.is_dir():
            return []
        return sorted(int(path.stem) for path in self._directory.glob(f"*{COMPLETE_SUFFIX}") if path.stem.isdigit())

    def remove(self, checkpoint_id: int) -> None:
        self._path(checkpoint_id, COMPLETE_SUFFIX).unlink(missing_ok=True)
        fsync_directory(self._directory)

    def _latest(self) -> int | None:
        return max(self.completed(), default=None)

    def _path(self, checkpoint_id: int, suffix: str) -> Path:
        return self._directory / f"{checkpoint_id}{suffix}"

    def _read(self, checkpoint_id: int) -> dict[StateKey, bytes]:
        path = self._path(checkpoint_id, COMPLETE_SUFFIX)
        try:
            content = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointNotFound(f"no completed checkpoint {checkpoint_id} in {self._directory}") from None
        return _decode(path, content)


def _encode(checkpoint_id: int, pieces: Mapping[StateKey, bytes]) -> bytes:
    """``<sha256 hex>\\n<json>``: the JSON names the id and each piece's operator, partition and base64 bytes."""
    body = orjson.dumps({"checkpoint_id": checkpoint_id, "pieces": [
        {"operator": key.operator, "partition": key.partition, "state": base64.b64encode(state).decode("ascii")}
        for key, state in sorted(pieces.items(), key=lambda item: _order(item[0]))
    ]})
    return hashlib.sha256(body).hexdigest().encode("ascii") + b"\n" + body


def _order(key: StateKey) -> tuple[str, int]:
    """Pieces in a stable order, so equal state gives equal files."""
    return key.operator, -1 if key.partition is None else key.partition


def _decode(path: Path, content: bytes) -> dict[StateKey, bytes]:
    digest, newline, body = content.partition(b"\n")
    if not newline or hashlib.sha256(body).hexdigest().encode("ascii") != digest:
        raise StoredCheckpointCorrupted(path, "its checksum does not match its content")
    try:
        document = orjson.loads(body)
        return {StateKey(piece["operator"], piece["partition"]): base64.b64decode(piece["state"], validate=True)
                for piece in document["pieces"]}
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise StoredCheckpointCorrupted(path, f"it cannot be parsed ({error})") from error
