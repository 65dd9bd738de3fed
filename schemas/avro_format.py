"""Plain Avro: every message value is one schemaless Avro record written with a known ``.avsc`` schema.

A record of primitive fields is decoded and encoded for the whole batch at once, from and into Arrow binary
columns (``decode_column``, ``encode_column``: no bytes object per record), in C or else column by column in
numpy and Arrow compute (``schemas.avro_columns``; in C 0.15 µs per record to decode and 0.1 to encode the
benchmark's records, against about 5 each way for fastavro, measured). When a payload of the batch is not
exactly such a record, or the schema has other fields, the batch is decoded per record in fastavro (its
Cython reader) into plain dicts, read with a *physical* copy of the schema: timestamps, dates and times stay
integers and decimals stay bytes, so fastavro creates no datetime/Decimal/UUID objects (3x faster than
decoding with logical types, measured). Arrow then builds the whole batch from the dicts in one C++ call and
converts the physical columns to their logical types column-wise (see ``schemas.avro_arrow``). Encoding
mirrors it: convert to the physical types column-wise, then encode a record of primitive fields at once
(``schemas.avro_columns``), any other record with ``to_pylist`` once and fastavro per record. Every payload
must be consumed exactly: leftover bytes are a failure, and so is a record that needs more bytes than the
payload has.

A record fastavro reads but Arrow cannot hold (an ``int`` beyond 32 bits, which fastavro reads as an
unbounded varint, a decimal beyond its precision, a time of day past 24h) fails alone, naming its field.
fastavro's C reader wraps a varint longer than 64 bits around; ``varint_suspects`` finds the few payloads
that may hold one with a scan of all payloads in C, and only those are read by fastavro's pure-Python
reader (half as fast), whose varints are exact (so too large for their field).
"""

from __future__ import annotations

import io
import re
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any, Literal, cast

import fastavro
import pyarrow as pa
from fastavro._read_py import schemaless_reader as exact_schemaless_reader

from schemas.arrow_batches import conform_batch, contains_map, map_batch_leaves, map_leaves
from schemas.avro_arrow import (
    AvroSchema,
    ValueOutOfRange,
    avro_to_arrow_schema,
    load_avro_schema,
    physical_avro_schema,
    to_logical,
    to_physical,
)
from schemas.avro_columns import plan_for
from schemas.base import NULL_PAYLOAD_REASON, Decoded, DecodeFailure, EncodeError

ParsedSchema = Any  # fastavro's parsed schema (a dict it annotates)

