"""The ``epochline`` command line.

Each subcommand is a thin shell over a library call, so everything it does can be tested without
spawning a process, and every failure it knows about exits non-zero with one readable line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from connectors.admin import TopicAdminError
from connectors.source import SourceError
from engine import batch_job
from engine.batch_store import BatchStoreError
from engine.config import ConfigError, load_config
from engine.local_broker import DEFAULT_DATA_DIR, DEFAULT_PORT, BrokerError, LocalBroker
from engine.logs import configure_logging
from engine.operators import OperatorConfigError
from engine.pipeline import validate_offline
from engine.runner import ConnectorFailed, RunOptions, bootstrap_from, run_connector
from schemas import SchemaError

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


def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    run_connector(config, RunOptions(bootstrap=bootstrap_from(args.bootstrap_servers), stop_at_end=args.stop_at_end))
    return 0


def _validate(args: argparse.Namespace) -> int:
    """Checks the config file, its schemas and its transform without touching Kafka."""
    config = load_config(args.config, batch=args.batch)
    validate_offline(config)
    print(f"{args.config}: ok ({config.name}: {config.source.topic} -> {config.sink.topic}, {config.sink.delivery})")
    return 0


def _add_run_commands(commands: argparse._SubParsersAction) -> None:
    run = commands.add_parser("run", help="run one connector from its per-topic YAML config")
    run.add_argument("config", type=Path)
    run.add_argument("--bootstrap-servers", help="HOST:PORT (default: $KAFKA_BOOTSTRAP)")
    run.add_argument("--stop-at-end", action="store_true",
                     help="capture the end offsets at start; exit 0 once everything up to them is committed")
    run.set_defaults(handler=_run)
    validate = commands.add_parser("validate", help="check a connector config without running it")
    validate.add_argument("config", type=Path)
    validate.add_argument("--batch", action="store_true", help="check it as a batch job config (epochline batch run)")
    validate.set_defaults(handler=_validate)


def _add_batch_commands(commands: argparse._SubParsersAction) -> None:
    batch = commands.add_parser("batch", help="bounded exactly-once batch jobs and their ledger")
    actions = batch.add_subparsers(dest="action", required=True)
    run = actions.add_parser("run", help="run (or resume) a batch: the topic up to now, exactly once")
    run.add_argument("config", type=Path)
    run.add_argument("--batch-id", required=True, help="names the batch; run again with it to resume")
    run.add_argument("--bootstrap-servers", help="HOST:PORT (default: $KAFKA_BOOTSTRAP)")
    run.set_defaults(handler=batch_job.run_command)
    census = actions.add_parser("census", help="item counts by outcome, spend, cursor, exhausted")
    census.add_argument("batch_id")
    census.set_defaults(handler=batch_job.census_command)
    attention = actions.add_parser("attention", help="failed and suspended items, oldest key first")
    attention.add_argument("batch_id")
    attention.add_argument("--limit", type=int, default=100)
    attention.set_defaults(handler=batch_job.attention_command)
    listing = actions.add_parser("list", help="the batches of a store and tenant")
    listing.set_defaults(handler=batch_job.list_command)
    for action in (run, census, attention, listing):
        action.add_argument("--store", help="sqlite:///FILE, FILE or postgresql://... (default: the config's)")
        action.add_argument("--tenant", default="default")
        if action is not run:
            action.add_argument("--config", type=Path, help="take the store from this connector config")
            action.add_argument("--json", action="store_true", help="machine-readable output")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="epochline", description="Exactly-once pipelines between Kafka topics")
    parser.add_argument("--log-level", default="INFO")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_broker_commands(commands)
    _add_run_commands(commands)
    _add_batch_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    try:
        return int(args.handler(args))
    except (BrokerError, ConfigError, ConnectorFailed, SchemaError, OperatorConfigError, TopicAdminError,
            BatchStoreError, batch_job.BatchJobError, SourceError) as error:
        print(f"epochline: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
