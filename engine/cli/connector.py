"""``epochline run`` and ``epochline validate``: one connector from its per-topic YAML config."""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace
from pathlib import Path

from engine.checkpoint import RunOptions, bootstrap_from, run_connector
from engine.checkpoint.totals import RunTotals
from engine.cli.common import CommandFailed, add_bootstrap_argument, crash_point
from engine.config import load_config
from engine.validation import checked_config, validate_online
from engine.worker.child import die_with_parent

log = logging.getLogger(__name__)


def _run(args: argparse.Namespace) -> int:
    die_with_parent()
    config = load_config(args.config)
    options = RunOptions(bootstrap=bootstrap_from(args.bootstrap_servers), stop_at_end=args.stop_at_end,
                         crash_point=crash_point(), instance=args.instance, create_topics=args.create_topics)
    args.last_words = lambda: _sum_up(options.totals, args.log_mode)
    if not args.stop_at_end or args.log_mode != "text":
        run_connector(config, options)
        return 0
    from engine.cli.progress import stop_at_end_progress  # rich's progress bars: on a terminal only

    with stop_at_end_progress(enabled=True) as progress:
        run_connector(config, replace(options, progress=progress))
    return 0


def _sum_up(totals: RunTotals, log_mode: str) -> None:
    """A run's last line, however it ended (stopped, at the end of its input, failed): what it committed. In
    JSON logs it is one more event, with the numbers as fields. A run that never reached Kafka says nothing
    more than its error."""
    if not totals.started:
        return
    if log_mode == "text":
        print(totals.line(), file=sys.stderr)
    else:
        log.info("run summary", extra=totals.fields())


def _validate(args: argparse.Namespace) -> int:
    """Checks the config file, its schemas and its transform; with ``--online`` also Kafka, touching no data."""
    config = checked_config(args.config, batch=args.batch)
    if args.online:
        problems = validate_online(config, bootstrap_from(args.bootstrap_servers))
        if problems:
            raise CommandFailed("\n".join(f"{args.config}: {problem}" for problem in problems))
    checked = "config and Kafka" if args.online else "config"
    print(f"{args.config}: ok ({checked}; {config.name}: {config.source.topic} -> {config.sink_target}, "
          f"{config.sink.delivery})")
    return 0


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = commands.add_parser("run", help="run one connector from its per-topic YAML config")
    run.add_argument("config", type=Path)
    add_bootstrap_argument(run)
    run.add_argument("--stop-at-end", action="store_true",
                     help="capture the end offsets at start; exit 0 once the group committed everything up to them")
    run.add_argument("--instance", help="this instance's stable name within the connector's group (default: "
                                        "$EPOCHLINE_INSTANCE, else a name generated once and kept in the state dir)")
    run.add_argument("--create-topics", action="store_true",
                     help="create the source, sink and dead-letter topics that do not exist yet (the broker's "
                          "default partitions and replication) before starting")
    run.set_defaults(handler=_run)
    validate = commands.add_parser("validate", help="check a connector config without running it")
    validate.add_argument("config", type=Path)
    validate.add_argument("--batch", action="store_true", help="check it as a batch job config (epochline batch run)")
    validate.add_argument("--online", action="store_true",
                          help="also check Kafka: reachable, topics exist, read/write permitted (no data touched)")
    add_bootstrap_argument(validate)
    validate.set_defaults(handler=_validate)
