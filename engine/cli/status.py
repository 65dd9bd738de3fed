"""``epochline status CONFIG``: where a group-managed connector stands, read from Kafka alone.

Why from Kafka: the instances of a connector share its consumer group, so what the group coordinator says
(members, assignments) and what the group committed (offsets, checkpoint ids, the committing instance) is the
connector's progress, whichever machine runs which instance; no instance needs to be up to answer. Nothing
joins the group or commits: the offsets are read by a consumer that never subscribes.

Names (DESIGN.md, group mode): a member's ``client.id`` is
``<name>-<instance>-<source>`` (``source`` for the config's topic, ``repartition`` for ``<name>-repartition``);
keyed state lives in ``<name>-<operator>-changelog`` topics, one per stateful operator.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from connectors.admin import (
    DescribedGroup,
    DescribedMember,
    GroupMissing,
    GroupPartitionOffsets,
    TopicAdminError,
    check_connection,
    describe_group,
    group_offsets,
    matching_topics,
    partitions_of,
    topic_watermarks,
)
from connectors.offset_metadata import MalformedOffsetMetadata, checkpoint_id_from_metadata, decode
from engine.checkpoint import bootstrap_from
from engine.cli.common import CommandFailed, add_bootstrap_argument
from engine.config import ConnectorConfig, load_config
from engine.wiring import client_config

SOURCE_ROLES = ("source", "repartition")
"""The last part of a member's client id: which of the connector's inputs that consumer reads."""
OPERATOR_NAME = re.compile(r"step\d+-[A-Za-z]+")
"""How the engine names operators (``step1-window``): a changelog topic of connector ``a`` is told apart from
one of connector ``a-b`` by its middle matching this."""
MISSING_STATE = "DEAD"
"""What Kafka calls a group that does not exist (nobody joined it, nothing committed)."""


@dataclass(frozen=True)
class MemberStatus:
    """One group member: which instance of the connector and which of its inputs, where, holding what."""

    instance: str | None
    source: str | None
    client_id: str
    group_instance_id: str | None
    member_id: str
    host: str
    partitions: list[dict[str, str | int]]


@dataclass(frozen=True)
class PartitionStatus:
    """One input partition: the committed offset against the high watermark, and which epoch committed it."""

    topic: str
    role: str
    partition: int
    committed: int | None
    end: int
    lag: int | None
    checkpoint: int | None
    instance: str | None
    event_time: int | None
    metadata: str | None
    held_by: str | None


@dataclass(frozen=True)
class ChangelogStatus:
    """One changelog topic: how many partitions and how many offsets it holds (compaction shrinks them)."""

    topic: str
    operator: str
    partitions: int
    records: int


@dataclass(frozen=True)
class ConnectorStatus:
    """Everything ``epochline status`` shows; ``--json`` prints it as one object."""

    name: str
    group_id: str
    bootstrap: str
    state: str
    exists: bool
    source_topic: str
    repartition_topic: str | None
    members: list[MemberStatus]
    partitions: list[PartitionStatus]
    changelogs: list[ChangelogStatus]


def instance_of(name: str, client_id: str) -> tuple[str | None, str | None]:
    """``(instance, source)`` from ``<name>-<instance>-<source>``; ``(None, None)`` for another client's id
    (a tool, a console consumer), which is then shown by its client id only."""
    for role in SOURCE_ROLES:
        prefix, suffix = f"{name}-", f"-{role}"
        if client_id.startswith(prefix) and client_id.endswith(suffix) and \
                len(client_id) > len(prefix) + len(suffix):
            return client_id[len(prefix):-len(suffix)], role
    return None, None


def member_status(name: str, member: DescribedMember) -> MemberStatus:
    """The group instance id names the instance (it is what static membership keys on); else the client id."""
    instance, source = instance_of(name, member.group_instance_id or member.client_id)
    partitions: list[dict[str, str | int]] = [{"topic": topic, "partition": partition}
                                              for topic, partition in member.partitions]
    return MemberStatus(instance, source, member.client_id, member.group_instance_id, member.member_id,
                        member.host, partitions)


def holders(members: list[MemberStatus]) -> dict[tuple[str, int], str]:
    """Which instance (else client id) holds each assigned partition right now."""
    return {(str(held["topic"]), int(held["partition"])): member.instance or member.client_id
            for member in members for held in member.partitions}


def partition_status(topic: str, role: str, offsets: GroupPartitionOffsets,
                     held: dict[tuple[str, int], str]) -> PartitionStatus:
    """Lag counts offsets up to the high watermark, transaction markers included: an input written in
    transactions (the repartition topic) shows a lag of one marker even when fully processed."""
    checkpoint, instance, event_time = epoch_fields(offsets.metadata)
    lag = offsets.high - offsets.committed if offsets.committed is not None else None
    return PartitionStatus(topic, role, offsets.partition, offsets.committed, offsets.high, lag, checkpoint,
                           instance, event_time, offsets.metadata, held.get((topic, offsets.partition)))


def epoch_fields(metadata: str | None) -> tuple[int | None, str | None, int | None]:
    """Checkpoint id, committing instance and event time of a commit; fields older commits lack, or metadata
    that is not epochline's or cannot be read, are None (the raw string is shown next to them)."""
    try:
        checkpoint = checkpoint_id_from_metadata(metadata)
        fields = decode(metadata) or {}
    except MalformedOffsetMetadata:
        return None, None, None
    event_time = fields.get("event_time")
    parsed_time = int(event_time) if event_time is not None and event_time.lstrip("-").isdigit() else None
    return checkpoint, fields.get("instance"), parsed_time


