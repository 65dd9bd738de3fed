"""``epochline connectors ...``: the connectors of a running worker, through its REST API.

Why a command group over the API rather than files: a worker owns its connectors (it restarts them, keeps their
state), so changing one means asking the worker. ``apply DIR`` makes the worker run what a folder of per-topic
YAML configs declares (a plan first, :mod:`engine.worker.apply`); the other commands act on one connector.
Every subcommand finds the worker by ``--url`` (else ``$EPOCHLINE_URL``) and authenticates with the token of
``--api-token-file`` (else ``$EPOCHLINE_API_TOKEN``); whatever the worker refuses is a one-line failure, exit 2.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from engine.cli.common import CommandFailed, table_console
from engine.worker.apply import ApplyPlan, desired_configs, diff_text, plan
from engine.worker.client import TokenFileError, WorkerApiError, WorkerClient, token_from

URL_ENV = "EPOCHLINE_URL"
DEFAULT_URL = "http://127.0.0.1:8083"
HTTP_LOGGERS = ("httpx", "httpcore")
"""They log every request at INFO: noise around a command's one line of output, kept for ``--log-level DEBUG``."""

WorkerCommand = Callable[[WorkerClient, argparse.Namespace], int]


def worker_url(given: str | None) -> str:
    """``--url``, else ``$EPOCHLINE_URL``, else a worker on this machine; read when the command runs."""
    return given or os.environ.get(URL_ENV) or DEFAULT_URL


def quiet_http_logs(level: str) -> None:
    if level.upper() != "DEBUG":
        for name in HTTP_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


def against_worker(command: WorkerCommand) -> Callable[[argparse.Namespace], int]:
    """``command`` with a client of the chosen worker; what the worker refuses, or not reaching it at all,
    becomes the CLI's :class:`CommandFailed` carrying the API's message."""

    @functools.wraps(command)
    def handler(args: argparse.Namespace) -> int:
        quiet_http_logs(getattr(args, "log_level", "INFO"))
        try:
            with WorkerClient(worker_url(args.url), token_from(args.api_token_file)) as client:
                return command(client, args)
        except (WorkerApiError, TokenFileError) as error:
            raise CommandFailed(str(error)) from error

    return handler


# -- apply ------------------------------------------------------------------------------------------------------

def plan_lines(the_plan: ApplyPlan) -> list[tuple[str, str]]:
    """``(name, line)`` per connector in the plan, in the order they are acted on."""
    return [*((name, f"create {name}") for name in the_plan.create),
            *((name, f"update {name} (restarts)") for name in the_plan.update),
            *((name, f"delete {name}") for name in the_plan.delete),
            *((name, f"unchanged {name}") for name in the_plan.unchanged)]


def print_dry_run(the_plan: ApplyPlan, desired: dict[str, dict[str, Any]], current: dict[str, dict[str, Any]]) -> None:
    """The plan with, under each connector that would be created or updated, the diff of its config."""
    for name, line in plan_lines(the_plan):
        print(line)
        if name in the_plan.create or name in the_plan.update:
            print(diff_text(name, current.get(name), desired[name]), end="")
    print("dry run: nothing changed")


def carry_out(client: WorkerClient, the_plan: ApplyPlan, desired: dict[str, dict[str, Any]]) -> None:
    """The calls, one line as each is done: a failure part way leaves a record of what was already applied."""
    for name in [*the_plan.create, *the_plan.update]:
        created, _ = client.put_config(name, desired[name])
        print(f"created {name}" if created else f"updated {name} (restarting)")
    for name in the_plan.delete:
        client.delete(name)
        print(f"deleted {name}")
    for name in the_plan.unchanged:
        print(f"unchanged {name}")


def _apply(client: WorkerClient, args: argparse.Namespace) -> int:
    """The folder is read and validated before the worker is asked anything: a bad file changes nothing."""
    desired = desired_configs(args.directory)
    current = client.configs()
    the_plan = plan(desired, current, prune=args.prune)
    if args.dry_run:
        print_dry_run(the_plan, desired, current)
    else:
        carry_out(client, the_plan, desired)
    return 0


