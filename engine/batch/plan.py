"""The frozen plan of a batch: per partition, the offsets from the log start to the end at open, in items.

Item keys are zero-padded (``p0003:00000000000000001000``) so byte order is processing order. The plan is
written atomically and read back on resume, so a resume processes the *same* ranges however much the topic
grew since; its digest covers the config and the ranges, so an edited config is refused.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import orjson

from connectors.admin import partition_offsets
from engine.batch.errors import BatchJobError
from engine.config import ConnectorConfig
from engine.state import write_atomically

PLAN_FORMAT = 1


def item_key(partition: int, start: int) -> str:
    """``p0003:00000000000000001000``: zero-padded, so byte order (the store's order) is processing order."""
    if not 0 <= partition <= 9999 or start < 0:
        raise ValueError(f"cannot key partition {partition} offset {start}: outside p0000..p9999 / offset >= 0")
    return f"p{partition:04d}:{start:020d}"


@dataclass(frozen=True)
class BatchItem:
    """Offsets ``[start, end)`` of one partition, processed in one Kafka transaction."""

    partition: int
    start: int
    end: int

    @property
    def key(self) -> str:
        return item_key(self.partition, self.start)

    def describe(self, topic: str) -> str:
        return f"item {self.key} (topic {topic!r} partition {self.partition} offsets [{self.start}, {self.end}))"


@dataclass(frozen=True)
class BatchPlan:
    """The frozen ranges of one batch, in key order."""

    batch_id: str
    topic: str
    items: tuple[BatchItem, ...]

    def to_json(self) -> bytes:
        return orjson.dumps({"format": PLAN_FORMAT, "batch_id": self.batch_id, "topic": self.topic,
                             "items": [[i.partition, i.start, i.end] for i in self.items]})

    @classmethod
    def from_json(cls, data: bytes, where: Path) -> BatchPlan:
        try:
            raw = orjson.loads(data)
            if raw["format"] != PLAN_FORMAT:
                raise ValueError(f"format {raw['format']!r}, expected {PLAN_FORMAT}")
            return cls(raw["batch_id"], raw["topic"], tuple(BatchItem(*map(int, i)) for i in raw["items"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise BatchJobError(f"batch plan file {where} is unreadable: {error}") from error


def split_into_items(starts: dict[int, int], ends: dict[int, int], item_records: int) -> tuple[BatchItem, ...]:
    """Per partition, ``[start, end)`` cut into consecutive ranges of ``item_records`` offsets, in key order."""
    items = [BatchItem(partition, offset, min(offset + item_records, ends[partition]))
             for partition in sorted(ends)
             for offset in range(min(starts.get(partition, 0), ends[partition]), ends[partition], item_records)]
    return tuple(sorted(items, key=lambda item: item.key))


def plan_digest(config: ConnectorConfig, plan: BatchPlan) -> str:
    """sha256 over the canonical config and the ranges: any edit to either changes it."""
    digest = hashlib.sha256(config.model_dump_json().encode())
    digest.update(orjson.dumps([plan.topic, [[i.partition, i.start, i.end] for i in plan.items]]))
    return f"sha256:{digest.hexdigest()}"


def freeze_plan(config: ConnectorConfig, bootstrap: str, batch_id: str) -> BatchPlan:
    """The ranges from the log start to the current ``read_committed`` end of every partition."""
    topic = config.source.topic
    offsets = partition_offsets(bootstrap, topic)
    starts = {partition: start for partition, (start, _) in offsets.items()}
    ends = {partition: end for partition, (_, end) in offsets.items()}
    return BatchPlan(batch_id, topic, split_into_items(starts, ends, config.batch.item_records))


class PlanFile:
    """The frozen plan on disk, written atomically (temp file, fsync, rename, fsync dir)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> BatchPlan | None:
        try:
            return BatchPlan.from_json(self.path.read_bytes(), self.path)
        except FileNotFoundError:
            return None

    def write(self, plan: BatchPlan) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, [plan.to_json()])
