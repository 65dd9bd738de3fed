"""Plain Avro: every message value is one schemaless Avro record written with a known ``.avsc`` schema.

Decoding is per record in fastavro (its Cython reader; schemaless Avro has no framing that would let a
batch be decoded in one call) into plain dicts, read with a *physical* copy of the schema: timestamps,
dates and times stay integers and decimals stay bytes, so fastavro creates no datetime/Decimal/UUID
objects (3x faster than decoding with logical types, measured). Arrow then builds the whole batch from the
dicts in one C++ call and converts the physical columns to their logical types column-wise (see
``schemas.avro_arrow``). Encoding mirrors it: convert to the physical types column-wise, ``to_pylist``
once, then fastavro per record. Every payload must be consumed exactly: leftover bytes are a failure.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, cast

import fastavro
import pyarrow as pa

from schemas.arrow_batches import conform_batch, contains_map, map_batch_leaves
from schemas.avro_arrow import (
    AvroSchema,
    DecimalOverflow,
    avro_to_arrow_schema,
    load_avro_schema,
    physical_avro_schema,
    to_logical,
    to_physical,
)
from schemas.base import NULL_PAYLOAD_REASON, Decoded, DecodeFailure, EncodeError

ParsedSchema = Any  # fastavro's parsed schema (a dict it annotates)


class AvroCodec:
    """One Avro record schema, parsed once, with its Arrow and physical Arrow schemas.

    ``source`` names where the schema came from (a file, a registry id) for error messages.
    """

    def __init__(self, schema: AvroSchema, *, source: str) -> None:
        self.source = source
        self.avro_schema = schema
        self.arrow_schema = avro_to_arrow_schema(schema, where=source)
        physical = physical_avro_schema(schema)
        self.physical_schema = avro_to_arrow_schema(physical, where=source)
        self.parsed: ParsedSchema = fastavro.parse_schema(physical)
        self._struct_type = pa.struct(list(self.physical_schema))
        # fastavro writes maps from dicts; Arrow's dict conversion is ~3x slower, so only ask for it if needed
        self._maps_as_pydicts: Literal["strict"] | None = "strict" if contains_map(self._struct_type) else None

    @classmethod
    def from_file(cls, path: Path) -> AvroCodec:
        return cls(load_avro_schema(path), source=str(path))

    def read_body(self, buffer: io.BytesIO, size: int, writer: ParsedSchema | None = None) -> dict[str, Any]:
        """Read one record from ``buffer`` (positioned at the body) that must end exactly at ``size``.

        ``writer`` is the writer's parsed physical schema when it differs from this (reader) schema; fastavro
        then applies Avro schema resolution. Raises on truncated or invalid bytes (see ``body_failure``).
        """
        if writer is None:
            record = fastavro.schemaless_reader(buffer, self.parsed, None)
        else:
            record = fastavro.schemaless_reader(buffer, writer, self.parsed)
        if buffer.tell() != size:
            raise _TrailingBytes(size - buffer.tell())
        return cast(dict[str, Any], record)  # the top-level type is a record (checked in avro_to_arrow_schema)

    def records_to_batch(self, records: list[dict[str, Any]]) -> pa.RecordBatch:
        """Build the Arrow batch column-wise in C++, then convert physical columns to their logical types.

        Raises ``DecimalOverflow`` if a record holds a decimal too wide for its schema (see ``decoded``).
        """
        records_array = cast(pa.StructArray, pa.array(records, type=self._struct_type))  # a struct type gives one
        physical = pa.RecordBatch.from_struct_array(records_array)
        return map_batch_leaves(physical, self.arrow_schema, to_logical)

    def decoded(self, records: list[dict[str, Any]], indices: list[int],
                failures: list[DecodeFailure]) -> Decoded:
        """The Decoded result; records whose values do not fit Arrow are isolated into failures."""
        try:
            return Decoded(self.records_to_batch(records), indices, failures)
        except DecimalOverflow:
            kept_records, kept_indices = [], []
            for record, index in zip(records, indices):
                try:
                    self.records_to_batch([record])
                except DecimalOverflow as exc:
                    failures.append(DecodeFailure(index, f"Avro payload is invalid for the schema from "
                                                         f"{self.source}: {exc}"))
                    continue
                kept_records.append(record)
                kept_indices.append(index)
            failures.sort(key=lambda failure: failure.index)
            return Decoded(self.records_to_batch(kept_records), kept_indices, failures)

    def encode_bodies(self, batch: pa.RecordBatch, prefix: bytes = b"") -> list[bytes]:
        conformed = conform_batch(batch, self.arrow_schema, fmt="avro")
        physical = map_batch_leaves(conformed, self.physical_schema, to_physical)
        rows = physical.to_pylist(maps_as_pydicts=self._maps_as_pydicts)
        out: list[bytes] = []
        write = fastavro.schemaless_writer
        parsed = self.parsed
        for row_number, row in enumerate(rows):
            buffer = io.BytesIO()
            buffer.write(prefix)
            try:
                write(buffer, parsed, row)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise EncodeError(f"avro encode: row {row_number} does not fit the schema from {self.source}: "
                                  f"{exc}") from exc
            out.append(buffer.getvalue())
        return out


class _TrailingBytes(Exception):
    def __init__(self, count: int) -> None:
        super().__init__(f"{count} byte(s) left after the record")
        self.count = count


def body_failure(exc: Exception, size: int, source: str) -> str:
    """The DecodeFailure reason for an Avro body that fastavro could not read."""
    if isinstance(exc, EOFError):
        return f"Avro payload is truncated: {size} byte(s) end inside a record of the schema from {source}"
    if isinstance(exc, _TrailingBytes):
        return (f"Avro payload is invalid: {exc.count} of its {size} byte(s) are left over after a record of the "
                f"schema from {source} (corrupt, or written with another schema)")
    return f"Avro payload is invalid for the schema from {source}: {type(exc).__name__}: {exc}"


class AvroFormat:
    """Schemaless Avro records, one per message, all written with the schema in one ``.avsc`` file."""

    name = "avro"

    def __init__(self, codec: AvroCodec) -> None:
        self._codec = codec

    @property
    def arrow_schema(self) -> pa.Schema:
        return self._codec.arrow_schema

    def decode(self, payloads: Sequence[bytes | None]) -> Decoded:
        codec = self._codec
        records: list[dict[str, Any]] = []
        indices: list[int] = []
        failures: list[DecodeFailure] = []
        for index, payload in enumerate(payloads):
            if payload is None:
                failures.append(DecodeFailure(index, NULL_PAYLOAD_REASON))
                continue
            try:
                records.append(codec.read_body(io.BytesIO(payload), len(payload)))
            except Exception as exc:  # noqa: BLE001 - any fastavro error means this one payload is bad
                failures.append(DecodeFailure(index, body_failure(exc, len(payload), codec.source)))
                continue
            indices.append(index)
        return codec.decoded(records, indices, failures)

    def encode(self, batch: pa.RecordBatch) -> list[bytes]:
        return self._codec.encode_bodies(batch)
