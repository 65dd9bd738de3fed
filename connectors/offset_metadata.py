"""What epochline writes into the metadata string of a committed offset, and how it reads it back.

The committed offset is the witness of what committed (DESIGN.md): a streaming epoch commits its cut with
``epochline:checkpoint=N;instance=I;event_time=T;at=MS;dead_letters=D`` (all but the checkpoint may be
absent); a batch item commits its range end with ``epochline:batch=B;item=K;run=R;records=…;bytes=…;seconds=…``. Both
are ``epochline:`` followed by ``;``-separated ``key=value`` fields, written and parsed here only.
The broker keeps at most ``offset.metadata.max.bytes`` (4096 by default) per offset, so the fields stay short.

Metadata that does not start with ``epochline:`` belongs to someone else and reads as nothing; metadata
that does but cannot be parsed is ``MalformedOffsetMetadata``, never a guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import TopicPartition

PREFIX = "epochline:"
CHECKPOINT_FIELD = "checkpoint"
INSTANCE_FIELD = "instance"
EVENT_TIME_FIELD = "event_time"
COMMITTED_AT_FIELD = "at"
DEAD_LETTERS_FIELD = "dead_letters"


class MalformedOffsetMetadata(ValueError):
    """Committed offset metadata starts with ``epochline:`` but its fields cannot be read."""


def encode(fields: Mapping[str, object]) -> str:
    """``epochline:key=value;key=value`` in the order given; keys and values must not contain ``;`` or ``=``."""
    parts = []
    for key, value in fields.items():
        text = str(value)
        if any(char in part for part in (key, text) for char in ";="):
            raise ValueError(f"offset metadata field {key}={text!r} may not contain ';' or '='")
        parts.append(f"{key}={text}")
    return PREFIX + ";".join(parts)


def decode(metadata: str | None) -> dict[str, str] | None:
    """The fields of epochline's metadata, or None when the metadata is not epochline's."""
    if not metadata or not metadata.startswith(PREFIX):
        return None
    fields = {}
    for part in metadata[len(PREFIX):].split(";"):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise MalformedOffsetMetadata(f"offset metadata {metadata!r}: field {part!r} is not key=value")
        fields[key] = value
    return fields


def checkpoint_metadata(checkpoint_id: int, instance: str | None = None, event_time: int | None = None,
                        committed_at: int | None = None, dead_letters: int | None = None) -> str:
    """The metadata of a streaming commit: the checkpoint id, the instance that committed it (ids are reserved
    per instance, so the pair names one epoch of the whole group), the partition's largest event time, so a
    partition's watermark moves with it to its next owner, and the wall-clock time of the commit (epoch ms),
    so anyone reading the group can tell how long ago a partition last made progress, and how many of the
    partition's records went to the dead-letter topic in all committed epochs so far.

    Why the dead-letter count lives here: it is committed in the same transaction as the dead letters it
    counts, so it can be neither ahead of nor behind the dead-letter topic read ``read_committed``; it moves
    with the partition to its next owner as event time does; and anyone reading the group (the worker's
    status, ``epochline status``) sees it without asking a running process, whose own count starts from zero
    at every restart. Counting the dead-letter topic instead would need a full read of a topic that several
    connectors may share, whose records do not name the connector and which retention shortens."""
    fields: dict[str, object] = {CHECKPOINT_FIELD: checkpoint_id}
    if instance is not None:
        fields[INSTANCE_FIELD] = instance
    if event_time is not None:
        fields[EVENT_TIME_FIELD] = event_time
    if committed_at is not None:
        fields[COMMITTED_AT_FIELD] = committed_at
    if dead_letters is not None:
        fields[DEAD_LETTERS_FIELD] = dead_letters
    return encode(fields)


@dataclass(frozen=True)
class CommittedEpoch:
    """What a streaming commit of one partition says: which epoch, by which instance, how far event time got,
    how many of its records were dead-lettered in all committed epochs (None: a commit by an older version)."""

    checkpoint_id: int
    instance: str | None = None
    event_time: int | None = None
    dead_letters: int | None = None


def committed_epoch(metadata: str | None) -> CommittedEpoch | None:
    """The epoch a streaming commit names; None for no metadata or someone else's (e.g. a batch item)."""
    checkpoint_id = checkpoint_id_from_metadata(metadata)
    if checkpoint_id is None:
        return None
    fields = decode(metadata) or {}
    event_time = fields.get(EVENT_TIME_FIELD)
    if event_time is not None and not event_time.lstrip("-").isdigit():
        raise MalformedOffsetMetadata(f"offset metadata {metadata!r}: event time {event_time!r} is not a number")
    dead_letters = fields.get(DEAD_LETTERS_FIELD)
    if dead_letters is not None and not dead_letters.isdigit():
        raise MalformedOffsetMetadata(f"offset metadata {metadata!r}: dead-letter count {dead_letters!r} is not "
                                      "a number")
    return CommittedEpoch(checkpoint_id, fields.get(INSTANCE_FIELD),
                          int(event_time) if event_time is not None else None,
                          int(dead_letters) if dead_letters is not None else None)


def checkpoint_id_from_metadata(metadata: str | None) -> int | None:
    """The checkpoint id a streaming commit wrote; None for no metadata or someone else's (e.g. a batch item)."""
    fields = decode(metadata)
    if fields is None or CHECKPOINT_FIELD not in fields:
        return None
    value = fields[CHECKPOINT_FIELD]
    if not value.isdigit():
        raise MalformedOffsetMetadata(f"offset metadata {metadata!r}: checkpoint id {value!r} is not a number")
    return int(value)


def tagged(offsets: Iterable[TopicPartition], metadata: str) -> list[TopicPartition]:
    """Offsets carrying ``metadata``: what a commit sends, and what recovery reads back."""
    return [TopicPartition(tp.topic, tp.partition, tp.offset, metadata=metadata) for tp in offsets]
