"""Checkpoint files: one checksummed file per checkpoint id, written atomically and durably.

``FileCheckpointStorage`` writes temp file -> fsync -> rename -> fsync of the directory, so a file under its
final name is complete and durable. A sha256 over the whole content is checked on every read; a truncated or
bit-flipped file raises ``CheckpointCorrupted`` naming the file, never returns wrong state.

File format of ``checkpoint-<id>.ckpt``::

    b"EPCKPT01" | u32 big-endian header length | header (JSON of CheckpointMetadata) |
    blobs, concatenated in the order of ``metadata.operators`` | sha256 of everything before (32 bytes)
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson
from pydantic import TypeAdapter, ValidationError

from engine.state.errors import CheckpointCorrupted, CheckpointNotFound, CheckpointPersistFailed

log = logging.getLogger(__name__)

_MAGIC = b"EPCKPT01"
_HEADER_LENGTH = struct.Struct(">I")
_DIGEST_SIZE = hashlib.sha256().digest_size
_FILE_PREFIX = "checkpoint-"
_FILE_SUFFIX = ".ckpt"
_TEMP_SUFFIX = ".tmp"


@dataclass(frozen=True)
class CheckpointMetadata:
    """What a checkpoint holds: ``operators`` maps operator name to its blob size in bytes.

    ``extra`` carries small strings beside the state, e.g. source positions of a standalone run.
    """

    checkpoint_id: int
    created_at: float
    total_bytes: int
    operators: dict[str, int]
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredCheckpoint:
    metadata: CheckpointMetadata
    blobs: dict[str, bytes]


_METADATA_ADAPTER = TypeAdapter(CheckpointMetadata)


def _fsync_directory(directory: Path) -> None:
    """Make a rename or unlink inside ``directory`` durable (POSIX needs the directory itself fsynced)."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_atomically(path: Path, chunks: Iterable[bytes]) -> None:
    """Write ``path`` so that it either keeps its old content or has all of ``chunks``, durably.

    The temp name is derived from ``path``: every writer of a given path is the only one (ids are
    unique, the id log has one owner), so a stale temp file from a crash is simply overwritten.
    Raises ``OSError``; the temp file is removed on failure.
    """
    temporary = path.with_name(f".{path.name}{_TEMP_SUFFIX}")
    try:
        with open(temporary, "wb") as handle:
            handle.writelines(chunks)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        _fsync_directory(path.parent)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


