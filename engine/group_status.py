"""Where a group-managed connector stands, read from Kafka alone (``epochline status``, the worker's status API).

Why from Kafka: the instances of a connector share its consumer group, so what the group coordinator says
(members, assignments) and what the group committed (offsets, checkpoint ids, the committing instance) is the
connector's progress, whichever machine runs which instance; no instance needs to be up to answer. Nothing
joins the group or commits: the offsets are read by a consumer that never subscribes.

Names (DESIGN.md, group mode): a member's ``client.id`` is
``<name>-<instance>-<source>`` (``source`` for the config's topic, ``repartition`` for ``<name>-repartition``);
keyed state lives in ``<name>-<operator>-changelog`` topics, one per stateful operator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from connectors.admin import (
    ClientConfig,
    DescribedGroup,
    DescribedMember,
    GroupMissing,
    GroupPartitionOffsets,
    check_connection,
    describe_group,
    group_offsets,
    matching_topics,
    partitions_of,
    topic_watermarks,
)
from connectors.offset_metadata import (
    COMMITTED_AT_FIELD,
    DEAD_LETTERS_FIELD,
    EVENT_TIME_FIELD,
    INSTANCE_FIELD,
    MalformedOffsetMetadata,
    checkpoint_id_from_metadata,
    decode,
)
from engine.config import ConnectorConfig
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
    committed_at: int | None
    """Wall-clock time of the commit, epoch milliseconds (commits by older versions lack it)."""
    metadata: str | None
    held_by: str | None
    dead_letters: int | None = None
    """Its records dead-lettered in all committed epochs (commits by older versions lack it)."""


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
    epoch = epoch_fields(offsets.metadata)
    lag = offsets.high - offsets.committed if offsets.committed is not None else None
    return PartitionStatus(topic, role, offsets.partition, offsets.committed, offsets.high, lag, epoch.checkpoint,
                           epoch.instance, epoch.event_time, epoch.committed_at, offsets.metadata,
                           held.get((topic, offsets.partition)), epoch.dead_letters)


class EpochFields(NamedTuple):
    """What a commit's metadata says, each field None when the commit lacks it."""

    checkpoint: int | None = None
    instance: str | None = None
    event_time: int | None = None
    committed_at: int | None = None
    dead_letters: int | None = None


def epoch_fields(metadata: str | None) -> EpochFields:
    """Checkpoint id, committing instance, event time, commit time and dead-letter count of a commit; fields
    older commits lack, or metadata that is not epochline's or cannot be read, are None (the raw string is
    shown next to them)."""
    try:
        checkpoint = checkpoint_id_from_metadata(metadata)
        fields = decode(metadata) or {}
    except MalformedOffsetMetadata:
        return EpochFields()
    return EpochFields(checkpoint, fields.get(INSTANCE_FIELD), _number(fields.get(EVENT_TIME_FIELD)),
                       _number(fields.get(COMMITTED_AT_FIELD)), _number(fields.get(DEAD_LETTERS_FIELD)))


def _number(text: str | None) -> int | None:
    return int(text) if text is not None and text.lstrip("-").isdigit() else None


def changelog_status(name: str, topic: str, watermarks: dict[int, tuple[int, int]]) -> ChangelogStatus | None:
    """A ``<name>-<operator>-changelog`` topic's size; None for a topic that only shares the prefix."""
    operator = topic[len(name) + 1:-len("-changelog")]
    if not OPERATOR_NAME.fullmatch(operator):
        return None
    return ChangelogStatus(topic, operator, len(watermarks), sum(high - low for low, high in watermarks.values()))


def read_status(config: ConnectorConfig, bootstrap: str, client: ClientConfig | None = None) -> ConnectorStatus:
    """Ask Kafka (bounded by ``kafka.connect_timeout``): is it there, who is in the group, what it committed.
    ``client``: the security settings to ask with (default: the connector's own, resolved here); a worker
    asks with its own, so it never resolves a connector's secrets."""
    client = client if client is not None else client_config(config)
    timeout = config.kafka.connect_timeout / 1000
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
