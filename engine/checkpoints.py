"""The storage side of epochline's checkpoint protocol (see /work/shared/DESIGN.md).

Three pieces, each with one guarantee:

- ``CheckpointIdLog`` hands out checkpoint ids that are never reused. An id is appended to a file and
  fsynced *before* it is returned, so after a crash the next id is above everything ever handed out;
  an abandoned id stays burned. A crash in the middle of an append (torn last line) burns the id that
  was being written rather than guessing.
- ``FileCheckpointStorage`` keeps one file per checkpoint id, written as temp file -> fsync -> rename ->
  fsync of the directory, so a file under its final name is complete and durable. A sha256 over the
  whole content is checked on every read; a truncated or bit-flipped file raises ``CheckpointCorrupted``
  naming the file, never returns wrong state.
- ``CheckpointCoordinator`` captures every registered operator's snapshot under one id, persists it,
  and reports success only for an id whose state was captured *and* durably written. Recovery restores
  exactly the id Kafka says committed (``restore_checkpoint``) and deletes the state of ids above it
  (``discard_above``).

File format of ``checkpoint-<id>.ckpt``::

    b"EPCKPT01" | u32 big-endian header length | header (JSON of CheckpointMetadata) |
    blobs, concatenated in the order of ``metadata.operators`` | sha256 of everything before (32 bytes)
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

log = logging.getLogger(__name__)

_MAGIC = b"EPCKPT01"
_HEADER_LENGTH = struct.Struct(">I")
_DIGEST_SIZE = hashlib.sha256().digest_size
_FILE_PREFIX = "checkpoint-"
_FILE_SUFFIX = ".ckpt"
_TEMP_SUFFIX = ".tmp"


class OperatorState(Protocol):
    """State an operator hands to the checkpoint and takes back on recovery."""

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


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


class CheckpointIdLog:
    """Durable reservation of checkpoint ids: each id is appended and fsynced before it is returned.

    Ids are never reused, also across crashes: reopening the log continues above the highest id ever
    written. A torn last line (a crash mid-append) is treated as a reservation of the id that was being
    written, so it is burned too. Reopening compacts the file to its highest id. One process owns a log;
    ``reserve`` is thread-safe within it.
    """

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        self._lock = threading.Lock()
        self._highest = self._recover()

    @property
    def path(self) -> Path:
        return self._path

    def reserve(self) -> int:
        """Return a new id above every id ever reserved in this log, after it is on disk."""
        with self._lock:
            candidate = self._highest + 1
            self._append(candidate)
            return candidate

    def highest_reserved(self) -> int:
        """The highest id ever reserved; 0 when none."""
        with self._lock:
            return self._highest

    def advance_to(self, checkpoint_id: int) -> None:
        """Record ``checkpoint_id`` as reserved if it is above everything here (e.g. the id Kafka names).

        Recovery uses it so the next id is above every id known anywhere, even if the log was lost.
        """
        with self._lock:
            if checkpoint_id > self._highest:
                self._append(checkpoint_id)

    def _append(self, checkpoint_id: int) -> None:
        # Burned even if the write fails: a partial line may be on disk, and a partial digit string
        # followed by the next full line reads as a larger number, never a smaller one.
        self._highest = checkpoint_id
        try:
            with open(self._path, "ab") as handle:
                handle.write(f"{checkpoint_id}\n".encode())
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as error:
            raise CheckpointPersistFailed(
                f"could not reserve checkpoint id {checkpoint_id} in {self._path}: {error}"
            ) from error

    def _recover(self) -> int:
        try:
            content = self._path.read_bytes()
        except FileNotFoundError:
            self._create_empty()
            return 0
        complete, newline, torn_tail = content.rpartition(b"\n")
        reserved = self._parse_lines(complete.split(b"\n") if newline else [])
        highest = max(reserved, default=0)
        if torn_tail:
            highest += 1
            log.warning(
                "torn last line in checkpoint id log, burning the id it was writing",
                extra={"file": str(self._path), "torn_bytes": len(torn_tail), "burned_id": highest},
            )
        if torn_tail or len(reserved) > 1:
            self._compact(highest)
        return highest

    def _parse_lines(self, lines: list[bytes]) -> list[int]:
        """Every complete line must be an id: guessing past a bad one could hand out an id again."""
        reserved = []
        for number, line in enumerate(lines, start=1):
            if not line.isdigit():
                raise CheckpointCorrupted(self._path, f"line {number} is not a checkpoint id: {line[:40]!r}")
            reserved.append(int(line))
        return reserved

    def _create_empty(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        try:
            write_atomically(self._path, [])
        except OSError as error:
            raise CheckpointPersistFailed(f"could not create checkpoint id log {self._path}: {error}") from error

    def _compact(self, highest: int) -> None:
        try:
            write_atomically(self._path, [f"{highest}\n".encode()])
        except OSError as error:
            raise CheckpointPersistFailed(f"could not compact checkpoint id log {self._path}: {error}") from error


class StateDirLocked(CheckpointError):
    """Another live process owns the checkpoint directory."""


class StateDirLock:
    """An exclusive ``flock`` on ``<dir>/owner.lock``: one live process per checkpoint directory.

    Why: when a second instance of a connector takes over (it fences the first through the Kafka
    transactional id), the first may still be writing a checkpoint file into the shared directory.
    The new instance fences first, then waits here until the old one has exited (the kernel drops the
    lock with the process, even on SIGKILL), and only then reads state.
    """

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / "owner.lock"
        self._handle: Any = None

    def acquire(self, timeout_s: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.close()
                    raise StateDirLocked(
                        f"checkpoint directory {self.path.parent} is still owned by another process "
                        f"(pid {self._owner() or 'unknown'}) after {timeout_s:.0f}s") from None
                time.sleep(0.1)
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self._handle = handle

    def _owner(self) -> str:
        try:
            return self.path.read_text().strip()
        except OSError:
            return ""

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None


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
