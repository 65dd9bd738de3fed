"""``epochline batch run|census|attention|list``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from engine.batch import BatchJobError, BatchOptions, BatchStore, open_batch_store, run_batch, store_url_for
from engine.batch.reports import (
    attention_report,
    census_report,
    list_report,
    print_attention,
    print_census,
    print_list,
)
from engine.checkpoint import bootstrap_from
from engine.cli.common import add_bootstrap_argument, crash_point, table_console
from engine.cli.progress import batch_progress
from engine.config import load_config


def _run(args: argparse.Namespace) -> int:
    """``epochline batch run``: exit 0 when every item succeeded, 1 when some failed."""
    config = load_config(args.config, batch=True)
    options = BatchOptions(batch_id=args.batch_id, bootstrap=bootstrap_from(args.bootstrap_servers),
                           store_url=args.store, tenant=args.tenant, crash_point=crash_point())
    with batch_progress(args.log_mode == "text") as progress:
        summary = run_batch(config, options, progress)
    print(summary.line())
    return summary.exit_code


@contextmanager
def _store_from(args: argparse.Namespace) -> Iterator[BatchStore]:
    if args.store:
        url = args.store
    elif args.config:
        url = store_url_for(load_config(args.config, batch=True))
    else:
        raise BatchJobError("name the batch store: --store URL, or --config CONFIG to use the config's store")
    store = open_batch_store(url, args.tenant)
    try:
        yield store
    finally:
        store.close()


def _emit(args: argparse.Namespace, report: Any, human: Callable[[Console], None]) -> None:
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        human(table_console())


def _census(args: argparse.Namespace) -> int:
    with _store_from(args) as store:
        report = census_report(store, args.batch_id)
    _emit(args, report, lambda console: print_census(report, console))
    return 0


def _attention(args: argparse.Namespace) -> int:
    with _store_from(args) as store:
        items = attention_report(store, args.batch_id, args.limit)
    _emit(args, items, lambda console: print_attention(args.batch_id, items, console))
    return 0


def _list(args: argparse.Namespace) -> int:
    with _store_from(args) as store:
        batches = list_report(store)
    _emit(args, batches, lambda console: print_list(batches, console))
    return 0


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    batch = commands.add_parser("batch", help="bounded exactly-once batch jobs and their ledger")
    actions = batch.add_subparsers(dest="action", required=True)
    run = actions.add_parser("run", help="run (or resume) a batch: the topic up to now, exactly once")
    run.add_argument("config", type=Path)
    run.add_argument("--batch-id", required=True, help="names the batch; run again with it to resume")
    add_bootstrap_argument(run)
    run.set_defaults(handler=_run)
    census = actions.add_parser("census", help="item counts by outcome, spend, cursor, exhausted")
    census.add_argument("batch_id")
    census.set_defaults(handler=_census)
    attention = actions.add_parser("attention", help="failed items, oldest key first")
    attention.add_argument("batch_id")
    attention.add_argument("--limit", type=int, default=100)
    attention.set_defaults(handler=_attention)
    listing = actions.add_parser("list", help="the batches of a store and tenant")
    listing.set_defaults(handler=_list)
    for action in (run, census, attention, listing):
        action.add_argument("--store", help="sqlite:///FILE, FILE or postgresql://... (default: the config's)")
        action.add_argument("--tenant", default="default")
        if action is not run:
            action.add_argument("--config", type=Path, help="take the store from this connector config")
            action.add_argument("--json", action="store_true", help="machine-readable output")