# -- one connector ----------------------------------------------------------------------------------------------

def _list(client: WorkerClient, args: argparse.Namespace) -> int:
    for name in sorted(client.list()):
        print(name)
    return 0


def _optional(value: object) -> str:
    return "-" if value is None else str(value)


def partitions_text(partitions: list[dict[str, Any]] | None) -> str:
    """``orders[0,1] other[2]``: a task's partitions, one topic name each."""
    by_topic: dict[str, list[str]] = {}
    for held in partitions or []:
        by_topic.setdefault(str(held.get("topic")), []).append(str(held.get("partition")))
    return " ".join(f"{topic}[{','.join(numbers)}]" for topic, numbers in by_topic.items()) or "-"


def error_text(error: dict[str, Any] | None) -> str:
    if not error:
        return "-"
    return f"{error.get('type', 'error')}: {error.get('message', '')} (exit {_optional(error.get('exit_code'))})"


def tasks_table(tasks: list[dict[str, Any]]) -> Table:
    table = Table("task", "worker", "state", "pid", "partitions", "restarts", "checkpoint", "last commit (s)",
                  "lag", "dead letters", "error", title="tasks")
    for task in tasks:
        table.add_row(*(escape(cell) for cell in (
            _optional(task.get("id")), _optional(task.get("worker_id")), _optional(task.get("state")),
            _optional(task.get("pid")), partitions_text(task.get("partitions")), _optional(task.get("restarts")),
            _optional(task.get("checkpoint")), _optional(task.get("last_commit_age_s")), _optional(task.get("lag")),
            _optional(task.get("dead_letters")), error_text(task.get("error")))))
    return table


def print_connector_status(status: dict[str, Any], console: Console) -> None:
    """A header line (state, target, progress), the tasks as a table, then the trace of every failed task."""
    connector = status.get("connector") or {}
    worker = escape(_optional(connector.get("worker_id")))
    console.print(f"[bold]{escape(str(status.get('name')))}[/]  {_optional(connector.get('state'))} "
                  f"(target {_optional(connector.get('target'))})  worker {worker}"
                  f"  lag {_optional(status.get('lag'))}  checkpoint {_optional(status.get('checkpoint'))}  "
                  f"last commit {_optional(status.get('last_commit_age_s'))} s ago  "
                  f"dead letters {_optional(status.get('dead_letters'))}")
    tasks = status.get("tasks") or []
    console.print(tasks_table(tasks))
    for task in tasks:
        if task.get("trace"):
            console.print(f"task {_optional(task.get('id'))} trace:", markup=False, highlight=False)
            console.print(str(task["trace"]), markup=False, highlight=False)


def _status(client: WorkerClient, args: argparse.Namespace) -> int:
    status = client.status(args.name)
    if args.json:
        print(orjson.dumps(status, option=orjson.OPT_INDENT_2).decode())
    else:
        print_connector_status(status, table_console())
    return 0


def _acting(act: Callable[[WorkerClient, str], object], done: str) -> WorkerCommand:
    """A command that asks the worker one thing of a connector and says what it asked (``pausing orders``)."""

    def command(client: WorkerClient, args: argparse.Namespace) -> int:
        act(client, args.name)
        print(f"{done} {args.name}")
        return 0

    return command


def _restart(client: WorkerClient, args: argparse.Namespace) -> int:
    status = client.restart(args.name, include_tasks=args.include_tasks, only_failed=args.only_failed)
    state = (status.get("connector") or {}).get("state")
    print(f"restarting {args.name} ({_optional(state)})")
    return 0


def offsets_table(name: str, offsets: list[dict[str, Any]]) -> Table:
    table = Table("topic", "partition", "offset", title=f"{name}: committed offsets")
    for entry in offsets:
        partition, offset = entry.get("partition") or {}, entry.get("offset") or {}
        table.add_row(escape(str(partition.get("kafka_topic"))), _optional(partition.get("kafka_partition")),
                      _optional(offset.get("kafka_offset")))
    return table


