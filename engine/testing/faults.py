"""Test-only fault injection: crash the process at a named moment of the checkpoint protocol.

Why it exists: the exactly-once claim has to hold when a SIGKILL lands at the worst moment (after the
epoch's records are flushed and its offsets sent, before the commit). Random kills rarely hit that
window, so crash tests set ``EPOCHLINE_TEST_FAULTS="between-flush-and-commit:0.3"`` (moment:probability,
comma-separated) and the process kills itself there with that probability; ``moment:pause=2`` stalls
there instead (a commit in flight while the test changes the group). With an external sink (two-phase
commit) there are four more moments: ``before-prepare``, ``after-prepare`` (prepared, before the Kafka
commit), ``before-finish`` (Kafka committed, the sink not yet) and ``during-recover`` (a start's recovery:
the sink has resolved what the previous incarnation left, the run has read nothing yet, so the next start
recovers again from what this one did). The CLI loads this module only
when the variable is set and passes ``crash_point_from(spec)`` down as the runtime's ``crash_point``; the
runtime itself never imports it.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


def _parse(spec: str) -> dict[str, tuple[float, float]]:
    """``moment:probability`` (a crash) or ``moment:pause=SECONDS`` (a stall), comma-separated."""
    moments: dict[str, tuple[float, float]] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, action = part.partition(":")
        if action.startswith("pause="):
            moments[name] = (0.0, float(action.removeprefix("pause=")))
        else:
            moments[name] = (float(action or 1.0), 0.0)
    return moments


def crash_point_from(spec: str) -> Callable[[str], None]:
    """A crash point that SIGKILLs this process at each moment of ``spec`` with its probability, or stalls
    there for the given seconds (a commit in flight while a test changes the group around it)."""
    moments = _parse(spec)

    def maybe_crash(moment: str) -> None:
        probability, pause_s = moments.get(moment, (0.0, 0.0))
        if pause_s:
            log.warning("commit paused", extra={"moment": moment, "seconds": pause_s})
            time.sleep(pause_s)
        if probability and random.random() < probability:
            log.warning("injected crash", extra={"moment": moment})
            os.kill(os.getpid(), signal.SIGKILL)

    return maybe_crash
