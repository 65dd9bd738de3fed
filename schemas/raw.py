"""Raw bytes: one binary column ``value``; nothing is parsed, so nothing fails.

None payloads (tombstones) decode to null and null values encode back to None (a tombstone for the sink),
so a raw pipeline copies deletes as faithfully as data. As a column format the values pass between the
Kafka reader's Arrow buffers and the producer's without a ``bytes`` object per record.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from schemas.base import Decoded, EncodeError

VALUE_COLUMN = "value"
RAW_SCHEMA = pa.schema([pa.field(VALUE_COLUMN, pa.binary(), nullable=True)])


class RawFormat:
    name = "raw"

    @property
    def arrow_schema(self) -> pa.Schema:
        return RAW_SCHEMA

    def decode(self, payloads: Sequence[bytes | None]) -> Decoded:
        return self.decode_column(pa.array(payloads, type=pa.binary()))

    def decode_column(self, values: pa.BinaryArray) -> Decoded:
        """The column itself, no copy: every value (null included) is a row."""
        return Decoded(pa.RecordBatch.from_arrays([values], schema=RAW_SCHEMA), list(range(len(values))))

    def encode(self, batch: pa.RecordBatch) -> list[bytes | None]:
        """The ``value`` column's bytes (strings as UTF-8); null rows come back as None (tombstones)."""
        return self.encode_column(batch).to_pylist()

    def encode_column(self, batch: pa.RecordBatch) -> pa.ChunkedArray[Any]:
        """``encode``'s values as one binary column: the ``value`` column, cast when it holds text."""
        if VALUE_COLUMN not in batch.schema.names:
            raise EncodeError(f"raw encode: the batch has no '{VALUE_COLUMN}' column (it has {batch.schema.names})")
        column = batch.column(VALUE_COLUMN)
        if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)
                or pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            raise EncodeError(f"raw encode: column '{VALUE_COLUMN}' is {column.type}, expected binary or string")
        return pa.chunked_array([column.cast(pa.binary())], pa.binary())
