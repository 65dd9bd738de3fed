"""What the command groups share: the failure they report, and the crash-test hook they pass down."""

from __future__ import annotations

import argparse
import os

from engine.wiring import CrashPoint

FAULTS_ENV = "EPOCHLINE_TEST_FAULTS"


class CommandFailed(RuntimeError):
    """A command could not do what it was asked; the message says why."""


def crash_point() -> CrashPoint | None:
    """Crash tests set ``EPOCHLINE_TEST_FAULTS``; only then is the fault injector (dev tooling) loaded."""
    if not os.environ.get(FAULTS_ENV):
        return None
    from engine.testing.faults import crash_point_from

    return crash_point_from(os.environ[FAULTS_ENV])


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-servers", help="HOST:PORT (default: $KAFKA_BOOTSTRAP)")

