"""One live process per instance state directory."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from engine.state.errors import StateDirLocked


class StateDirLock:
    """An exclusive ``flock`` on ``<dir>/owner.lock``: one live process per instance state directory.

    Why: when a restarted instance takes over from its previous incarnation (it fences it through the
    Kafka transactional id), the old process may still be running and reserving ids in the directory's
    checkpoint id log. The new one fences first, then waits here until the old one has exited (the kernel
    drops the lock with the process, even on SIGKILL), and only then opens its sources.
    """

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / "owner.lock"
        self._handle: IO[str] | None = None

    def acquire(self, timeout_s: float, interrupted: Callable[[], bool] = lambda: False) -> None:
        """Wait up to ``timeout_s`` for the directory; ``interrupted`` (a stop signal) ends the wait early,
        without the lock."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")  # noqa: SIM115 - held for as long as this process owns the dir
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if interrupted():
                    handle.close()
                    return
                if time.monotonic() > deadline:
                    handle.close()
                    raise StateDirLocked(
                        f"state directory {self.path.parent} is still owned by another process "
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
