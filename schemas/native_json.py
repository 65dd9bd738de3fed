"""Flat JSON objects read into and written from Arrow arrays in C (``schemas/_native_json.c``), the ``json``
format's fast path.

For a schema whose JSON (wire) types are all 64-bit integers, doubles, booleans or strings (timestamps, dates,
times and decimals are strings on the wire), one C pass per payload fills the Arrow buffers: no joined
buffer, no token scans, no Arrow JSON reader. It takes a batch only when every payload is one it reads to the
same values as the reference path (``schemas.json_format``: Arrow's reader behind orjson-strict checks), and
answers None for the whole batch otherwise, so the reference path decodes it and gives every verdict and
reason: a payload's verdict never depends on which path read it (tests/schemas/test_native_json.py checks
both paths against each other on generated valid and broken payloads).

Writing: the rows of a batch whose columns are all flat (timestamps too, formatted in C) are written in C, byte
for byte as DuckDB's ``to_json`` (the writer for every other batch) writes them after the column-wise
conversion to printable types (tests/schemas/test_native_json.py compares them).

It is built at install when a C compiler is there (optional, like ``connectors/_native_io.c``).
``EPOCHLINE_NATIVE_JSON=0`` turns it off; the reference path then decodes every batch and DuckDB
writes every row.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from schemas.extensions import array_from_buffers, binary_array_from_buffers, column_buffers, load_extension

SWITCH = "EPOCHLINE_NATIVE_JSON"
"""Environment variable: ``0`` (or ``false``/``off``/``no``) keeps the C reader and writer unused."""

_MAX_FIELDS = 256
"""The most fields the C reader reads (``MAX_FIELDS`` in the C file); wider schemas take the reference path."""

_KINDS: dict[pa.DataType, str] = {pa.int64(): "i", pa.float64(): "d", pa.bool_(): "b", pa.string(): "s"}
"""The wire types the C reader fills and the writer writes, by their one-letter codes (the writer also
writes timestamps: ``_written_kind``)."""


@functools.cache
def native_json() -> ModuleType | None:
    """The C module, or None when it is switched off or was not built (logged once, with the reason)."""
    return load_extension("schemas._native_json", switch=SWITCH, what="native JSON codec",
                          instead="JSON is read by Arrow's reader, written by DuckDB")


class FlatJsonReader:
    """Reads payloads of one wire schema; made by ``flat_json_reader``."""

    def __init__(self, module: ModuleType, wire: pa.Schema) -> None:
        self._decode = module.decode
        self._wire = wire
        self._names = tuple(name.encode() for name in wire.names)
        self._kinds = "".join(_KINDS[fld.type] for fld in wire)

    def read(self, values: pa.BinaryArray) -> pa.RecordBatch | None:
        """The payloads (a binary array without nulls) as a batch of the wire schema, every field nullable
        (the caller finds nulls in required fields), or None when the reference path must read them."""
        if values.type != pa.binary():  # the C reader reads int32 offsets
            return None
        _, offsets, data = values.buffers()
        buffers = self._decode(data if data is not None else b"", offsets, values.offset, len(values),
                               self._names, self._kinds)
        if buffers is None:
            return None
        return pa.RecordBatch.from_arrays([array_from_buffers(fld.type, len(values), field_buffers)
                                           for fld, field_buffers in zip(self._wire, buffers)], schema=self._wire)


def flat_json_reader(wire: pa.Schema) -> FlatJsonReader | None:
    """A C reader for ``wire``, or None when a field's type is not flat, the schema is wider than the C reader
    reads, or the C module is not there."""
    flat = all(fld.type in _KINDS for fld in wire) and len(set(wire.names)) == len(wire.names)
    if not flat or len(wire) > _MAX_FIELDS:
        return None
    module = native_json()
    return FlatJsonReader(module, wire) if module is not None else None


class FlatJsonWriter:
    """Writes rows as JSON objects in C; made by ``flat_json_writer``."""

    def __init__(self, module: ModuleType) -> None:
        self._encode = module.encode

    def write(self, batch: pa.RecordBatch) -> pa.BinaryArray | None:
        """The rows as JSON objects (keys in column order, nulls as ``null``), byte for byte as the ``json``
        format's DuckDB writer prints them after ``schemas.json_wire.value_to_text`` (non-finite doubles as
        null, timestamps as ISO-8601 text), or None when a column is not flat (or a timestamp not in years
        1-9999)."""
        names = batch.schema.names
        if len(set(names)) != len(names):
            return None
        columns = []
        for name, column in zip(names, batch.columns):
            kind = _written_kind(column)
            if kind is None:
                return None
            columns.append((name.encode(), kind, *column_buffers(column)))
        written = self._encode(batch.num_rows, columns)
        if written is None:  # more text than int32 offsets address
            return None
        return binary_array_from_buffers(batch.num_rows, written)


def flat_json_writer() -> FlatJsonWriter | None:
    """A C writer, or None when the C module is not there."""
    module = native_json()
    return FlatJsonWriter(module) if module is not None else None


_FRACTION_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}
_FIRST_SECOND, _LAST_SECOND = -62_135_596_800, 253_402_300_799
"""0001-01-01T00:00:00 and 9999-12-31T23:59:59 in seconds since the epoch: the years written as 4 digits."""


def _written_kind(column: pa.Array[Any]) -> str | None:
    """The C writer's code for a column's values, or None when it does not write them."""
    kind = column.type
    if kind in _KINDS:
        return _KINDS[kind]
    if not pa.types.is_timestamp(kind):
        return None
    digits = _FRACTION_DIGITS[kind.unit]
    if column.null_count < len(column):
        per_second = 10 ** digits
        low, high = pc.min_max(column.cast(pa.int64())).values()
        if low.as_py() < _FIRST_SECOND * per_second or high.as_py() > (_LAST_SECOND + 1) * per_second - 1:
            return None
    return f"t{digits}{'Z' if kind.tz is not None else ''}"
