"""What epochline writes into the metadata string of a committed offset, and how it reads it back.

The committed offset is the witness of what committed (DESIGN.md): a streaming epoch commits its cut with
``epochline:checkpoint=N;instance=I;event_time=T;at=MS`` (all but the checkpoint may be absent); a batch item
commits its range end with ``epochline:batch=B;item=K;run=R;records=…;bytes=…;seconds=…``. Both are
``epochline:`` followed by ``;``-separated ``key=value`` fields, written and parsed here only. The broker keeps at most
``offset.metadata.max.bytes`` (4096 by default) per offset, so the fields stay short.

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
                        committed_at: int | None = None) -> str:
    """The metadata of a streaming commit: the checkpoint id, the instance that committed it (ids are reserved
    per instance, so the pair names one epoch of the whole group), the partition's largest event time, so a
    partition's watermark moves with it to its next owner, and the wall-clock time of the commit (epoch ms),
    so anyone reading the group can tell how long ago a partition last made progress."""
    fields: dict[str, object] = {CHECKPOINT_FIELD: checkpoint_id}
    if instance is not None:
        fields[INSTANCE_FIELD] = instance
    if event_time is not None:
        fields[EVENT_TIME_FIELD] = event_time
    if committed_at is not None:
        fields[COMMITTED_AT_FIELD] = committed_at
    return encode(fields)


@dataclass(frozen=True)
class CommittedEpoch:
    """What a streaming commit of one partition says: which epoch, by which instance, how far event time got."""

    checkpoint_id: int
    instance: str | None = None
    event_time: int | None = None


def committed_epoch(metadata: str | None) -> CommittedEpoch | None:
    """The epoch a streaming commit names; None for no metadata or someone else's (e.g. a batch item)."""
    checkpoint_id = checkpoint_id_from_metadata(metadata)
    if checkpoint_id is None:
        return None
    fields = decode(metadata) or {}
    event_time = fields.get(EVENT_TIME_FIELD)
    if event_time is not None and not event_time.lstrip("-").isdigit():
        raise MalformedOffsetMetadata(f"offset metadata {metadata!r}: event time {event_time!r} is not a number")
    return CommittedEpoch(checkpoint_id, fields.get(INSTANCE_FIELD),
                          int(event_time) if event_time is not None else None)


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
