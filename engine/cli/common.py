"""What the command groups share: the failure they report, and the crash-test hook they pass down."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from engine.wiring import CrashPoint

if TYPE_CHECKING:
    from rich.console import Console

FAULTS_ENV = "EPOCHLINE_TEST_FAULTS"


class CommandFailed(RuntimeError):
    """A command could not do what it was asked; the message says why."""


def crash_point() -> CrashPoint | None:
    """Crash tests set ``EPOCHLINE_TEST_FAULTS``; only then is the fault injector (dev tooling) loaded."""
    if not os.environ.get(FAULTS_ENV):
        return None
    from engine.testing.faults import crash_point_from

    return crash_point_from(os.environ[FAULTS_ENV])


PIPED_WIDTH = 100_000
"""The width tables are laid out in when stdout is not a terminal: wider than any row, so no cell is cut."""


def table_console() -> Console:
    """Where a command prints its tables. On a terminal, rich fits them to its width; piped or redirected,
    rich would fit them to 80 columns and cut the cells (``paymen…``) a script greps for or a file keeps, so
    they are printed at their natural width instead. rich is imported here, by the commands that print
    tables only."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=PIPED_WIDTH)


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap-servers", help="HOST:PORT (default: $KAFKA_BOOTSTRAP)")

