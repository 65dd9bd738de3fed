"""``epochline status CONFIG``: where a group-managed connector stands, read from Kafka alone
(``engine.group_status``), printed as tables or one JSON object."""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from connectors.admin import TopicAdminError
from engine.checkpoint import bootstrap_from
from engine.cli.common import CommandFailed, add_bootstrap_argument, table_console
from engine.config import load_config
from engine.group_status import ChangelogStatus, ConnectorStatus, MemberStatus, PartitionStatus, read_status


def _optional(value: object) -> str:
    return "-" if value is None else str(value)


def _held_text(partitions: list[dict[str, str | int]]) -> str:
    """``topic[0,1] other[2]``: a member's partitions, one topic name each, as they read at a glance."""
    by_topic: dict[str, list[str]] = {}
    for held in partitions:
        by_topic.setdefault(str(held["topic"]), []).append(str(held["partition"]))
    return " ".join(f"{topic}[{','.join(numbers)}]" for topic, numbers in by_topic.items()) or "-"


def print_status(status: ConnectorStatus, console: Console) -> None:
    """The terminal view: a header line, then members, input partitions and changelogs as tables."""
    if status.exists:
        console.print(f"[bold]{status.name}[/]  group {status.group_id}  {status.state}  "
                      f"{len(status.members)} member(s)  Kafka {status.bootstrap}")
    else:
        console.print(f"[bold]{status.name}[/]  group {status.group_id} does not exist yet "
                      f"(no instance joined, nothing committed)  Kafka {status.bootstrap}")
    if status.members:
        console.print(_members_table(status.members))
    console.print(_partitions_table(status.partitions))
    if status.changelogs:
        console.print(_changelogs_table(status.changelogs))
    else:
        console.print("no changelog topics (no keyed state in Kafka)")


def _members_table(members: list[MemberStatus]) -> Table:
    table = Table("instance", "input", "host", "partitions", "client id", title="members")
    for member in members:
        table.add_row(_optional(member.instance), _optional(member.source), member.host,
                      _held_text(member.partitions), member.client_id)
    return table


def _partitions_table(partitions: list[PartitionStatus]) -> Table:
    table = Table("topic", "partition", "committed", "end", "lag", "checkpoint", "committed by", "held by",
                  "dead letters", title="input partitions")
    for row in partitions:
        table.add_row(row.topic, str(row.partition), _optional(row.committed), str(row.end), _optional(row.lag),
                      _optional(row.checkpoint), _optional(row.instance), _optional(row.held_by),
                      _optional(row.dead_letters))
    return table


def _changelogs_table(changelogs: list[ChangelogStatus]) -> Table:
    table = Table("changelog topic", "partitions", "records", title="keyed state")
    for changelog in changelogs:
        table.add_row(changelog.topic, str(changelog.partitions), str(changelog.records))
    return table


def _status(args: argparse.Namespace) -> int:
    """Exit 0 with the report; a config error or Kafka not answering is the CLI's one-line failure (exit 2)."""
    config = load_config(args.config)
    try:
        status = read_status(config, bootstrap_from(args.bootstrap_servers))
    except TopicAdminError as error:
        raise CommandFailed(f"{args.config}: {error}") from error
    if args.json:
        print(orjson.dumps(status, option=orjson.OPT_INDENT_2).decode())
    else:
        print_status(status, table_console())
    return 0


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = commands.add_parser("status", help="a connector's group, members, committed offsets, lag, state topics")
    status.add_argument("config", type=Path)
    add_bootstrap_argument(status)
    status.add_argument("--json", action="store_true", help="machine-readable output: one JSON object")
    status.set_defaults(handler=_status)
