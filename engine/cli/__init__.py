"""The ``epochline`` command line: a thin shell over library calls.

Each subcommand lives in the module of its group (``connector``: run and validate; ``status``; ``batch``; ``broker``;
``worker``; ``connectors``: a worker's connectors over its API)
and calls one library function, so everything it does can be tested without spawning a process. Every
failure it knows about exits 2 with one readable line naming the problem.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from engine.logs import configure_logging

COMMAND_MODULES = {"broker": "broker", "run": "connector", "validate": "connector", "batch": "batch",
                   "status": "status", "worker": "worker", "connectors": "connectors"}
"""The module of ``engine.cli`` that adds each command. Only the one a command line names is imported (each
pulls in what its commands need: the REST client, the worker, rich's progress bars), so ``epochline run``
does not pay for the others at start; help and unknown commands load them all."""


def known_failures() -> tuple[type[Exception], ...]:
    """The errors a command reports as one line and exit code 2 (imported when one is raised)."""
    from connectors import SourceError, TopicAdminError
    from engine.batch import BatchJobError, BatchStoreError
    from engine.checkpoint import ConnectorFailed
    from engine.cli.common import CommandFailed
    from engine.config import ConfigError
    from engine.state import StateDirLocked
    from engine.transforms import OperatorConfigError
    from engine.worker.errors import StoreError, WorkerConfigError
    from schemas import SchemaError

    return (CommandFailed, ConfigError, ConnectorFailed, SchemaError, OperatorConfigError, TopicAdminError,
            BatchStoreError, BatchJobError, SourceError, WorkerConfigError, StoreError, StateDirLocked)


def _global_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=("auto", "text", "json"), default="auto",
                        help="auto (default): readable coloured lines on a terminal, JSON lines otherwise")


def command_named_in(argv: Sequence[str]) -> str | None:
    """The command a command line names (its first word after the global options), None if it names none
    we know or the global options are malformed (the full parser then says what is wrong)."""
    pre = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    _global_options(pre)
    pre.add_argument("command", nargs="?")
    try:
        known, _ = pre.parse_known_args(argv)
    except argparse.ArgumentError:
        return None
    return known.command if known.command in COMMAND_MODULES else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with ``command``'s module only, or with every command when ``command`` is None."""
    parser = argparse.ArgumentParser(prog="epochline", description="Exactly-once pipelines between Kafka topics")
    _global_options(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    modules = dict.fromkeys([COMMAND_MODULES[command]] if command else COMMAND_MODULES.values())
    for module in modules:
        importlib.import_module(f"engine.cli.{module}").add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(command_named_in(arguments)).parse_args(arguments)
    args.log_mode = configure_logging(args.log_level, args.log_format)
    from engine.worker.child import report_failure

    try:
        return int(args.handler(args))
    except Exception as error:
        report_failure(error)
        if not isinstance(error, known_failures()):
            raise
        print(f"epochline: {error}", file=sys.stderr)
        return 2
    finally:
        last_words = getattr(args, "last_words", None)  # a handler's line that comes after all, its failure too
        if last_words is not None:
            last_words()


__all__ = ["COMMAND_MODULES", "build_parser", "command_named_in", "main"]
