"""The ``epochline`` command line.

Each subcommand is a thin shell over a library call, so everything it does can be tested without
spawning a process, and every failure it knows about exits non-zero with one readable line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from engine.local_broker import DEFAULT_DATA_DIR, DEFAULT_PORT, BrokerError, LocalBroker
from engine.logs import configure_logging

Handler = Callable[[argparse.Namespace], int]


def _broker_start(args: argparse.Namespace) -> int:
    state = LocalBroker(args.data_dir).start(port=args.port, timeout=args.timeout)
    print(state.bootstrap)
    return 0


def _broker_stop(args: argparse.Namespace) -> int:
    stopped = LocalBroker(args.data_dir).stop(timeout=args.timeout)
    print("stopped" if stopped else f"no broker is running from {Path(args.data_dir).absolute()}")
    return 0


def _broker_status(args: argparse.Namespace) -> int:
    state = LocalBroker(args.data_dir).state()
    if state is None:
        print("not running")
        return 3
    print(f"running pid={state.pid} bootstrap={state.bootstrap}")
    return 0


def _add_broker_commands(commands: argparse._SubParsersAction) -> None:
    broker = commands.add_parser("broker", help="run a local single-node Apache Kafka broker (KRaft)")
    actions = broker.add_subparsers(dest="action", required=True)
    for name, handler, help_text in (
        ("start", _broker_start, "fetch Kafka if needed, start it on 127.0.0.1 and wait for transactions"),
        ("stop", _broker_stop, "stop the broker recorded in the data dir (SIGTERM, then SIGKILL)"),
        ("status", _broker_status, "say whether the recorded broker runs"),
    ):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("--data-dir", default=DEFAULT_DATA_DIR, type=Path)
        if name == "start":
            action.add_argument("--port", default=DEFAULT_PORT, type=int)
            action.add_argument("--timeout", default=120.0, type=float, help="seconds to wait for readiness")
        if name == "stop":
            action.add_argument("--timeout", default=30.0, type=float, help="seconds before SIGKILL")
        action.set_defaults(handler=handler)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epochline", description="Exactly-once pipelines between Kafka topics")
    parser.add_argument("--log-level", default="INFO")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_broker_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    try:
        return int(args.handler(args))
    except BrokerError as error:
        print(f"epochline: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
