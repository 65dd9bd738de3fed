"""``epochline broker start|stop|status``: the local single-node Kafka broker (dev tooling, loaded lazily)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engine.cli.common import CommandFailed

if TYPE_CHECKING:
    from engine.testing.local_broker import LocalBroker


def _reported(action: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Broker failures (missing java, a taken port, ...) become the CLI's one-line failure."""

    def run(args: argparse.Namespace) -> int:
        from engine.testing.local_broker import BrokerError

        try:
            return action(args)
        except BrokerError as error:
            raise CommandFailed(str(error)) from error

    return run


def _broker(args: argparse.Namespace) -> LocalBroker:
    from engine.testing.local_broker import LocalBroker

    return LocalBroker(args.data_dir) if args.data_dir is not None else LocalBroker()


@_reported
def _start(args: argparse.Namespace) -> int:
    broker = _broker(args)
    state = broker.start(port=args.port, timeout=args.timeout) if args.port else broker.start(timeout=args.timeout)
    print(state.bootstrap)
    return 0


@_reported
def _stop(args: argparse.Namespace) -> int:
    broker = _broker(args)
    stopped = broker.stop(timeout=args.timeout)
    print("stopped" if stopped else f"no broker is running from {broker.data_dir.absolute()}")
    return 0


@_reported
def _status(args: argparse.Namespace) -> int:
    state = _broker(args).state()
    if state is None:
        print("not running")
        return 3
    print(f"running pid={state.pid} bootstrap={state.bootstrap}")
    return 0


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    broker = commands.add_parser("broker", help="run a local single-node Apache Kafka broker (KRaft)")
    actions = broker.add_subparsers(dest="action", required=True)
    for name, handler, help_text in (
        ("start", _start, "fetch Kafka if needed, start it on 127.0.0.1 and wait for transactions"),
        ("stop", _stop, "stop the broker recorded in the data dir (SIGTERM, then SIGKILL)"),
        ("status", _status, "say whether the recorded broker runs"),
    ):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("--data-dir", type=Path, help="default: .epochline/broker")
        if name == "start":
            action.add_argument("--port", type=int, help="default: 9092")
            action.add_argument("--timeout", default=120.0, type=float, help="seconds to wait for readiness")
        if name == "stop":
            action.add_argument("--timeout", default=30.0, type=float, help="seconds before SIGKILL")
        action.set_defaults(handler=handler)
