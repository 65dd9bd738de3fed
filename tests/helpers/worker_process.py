"""Workers for the cluster specifications (``engine.testing.start_local_worker``), and waiting on what they say."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from engine.testing import LocalWorker, start_local_worker
from tests.helpers import REPO_ROOT

T = TypeVar("T")


def start_worker(directory: Path, bootstrap: str, cluster: str, name: str, *, token: str | None = None,
                 port: int | None = None, extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 wait_s: float = 60.0) -> LocalWorker:
    """A local worker started from the repository root (so tasks can load ``tests.helpers.transforms``) that
    restarts a failed task after 0.2 s instead of 1 s, so the specifications of failures run quickly."""
    return start_local_worker(directory, bootstrap, cluster, name, token=token, port=port, env=env, wait_s=wait_s,
                              cwd=REPO_ROOT, extra_args=("--task-backoff", "0.2", *extra_args))


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 60.0, every_s: float = 0.5) -> T:
    """``probe()``'s first truthy answer; an AssertionError naming ``what`` (and the last answer) after the timeout."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last answer: {last!r}")
