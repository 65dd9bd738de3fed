"""Checkpoint ids that are never reused: each is appended to a log and fsynced before it is handed out."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from engine.state.errors import CheckpointCorrupted, CheckpointPersistFailed
from engine.state.files import write_atomically

log = logging.getLogger(__name__)


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