def _offsets(client: WorkerClient, args: argparse.Namespace) -> int:
    offsets = client.offsets(args.name).get("offsets") or []
    if offsets:
        table_console().print(offsets_table(args.name, offsets))
    else:
        print(f"{args.name}: no committed offsets")
    return 0


def _reset_offsets(client: WorkerClient, args: argparse.Namespace) -> int:
    """The worker refuses (409) unless the connector is stopped: ``connectors stop NAME`` first."""
    print(client.reset_offsets(args.name) or f"reset the offsets of {args.name}")
    return 0


# -- the parser -------------------------------------------------------------------------------------------------

def worker_arguments() -> argparse.ArgumentParser:
    """The options every subcommand takes: which worker, and the token it wants."""
    worker = argparse.ArgumentParser(add_help=False)
    worker.add_argument("--url", help=f"the worker's REST API (default: ${URL_ENV}, else {DEFAULT_URL})")
    worker.add_argument("--api-token-file", type=Path,
                        help="a file holding the worker's API token (default: $EPOCHLINE_API_TOKEN, else none)")
    return worker


def _one_connector(subcommands: argparse._SubParsersAction[argparse.ArgumentParser], worker: argparse.ArgumentParser,
                   name: str, help_text: str, command: WorkerCommand) -> argparse.ArgumentParser:
    parser = subcommands.add_parser(name, parents=[worker], help=help_text)
    parser.add_argument("name", help="the connector's name")
    parser.set_defaults(handler=against_worker(command))
    return parser


def _add_apply(subcommands: argparse._SubParsersAction[argparse.ArgumentParser],
               worker: argparse.ArgumentParser) -> None:
    apply = subcommands.add_parser("apply", parents=[worker],
                                   help="make the worker run the connector configs of a folder (*.yaml, *.yml)")
    apply.add_argument("directory", type=Path)
    apply.add_argument("--prune", action="store_true", help="also delete connectors the folder does not declare")
    apply.add_argument("--dry-run", action="store_true", help="print the plan and the config diffs, change nothing")
    apply.set_defaults(handler=against_worker(_apply))


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    connectors = commands.add_parser("connectors", help="the connectors of a running worker, over its REST API")
    subcommands = connectors.add_subparsers(dest="connectors_command", required=True)
    worker = worker_arguments()
    _add_apply(subcommands, worker)
    listing = subcommands.add_parser("list", parents=[worker], help="the names of the worker's connectors")
    listing.set_defaults(handler=against_worker(_list))
    status = _one_connector(subcommands, worker, "status", "a connector's state and its tasks", _status)
    status.add_argument("--json", action="store_true", help="print the worker's STATUS object as JSON")
    _one_connector(subcommands, worker, "pause", "pause a connector (its tasks commit and end)",
                   _acting(WorkerClient.pause, "pausing"))
    _one_connector(subcommands, worker, "resume", "resume a paused or stopped connector",
                   _acting(WorkerClient.resume, "resuming"))
    _one_connector(subcommands, worker, "stop", "stop a connector (offsets can then be changed)",
                   _acting(WorkerClient.stop, "stopping"))
    restart = _one_connector(subcommands, worker, "restart", "restart a connector", _restart)
    restart.add_argument("--include-tasks", action="store_true",
                         help="accepted for Kafka Connect's habit: a connector's tasks always restart with it")
    restart.add_argument("--only-failed", action="store_true", help="restart only what failed")
    _one_connector(subcommands, worker, "delete", "delete a connector", _acting(WorkerClient.delete, "deleted"))
    _one_connector(subcommands, worker, "offsets", "a connector's committed source offsets", _offsets)
    _one_connector(subcommands, worker, "reset-offsets", "forget a stopped connector's offsets", _reset_offsets)