_schemaless_reader = fastavro.schemaless_reader  # fastavro's C reader, looked up once
_UNFIT = (ValueOutOfRange, pa.ArrowInvalid, pa.ArrowTypeError, OverflowError)
"""What building the Arrow batch raises for a decoded value its field's type cannot hold."""
_PAD = b"\0"
"""Read after a payload written with another schema: fastavro does not notice a short read when it skips a
field the reader schema drops, but a length past the payload's end then reads this byte, and the record is
seen to run past it."""
_HIGH_BITS = bytes([0, 0] + [2] * 126 + [255] * 128)
"""``translate`` table: bytes with the high bit set to 0xff, 0x00 and 0x01 to 0x00, the others to 0x02."""
_PAST_64_BITS = (b"\xff" * 10, b"\xff" * 9 + b"\x02")
"""In translated bytes, what a varint longer than 64 bits looks like: ten bytes with the high bit, or nine
and then a last byte above 1 (a valid ten-byte varint ends with 0x00 or 0x01)."""
_PAST_64_BITS_RUN = re.compile(b"|".join(map(re.escape, _PAST_64_BITS)))


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
        self._column_plan = plan_for(physical)  # None: rows go through fastavro's writer one by one
        self._struct_type = pa.struct(list(self.physical_schema))
        # fastavro writes maps from dicts; Arrow's dict conversion is ~3x slower, so only ask for it if needed
        self._maps_as_pydicts: Literal["strict"] | None = "strict" if contains_map(self._struct_type) else None

    @classmethod
    def from_file(cls, path: Path) -> AvroCodec:
        return cls(load_avro_schema(path), source=str(path))

    def read_body(self, payload: bytes, start: int = 0, writer: ParsedSchema | None = None, *,
                  exact: bool = False) -> dict[str, Any]:
        """Read the one record in ``payload`` from ``start``: it must end exactly at the payload's end.

        ``writer`` is the writer's parsed physical schema when it differs from this (reader) schema; fastavro
        then applies Avro schema resolution. ``exact`` reads with fastavro's pure-Python reader (see
        ``varint_suspects``). Raises on truncated or invalid bytes (see ``body_failure``).
        """
        read = exact_schemaless_reader if exact else _schemaless_reader
        if writer is None:
            buffer = io.BytesIO(payload)
            if start:
                buffer.seek(start)
            record = read(buffer, self.parsed, None)
        else:  # only schema resolution skips fields, so only then can a short read go unnoticed (see _PAD)
            buffer = io.BytesIO(payload + _PAD)
            buffer.seek(start)
            record = read(buffer, writer, self.parsed)
        end = buffer.tell()
        if end > len(payload):
            raise EOFError("a length runs past the end of the payload")
        if end != len(payload):
            raise _TrailingBytes(len(payload) - end)
        return cast("dict[str, Any]", record)  # the top-level type is a record (checked in avro_to_arrow_schema)

    def read_columns(self, values: pa.BinaryArray, prefix: bytes = b"") -> Decoded | None:
        """Every value (``prefix`` then one record) decoded column-wise in one go; None when the schema has
        no column plan, or a value is null or not exactly such a record, for the caller to decode the
        batch record by record (which names each bad one)."""
        if self._column_plan is None:
            return None
        physical = self._column_plan.decode(values, self.physical_schema, prefix)
        if physical is None:
            return None
        try:
            batch = map_batch_leaves(physical, self.arrow_schema, to_logical)
        except _UNFIT:
            return None  # a logical value out of range: the per-record path isolates and names it
        return Decoded(batch, list(range(len(values))), [])

    def records_to_batch(self, records: list[dict[str, Any]]) -> pa.RecordBatch:
        """Build the Arrow batch column-wise in C++, then convert physical columns to their logical types.

        Raises one of ``_UNFIT`` if a record holds a value its field's type cannot hold (see ``decoded``).
        """
        records_array = cast(pa.StructArray, pa.array(records, type=self._struct_type))  # a struct type gives one
        physical = pa.RecordBatch.from_struct_array(records_array)
        return map_batch_leaves(physical, self.arrow_schema, to_logical)

    def decoded(self, records: list[dict[str, Any]], indices: list[int],
                failures: list[DecodeFailure]) -> Decoded:
        """The Decoded result; records whose values do not fit Arrow are isolated into failures."""
        try:
            return Decoded(self.records_to_batch(records), indices, failures)
        except _UNFIT:
            kept_records, kept_indices = [], []
            for record, index in zip(records, indices):
                try:
                    self.records_to_batch([record])
                except _UNFIT as exc:
                    failures.append(DecodeFailure(index, f"Avro payload is invalid for the schema from "
                                                         f"{self.source}: {self._unfit_field(record, exc)}"))
                    continue
                kept_records.append(record)
                kept_indices.append(index)
            failures.sort(key=lambda failure: failure.index)
            return Decoded(self.records_to_batch(kept_records), kept_indices, failures)

    def _unfit_field(self, record: dict[str, Any], exc: Exception) -> str:
        """Which top-level field of ``record`` its type cannot hold, and why (``exc``, if none alone)."""
        for physical, logical in zip(self.physical_schema, self.arrow_schema):
            value = record.get(physical.name)
            if isinstance(value, int) and not isinstance(value, bool) and pa.types.is_integer(physical.type):
                bits = physical.type.bit_width
                if not -(1 << (bits - 1)) <= value < 1 << (bits - 1):
                    return f"field '{physical.name}': {value} does not fit in {bits} bits (Avro {_AVRO_INTS[bits]})"
            try:
                map_leaves(pa.array([value], type=physical.type), logical.type, to_logical)
            except _UNFIT as field_exc:
                return f"field '{physical.name}': {field_exc}"
        return f"{type(exc).__name__}: {exc}"

    def encode_values(self, batch: pa.RecordBatch, prefix: bytes = b"") -> pa.BinaryArray:
        """Every row as ``prefix`` then its Avro record, as a binary column: column-wise when the schema has
        a plan, else row by row in fastavro (which names a row that does not fit)."""
        conformed = conform_batch(batch, self.arrow_schema, fmt="avro")
        physical = map_batch_leaves(conformed, self.physical_schema, to_physical)
        if self._column_plan is not None and (encoded := self._column_plan.encode(physical, prefix)) is not None:
            return encoded
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
        return pa.array(out, pa.binary())


_AVRO_INTS = {32: "int", 64: "long"}


def varint_suspects(payloads: Sequence[bytes | None]) -> set[int]:
    """Positions of the payloads that may hold a varint longer than 64 bits (see ``_PAST_64_BITS``).

    One translate and one regex scan over all payloads joined by a zero byte (which translates to 0x00, so no
    run crosses two payloads); each match is placed in its payload by a binary search over where the payloads
    start. Payloads with long runs of high-bit bytes (a double followed by a long varint, text in a non-Latin
    script, binary values) can be suspects too: they are only read more slowly."""
    bodies = cast(Sequence[bytes], payloads) if None not in payloads else [payload or b"" for payload in payloads]
    high = b"\0".join(bodies).translate(_HIGH_BITS)
    if _PAST_64_BITS[1][:-1] not in high:
        return set()
    next_starts = list(accumulate(len(body) + 1 for body in bodies))
    return {bisect_right(next_starts, match.start()) for match in _PAST_64_BITS_RUN.finditer(high)}


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
        return self.decode_column(pa.array(payloads, pa.binary()))

    def decode_column(self, values: pa.BinaryArray) -> Decoded:
        if (whole := self._codec.read_columns(values)) is not None:
            return whole
        return self._decode_records(values.to_pylist())

    def _decode_records(self, payloads: Sequence[bytes | None]) -> Decoded:
        """Record by record in fastavro: each bad payload becomes a failure that names its problem."""
        codec = self._codec
        records: list[dict[str, Any]] = []
        indices: list[int] = []
        failures: list[DecodeFailure] = []
        suspects = varint_suspects(payloads)
        for index, payload in enumerate(payloads):
            if payload is None:
                failures.append(DecodeFailure(index, NULL_PAYLOAD_REASON))
                continue
            try:
                records.append(codec.read_body(payload, exact=index in suspects))
            except Exception as exc:  # noqa: BLE001 - any fastavro error means this one payload is bad
                failures.append(DecodeFailure(index, body_failure(exc, len(payload), codec.source)))
                continue
            indices.append(index)
        return codec.decoded(records, indices, failures)

    def encode(self, batch: pa.RecordBatch) -> list[bytes]:
        return cast(list[bytes], self._codec.encode_values(batch).to_pylist())

    def encode_column(self, batch: pa.RecordBatch) -> pa.ChunkedArray[Any]:
        return pa.chunked_array([self._codec.encode_values(batch)], pa.binary())
