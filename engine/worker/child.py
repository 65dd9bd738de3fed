"""The contract between a worker and the ``epochline run`` child processes it supervises.

Two environment variables, set by the worker only: ``EPOCHLINE_PARENT_PID`` makes the child ask Linux to
kill it when the worker dies (``PR_SET_PDEATHSIG``), so a worker killed with SIGKILL leaves no task behind
that would keep its partitions and fence its successor; ``EPOCHLINE_ERROR_FILE`` is where the child writes why
it failed (exception class, message, trace) as JSON, which the worker turns into the task's FAILED status.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import traceback
from pathlib import Path

import orjson

PARENT_PID_ENV = "EPOCHLINE_PARENT_PID"
ERROR_FILE_ENV = "EPOCHLINE_ERROR_FILE"
_PR_SET_PDEATHSIG = 1


class ParentGone(RuntimeError):
    """The worker that started this task exited before the task could tie its life to it."""


def die_with_parent() -> None:
    """When started by a worker: be killed with it. Checks the parent after arming, since it may have died
    between the fork and here (then the signal would never come)."""
    expected = os.environ.get(PARENT_PID_ENV)
    if not expected:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != int(expected):
        raise ParentGone(f"the worker (pid {expected}) exited before this task started")


def report_failure(error: BaseException) -> None:
    """Write ``error`` to the worker's error file, when there is one; never fails the exit it reports."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    report = {"type": type(error).__name__, "message": str(error),
              "trace": "".join(traceback.format_exception(error))}
    with contextlib.suppress(OSError):
        Path(path).write_bytes(orjson.dumps(report))