class FileCheckpointStorage:
    """One checksummed file per checkpoint id in ``directory``, written atomically and durably."""

    def __init__(self, directory: Path) -> None:
        self._directory = Path(directory)
        self._directory.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temp_files()

    @property
    def directory(self) -> Path:
        return self._directory

    def path_of(self, checkpoint_id: int) -> Path:
        return self._directory / f"{_FILE_PREFIX}{checkpoint_id:020d}{_FILE_SUFFIX}"

    def write(self, metadata: CheckpointMetadata, blobs: Mapping[str, bytes]) -> None:
        """Durably store ``blobs`` under ``metadata.checkpoint_id``; raises ``CheckpointPersistFailed``."""
        _check_consistent(metadata, blobs)
        header = orjson.dumps(asdict(metadata))
        body = [_MAGIC, _HEADER_LENGTH.pack(len(header)), header, *(blobs[name] for name in metadata.operators)]
        digest = hashlib.sha256()
        for chunk in body:
            digest.update(chunk)
        path = self.path_of(metadata.checkpoint_id)
        try:
            write_atomically(path, [*body, digest.digest()])
        except OSError as error:
            raise CheckpointPersistFailed(
                f"could not write checkpoint {metadata.checkpoint_id} to {path}: {error}"
            ) from error

    def read(self, checkpoint_id: int) -> StoredCheckpoint:
        """Load and verify one checkpoint; raises ``CheckpointNotFound`` or ``CheckpointCorrupted``."""
        path = self.path_of(checkpoint_id)
        try:
            content = path.read_bytes()
        except FileNotFoundError as error:
            raise CheckpointNotFound(f"no checkpoint {checkpoint_id} in {self._directory}") from error
        stored = _decode(path, content)
        if stored.metadata.checkpoint_id != checkpoint_id:
            raise CheckpointCorrupted(path, f"holds checkpoint {stored.metadata.checkpoint_id}, not {checkpoint_id}")
        return stored

    def ids(self) -> list[int]:
        """Ids of the checkpoint files present, ascending (validity is not checked)."""
        found = []
        for path in self._directory.glob(f"{_FILE_PREFIX}*{_FILE_SUFFIX}"):
            digits = path.name.removeprefix(_FILE_PREFIX).removesuffix(_FILE_SUFFIX)
            if digits.isdigit():
                found.append(int(digits))
        return sorted(found)

    def delete(self, checkpoint_id: int) -> None:
        """Remove the file of ``checkpoint_id`` durably; deleting a missing id is a no-op."""
        path = self.path_of(checkpoint_id)
        try:
            path.unlink(missing_ok=True)
            _fsync_directory(self._directory)
        except OSError as error:
            raise CheckpointPersistFailed(f"could not delete checkpoint {checkpoint_id} at {path}: {error}") from error

    def latest_valid(self, at_most: int | None = None) -> StoredCheckpoint | None:
        """The newest readable checkpoint with id <= ``at_most``; corrupted files are skipped with a warning."""
        candidates = [i for i in self.ids() if at_most is None or i <= at_most]
        for checkpoint_id in reversed(candidates):
            try:
                return self.read(checkpoint_id)
            except CheckpointCorrupted as error:
                log.warning(
                    "skipping corrupted checkpoint, falling back to an older one",
                    extra={"checkpoint_id": checkpoint_id, "file": str(error.path), "reason": error.reason},
                )
            except CheckpointNotFound:
                continue  # deleted between listing and reading
        return None

    def _remove_stale_temp_files(self) -> None:
        for stale in self._directory.glob(f".{_FILE_PREFIX}*{_FILE_SUFFIX}{_TEMP_SUFFIX}"):
            log.info("removing unfinished checkpoint write", extra={"file": str(stale)})
            stale.unlink(missing_ok=True)


def _check_consistent(metadata: CheckpointMetadata, blobs: Mapping[str, bytes]) -> None:
    sizes = {name: len(blob) for name, blob in blobs.items()}
    if sizes != metadata.operators or metadata.total_bytes != sum(sizes.values()):
        raise ValueError(
            f"checkpoint {metadata.checkpoint_id}: metadata sizes {metadata.operators} "
            f"(total {metadata.total_bytes}) do not match the blobs {sizes}"
        )


def _decode(path: Path, content: bytes) -> StoredCheckpoint:
    minimum = len(_MAGIC) + _HEADER_LENGTH.size + _DIGEST_SIZE
    if len(content) < minimum:
        raise CheckpointCorrupted(path, f"truncated: {len(content)} bytes, a checkpoint has at least {minimum}")
    if not content.startswith(_MAGIC):
        raise CheckpointCorrupted(path, "not an epochline checkpoint (bad magic bytes)")
    body, digest = content[:-_DIGEST_SIZE], content[-_DIGEST_SIZE:]
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointCorrupted(path, "sha256 checksum mismatch (truncated or modified)")
    view = memoryview(body)
    (header_length,) = _HEADER_LENGTH.unpack_from(view, len(_MAGIC))
    header_start = len(_MAGIC) + _HEADER_LENGTH.size
    blob_start = header_start + header_length
    try:
        metadata = _METADATA_ADAPTER.validate_json(bytes(view[header_start:blob_start]))
    except ValidationError as error:
        raise CheckpointCorrupted(path, f"unparsable header: {error}") from error
    if blob_start + metadata.total_bytes != len(body) or sum(metadata.operators.values()) != metadata.total_bytes:
        raise CheckpointCorrupted(path, "blob sizes in the header do not match the file length")
    blobs = {}
    offset = blob_start
    for name, size in metadata.operators.items():
        blobs[name] = bytes(view[offset : offset + size])
        offset += size
    return StoredCheckpoint(metadata=metadata, blobs=blobs)
