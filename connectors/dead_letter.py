"""Records the pipeline cannot process: kept with their original bytes and the reason, never silently dropped.

A ``DeadLetter`` travels to the dead-letter topic in the same transaction as the epoch's output, so a bad
record is accounted for exactly once. With ``on_error="halt"`` the source raises ``PoisonRecord`` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import pyarrow as pa

from connectors.metadata import KEY, OFFSET, PARTITION, value_columns, with_metadata_fields
from schemas import EncodeError, Format
from schemas.json_format import JsonFormat

HEADER_PREFIX = "epochline."
HEADER_FIELDS = ("stage", "reason", "topic", "partition", "offset")
"""The headers a dead letter carries, each ``epochline.<field>``, in this order."""


@dataclass(frozen=True)
class DeadLetter:
    """Record ``offset`` of ``topic``/``partition`` failed at ``stage`` ("decode", "late", "transform", ...)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    stage: str

    def headers(self) -> list[tuple[str, str | bytes | None]]:
        """Where the record came from and why it failed, as Kafka headers for the dead-letter topic."""
        values = {"stage": self.stage, "reason": self.reason, "topic": self.topic,
                  "partition": str(self.partition), "offset": str(self.offset)}
        return [(HEADER_PREFIX + name, values[name].encode()) for name in HEADER_FIELDS]

    def describe(self) -> str:
        return f"topic {self.topic!r} partition {self.partition} offset {self.offset}: {self.stage}: {self.reason}"


def described(headers: Sequence[tuple[str, bytes | None]]) -> dict[str, str]:
    """The ``epochline.*`` headers of a dead-letter record, by field (``HEADER_FIELDS``); bytes that are not
    UTF-8 are replaced, not refused, as the record is shown to a person."""
    return {name[len(HEADER_PREFIX):]: (value or b"").decode(errors="replace") for name, value in headers
            if name.startswith(HEADER_PREFIX) and name[len(HEADER_PREFIX):] in HEADER_FIELDS}


class PoisonRecord(Exception):
    """A record failed and the source is configured to halt (``on_error="halt"``) rather than dead-letter it."""

    def __init__(self, dead_letter: DeadLetter) -> None:
        super().__init__(f"poison record at {dead_letter.describe()}")
        self.dead_letter = dead_letter


def dead_letters_from_rows(rows: pa.RecordBatch | pa.Table, wire_format: Format, topic: str, reason: str,
                           stage: str) -> list[DeadLetter]:
    """Decoded rows of ``topic`` back to their ``wire_format``, so a dead-letter record can be replayed as it
    came; the rows carry the Kafka columns (partition, offset, key)."""
    table = pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows
    values: list[bytes | None] = []
    for batch in table.select(value_columns(table.column_names)).to_batches():
        encoded = wire_format.encode(batch)
        if len(encoded) != batch.num_rows:  # a format packing many rows in one record (arrow-ipc): one each
            encoded = [value for row in range(batch.num_rows) for value in wire_format.encode(batch.slice(row, 1))]
        values += encoded
    partitions = cast(list[int], table.column(PARTITION).to_pylist())  # non-nullable columns
    offsets = cast(list[int], table.column(OFFSET).to_pylist())
    return [
        DeadLetter(topic=topic, partition=partition, offset=offset, key=key, value=value, reason=reason, stage=stage)
        for partition, offset, key, value in zip(partitions, offsets, table.column(KEY).to_pylist(), values)
    ]


def unwritten_dead_letters(output: pa.Table, unwritten: Sequence[tuple[int, str]], *, source_topic: str,
                           source_format: Format | None, sink_topic: str) -> list[DeadLetter]:
    """Rows of ``output`` the sink's format refused (``(row, reason)``: the sink's ``Produced.unwritten``),
    dead-lettered with the format's reason (stage ``encode``): as the source record they are (its topic,
    partition, offset, key and value as it came) when the output is the source's rows (``source_format``
    decoded them, no transform changed them); else, a transform's row, written as JSON with the sink topic
    and offset -1 (None when a column has no JSON form)."""
    rows = output.take(pa.array([row for row, _ in unwritten], pa.int64()))
    source_schema = source_format.arrow_schema if source_format is not None else None
    if source_format is not None and source_schema is not None and rows.schema.equals(
            with_metadata_fields(source_schema)):
        return [letter for index, (_, reason) in enumerate(unwritten)
                for letter in dead_letters_from_rows(rows.slice(index, 1), source_format, source_topic, reason,
                                                     "encode")]
    values = rows.select(value_columns(rows.column_names))
    return [DeadLetter(topic=sink_topic, partition=-1, offset=-1, key=None, value=_as_json(values.slice(index, 1)),
                       reason=reason, stage="encode") for index, (_, reason) in enumerate(unwritten)]


def _as_json(row: pa.Table) -> bytes | None:
    try:
        [value] = JsonFormat(None).encode(row.combine_chunks().to_batches()[0])
    except EncodeError:
        return None
    return value
