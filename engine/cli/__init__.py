"""The ``epochline`` command line: a thin shell over library calls.

Each subcommand lives in the module of its group (``connector``: run and validate; ``status``; ``batch``; ``broker``;
``worker``; ``connectors``: a worker's connectors over its API)
and calls one library function, so everything it does can be tested without spawning a process. Every
failure it knows about exits 2 with one readable line naming the problem.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from connectors import SourceError, TopicAdminError
from engine.batch import BatchJobError, BatchStoreError
from engine.checkpoint import ConnectorFailed
from engine.cli import batch, broker, connector, connectors, status, worker
from engine.cli.common import CommandFailed
from engine.config import ConfigError
from engine.logs import configure_logging
from engine.state import StateDirLocked
from engine.transforms import OperatorConfigError
from engine.worker.child import report_failure
from engine.worker.errors import StoreError, WorkerConfigError
from schemas import SchemaError

KNOWN_FAILURES = (CommandFailed, ConfigError, ConnectorFailed, SchemaError, OperatorConfigError, TopicAdminError,
                  BatchStoreError, BatchJobError, SourceError, WorkerConfigError, StoreError, StateDirLocked)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epochline", description="Exactly-once pipelines between Kafka topics")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--log-format", choices=("auto", "text", "json"), default="auto",
                        help="auto (default): readable coloured lines on a terminal, JSON lines otherwise")
    commands = parser.add_subparsers(dest="command", required=True)
    broker.add_commands(commands)
    connector.add_commands(commands)
    batch.add_commands(commands)
    status.add_commands(commands)
    worker.add_commands(commands)
    connectors.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.log_mode = configure_logging(args.log_level, args.log_format)
    try:
        return int(args.handler(args))
    except KNOWN_FAILURES as error:
        report_failure(error)
        print(f"epochline: {error}", file=sys.stderr)
        return 2
    except Exception as error:
        report_failure(error)
        raise


__all__ = ["build_parser", "main"]