def changelog_status(name: str, topic: str, watermarks: dict[int, tuple[int, int]]) -> ChangelogStatus | None:
    """A ``<name>-<operator>-changelog`` topic's size; None for a topic that only shares the prefix."""
    operator = topic[len(name) + 1:-len("-changelog")]
    if not OPERATOR_NAME.fullmatch(operator):
        return None
    return ChangelogStatus(topic, operator, len(watermarks), sum(high - low for low, high in watermarks.values()))


def read_status(config: ConnectorConfig, bootstrap: str) -> ConnectorStatus:
    """Ask Kafka (bounded by ``kafka.connect_timeout``): is it there, who is in the group, what it committed."""
    client, timeout = client_config(config), config.kafka.connect_timeout / 1000
    check_connection(bootstrap, client, timeout)
    try:
        group: DescribedGroup | None = describe_group(bootstrap, config.group_id, timeout, client)
    except GroupMissing:
        group = None
    members = [member_status(config.name, member) for member in group.members] if group is not None else []
    repartition = f"{config.name}-repartition"
    has_repartition = repartition in matching_topics(bootstrap, repartition, "", timeout, client)
    inputs = [(config.source.topic, "source"), *([(repartition, "repartition")] if has_repartition else [])]
    held = holders(members)
    partitions = [partition_status(topic, role, offsets, held) for topic, role in inputs
                  for offsets in group_offsets(bootstrap, config.group_id, topic,
                                               partitions_of(bootstrap, topic, timeout, client), timeout, client)]
    changelogs = [found for topic, watermarks in
                  topic_watermarks(bootstrap, f"{config.name}-", "-changelog", timeout, client).items()
                  if (found := changelog_status(config.name, topic, watermarks)) is not None]
    return ConnectorStatus(config.name, config.group_id, bootstrap, group.state if group else MISSING_STATE,
                           group is not None, config.source.topic, repartition if has_repartition else None,
                           members, partitions, changelogs)


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
                  title="input partitions")
    for row in partitions:
        table.add_row(row.topic, str(row.partition), _optional(row.committed), str(row.end), _optional(row.lag),
                      _optional(row.checkpoint), _optional(row.instance), _optional(row.held_by))
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
        print_status(status, Console())
    return 0


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = commands.add_parser("status", help="a connector's group, members, committed offsets, lag, state topics")
    status.add_argument("config", type=Path)
    add_bootstrap_argument(status)
    status.add_argument("--json", action="store_true", help="machine-readable output: one JSON object")
    status.set_defaults(handler=_status)
