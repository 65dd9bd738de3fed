"""A source's cut: per partition, the next offset to read. What the sink commits and what a restart seeks to.

The offsets are *positions* reported by the consumer (including the end-of-partition offset it reports past
trailing transaction markers), never "last offset + 1", so a cut taken at the end of a transactional topic
is the offset a ``read_committed`` reader stops at and restoring it never re-reads or waits for a marker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import orjson
from confluent_kafka import TopicPartition


class CheckpointFormatError(ValueError):
    """Serialized checkpoint bytes are not a valid ``SourceCheckpoint``."""


@dataclass(frozen=True)
class SourceCheckpoint:
    """Where source ``source`` stands on ``topic``: partition -> next offset to read.

    Checkpoints of the same source and topic are partially ordered: ``a <= b`` when every partition of
    ``a`` is in ``b`` at an offset at least as far. Checkpoints of different sources or topics are
    incomparable (every comparison is False).
    """

    source: str
    topic: str
    offsets: Mapping[int, int]

    def __post_init__(self) -> None:
        for partition, offset in self.offsets.items():
            if not isinstance(partition, int) or not isinstance(offset, int) or partition < 0 or offset < 0:
                raise ValueError(f"checkpoint of source {self.source!r} on topic {self.topic!r}: partition "
                                 f"{partition!r} -> offset {offset!r} must be non-negative integers")
        frozen = MappingProxyType(dict(sorted(self.offsets.items())))
        object.__setattr__(self, "offsets", frozen)

    def to_bytes(self) -> bytes:
        return orjson.dumps({"source": self.source, "topic": self.topic,
                             "offsets": {str(p): o for p, o in self.offsets.items()}})

    @classmethod
    def from_bytes(cls, data: bytes) -> SourceCheckpoint:
        try:
            decoded = orjson.loads(data)
            return cls(source=decoded["source"], topic=decoded["topic"],
                       offsets={int(p): o for p, o in decoded["offsets"].items()})
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as error:
            raise CheckpointFormatError(f"not a source checkpoint ({error}): {data[:200]!r}") from error

    def topic_partitions(self, metadata: str | None = None) -> list[TopicPartition]:
        """The offsets as ``TopicPartition``s, e.g. for ``send_offsets_to_transaction``, each carrying
        ``metadata`` (the checkpoint id) when given."""
        if metadata is None:
            return [TopicPartition(self.topic, p, o) for p, o in self.offsets.items()]
        return [TopicPartition(self.topic, p, o, metadata=metadata) for p, o in self.offsets.items()]

    def __hash__(self) -> int:
        return hash((self.source, self.topic, tuple(self.offsets.items())))

    def __le__(self, other: SourceCheckpoint) -> bool:
        if not isinstance(other, SourceCheckpoint):
            return NotImplemented
        return (self.source == other.source and self.topic == other.topic
                and all(p in other.offsets and o <= other.offsets[p] for p, o in self.offsets.items()))

    def __lt__(self, other: SourceCheckpoint) -> bool:
        if not isinstance(other, SourceCheckpoint):
            return NotImplemented
        return self <= other and self != other

    def __ge__(self, other: SourceCheckpoint) -> bool:
        if not isinstance(other, SourceCheckpoint):
            return NotImplemented
        return other <= self

    def __gt__(self, other: SourceCheckpoint) -> bool:
        if not isinstance(other, SourceCheckpoint):
            return NotImplemented
        return other < self
