"""The seam every wire format implements: bytes to Arrow (decode) and Arrow to bytes (encode).

Decoding never raises for one bad payload: a record that does not decode, or does not match the schema,
comes back as a ``DecodeFailure`` naming the problem, so the source can route it to the dead-letter topic
(or halt, if configured) and lose nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa


class SchemaError(ValueError):
    """A schema file or schema id cannot be read, resolved or mapped to Arrow (a configuration error)."""


@dataclass(frozen=True)
class DecodeFailure:
    """Payload ``index`` (position in the input sequence) could not be decoded, and why."""

    index: int
    reason: str


@dataclass
class Decoded:
    """The payloads that decoded, as one batch in input order, plus the ones that did not.

    ``indices[i]`` is the input position of ``batch`` row ``i``, so callers can line decoded rows up with
    per-record metadata (partition, offset, key) of the same input.
    """

    batch: pa.RecordBatch
    indices: list[int]
    failures: list[DecodeFailure] = field(default_factory=list)
    rows_per_record: int | None = 1
    """1 for formats with one row per record (so ``indices`` is the identity when nothing failed); None when
    a record may hold any number of rows (``arrow-ipc``)."""


class Format(Protocol):
    """A wire format bound to its schema (if it has one)."""

    name: str

    @property
    def arrow_schema(self) -> pa.Schema | None:
        """The Arrow schema decoded batches have, or None when it is inferred per batch."""

    def decode(self, payloads: Sequence[bytes | None]) -> Decoded:
        """Decode message values; bad payloads become failures, never exceptions."""

    def encode(self, batch: pa.RecordBatch) -> Sequence[bytes | None]:
        """Encode every row of ``batch`` as one message value (None: a tombstone, for formats that write them)."""


@runtime_checkable
class ColumnFormat(Protocol):
    """A format that also reads and writes values as an Arrow binary column (no bytes object per value)."""

    def decode_column(self, values: pa.BinaryArray) -> Decoded:
        """``decode`` of the column's values."""

    def encode_column(self, batch: pa.RecordBatch) -> pa.ChunkedArray[Any]:
        """``encode``'s values as a binary column."""


def decode_column(value_format: Format, values: pa.BinaryArray) -> Decoded:
    """Decode the values of an Arrow binary column: in bulk by a format that reads columns, else one bytes
    object per value through ``decode``."""
    if isinstance(value_format, ColumnFormat):
        return value_format.decode_column(values)
    return value_format.decode(values.to_pylist())


def encode_column(value_format: Format, batch: pa.RecordBatch) -> pa.ChunkedArray[Any]:
    """``encode`` as an Arrow binary column (nulls are tombstones)."""
    if isinstance(value_format, ColumnFormat):
        return value_format.encode_column(batch)
    return pa.chunked_array([pa.array(value_format.encode(batch), pa.binary())], pa.binary())


class EncodeError(ValueError):
    """A batch cannot be written in a format: a column is missing, has an unconvertible type, or a row
    holds a value the schema does not allow (the message names the column or row)."""


NULL_PAYLOAD_REASON = "null payload (tombstone)"
