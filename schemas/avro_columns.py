"""Avro encoding of flat records column by column in Arrow, without a Python object per value.

Why: fastavro writes one row at a time from a dict, so encoding a batch first builds a dict per row
(``to_pylist``) and then walks it in Cython: about 7-9 µs per row on the benchmark's four fields, the
largest single cost of an Avro sink. For a record whose fields are all primitive (boolean, int, long, float,
double, string, bytes) or a union of ``null`` and one of them, every field's bytes can be computed for the
whole column with Arrow compute kernels, and ``binary_join_element_wise`` then concatenates the fields of
each row in C++: a varint is the 7-bit groups of the zigzag value, each group present where the value needs
it (an empty element where it does not); a double is its little-endian bytes, which is exactly the float64
column's data buffer; a string is its length's varint followed by its UTF-8 bytes.

Anything else (records inside records, arrays, maps, enums, fixed, other unions, logical types that stay
in the physical schema) has no plan and keeps fastavro's writer; so does a batch with a null in a field that
is not nullable, whose row fastavro then names in the error. ``tests/schemas/test_avro_columns.py`` holds
the encoder to fastavro's bytes on generated batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc

from schemas.avro_arrow import AvroSchema

_ARROW_OF_PRIMITIVE = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
                       "double": pa.float64(), "string": pa.string(), "bytes": pa.binary()}
_WIDTH = {"boolean": 1, "float": 4, "double": 8}
_VARINT_GROUPS = 10  # a 64-bit zigzag value needs at most ten 7-bit groups
_U64 = {n: pa.scalar(n, pa.uint64()) for n in (0, 0x7F, 0x80, *range(7, 7 * _VARINT_GROUPS, 7))}
"""uint64 operands: a Python int would make Arrow cast the uint64 values to int64 (and fail above 2**63)."""
_EMPTY = pa.scalar(b"", pa.binary())
"""What an absent part joins as. Not null with ``null_handling="skip"``: pyarrow 26 then drops the rows whose
parts are all null from the result instead of giving them an empty value."""
_BRANCH = (pa.scalar(b"\x00", pa.binary()), pa.scalar(b"\x02", pa.binary()))
"""The union branch indexes 0 and 1 as Avro writes them (zigzag varints)."""


@dataclass(frozen=True)
class _Field:
    name: str
    kind: str  # an Avro primitive type name, a key of _ARROW_OF_PRIMITIVE
    null_branch: int | None  # where "null" is in the field's union (0 or 1); None: not nullable


@dataclass(frozen=True)
class ColumnPlan:
    """How to encode the records of one physical Avro schema column-wise (``plan_for`` makes one)."""

    fields: tuple[_Field, ...]

    def encode(self, batch: pa.RecordBatch, prefix: bytes = b"") -> list[bytes] | None:
        """Every row of ``batch`` (physical types, in the schema's field order) as Avro bytes after
        ``prefix``; None when the batch does not fit the plan (a type differs, or a null where the schema
        has none), for the caller to encode row by row."""
        if batch.num_rows == 0:
            return []
        if [f.name for f in self.fields] != batch.schema.names:
            return None
        parts: list[Any] = [pa.scalar(prefix, pa.binary())] if prefix else []
        for spec, column in zip(self.fields, batch.columns):
            if column.type != _ARROW_OF_PRIMITIVE[spec.kind]:
                return None
            if spec.null_branch is None:
                if column.null_count:
                    return None
                parts.append(_encoded(spec.kind, column))
            else:
                present = pc.is_valid(column)
                parts.append(pc.if_else(present, _BRANCH[1 - spec.null_branch], _BRANCH[spec.null_branch]))
                if column.null_count < len(column):
                    parts.append(pc.fill_null(_encoded(spec.kind, column), _EMPTY))
        return cast("list[bytes]", _joined(parts).to_pylist())


def plan_for(physical_schema: AvroSchema) -> ColumnPlan | None:
    """The column-wise plan for a record schema of primitive and nullable-primitive fields, else None."""
    if not isinstance(physical_schema, dict) or physical_schema.get("type") != "record":
        return None
    fields = []
    for field in physical_schema["fields"]:
        spec = _field_of(field["name"], field["type"])
        if spec is None:
            return None
        fields.append(spec)
    return ColumnPlan(tuple(fields))


def _field_of(name: str, avro_type: Any) -> _Field | None:
    if isinstance(avro_type, list):
        if len(avro_type) != 2 or "null" not in avro_type:
            return None
        null_branch = avro_type.index("null")
        kind = _primitive(avro_type[1 - null_branch])
        return _Field(name, kind, null_branch) if kind is not None else None
    kind = _primitive(avro_type)
    return _Field(name, kind, None) if kind is not None else None


def _primitive(avro_type: Any) -> str | None:
    """The primitive type name of a bare or ``{"type": ...}`` primitive without a logical type, else None."""
    if isinstance(avro_type, dict):
        if "logicalType" in avro_type:
            return None
        avro_type = avro_type.get("type")
    return avro_type if isinstance(avro_type, str) and avro_type in _ARROW_OF_PRIMITIVE else None


def _encoded(kind: str, column: pa.Array[Any]) -> pa.Array[Any]:
    """The column's values as Avro bytes, one binary element per row (nulls stay null)."""
    if kind in ("int", "long"):
        return _varints(_zigzag(column))
    if kind in ("string", "bytes"):
        data = cast(pa.BinaryArray, column.cast(pa.binary()))
        return _joined([_varints(_zigzag(pc.binary_length(data))), data])
    if kind == "boolean":
        column = column.cast(pa.uint8())
    return _fixed_width(column, _WIDTH[kind])


def _zigzag(column: pa.Array[Any]) -> pa.Array[Any]:
    """``(n << 1) ^ (n >> 63)`` as uint64 (Arrow refuses a signed shift by 63, so the sign comes from ``< 0``)."""
    wide: pa.Array[Any] = column.cast(pa.int64())
    sign = pc.if_else(pc.less(wide, pa.scalar(0, pa.int64())), pa.scalar(-1, pa.int64()), pa.scalar(0, pa.int64()))
    return cast("pa.Array[Any]", pc.cast(pc.bit_wise_xor(pc.shift_left(wide, 1), sign), pa.uint64(), safe=False))


def _varints(values: pa.Array[Any]) -> pa.Array[Any]:
    """Unsigned values as Avro varints: group k (bits 7k..7k+6, high bit set when more follow) is present
    for k = 0 and wherever the value has bits from 7k up, else empty; a null value stays null."""
    largest = pc.max(values).as_py() or 0
    groups = min(_VARINT_GROUPS, max(1, (largest.bit_length() + 6) // 7))
    bytes_of_group: list[Any] = []
    from_here = values  # values >> 7k
    for k in range(groups):
        group = pc.bit_wise_and(from_here, _U64[0x7F])
        if k + 1 < _VARINT_GROUPS:  # the tenth group has nothing after it (and Arrow would not shift by 70)
            rest = pc.shift_right(values, _U64[7 * (k + 1)])
            group = pc.if_else(pc.not_equal(rest, _U64[0]), pc.bit_wise_or(group, _U64[0x80]), group)
        encoded = _fixed_width(group.cast(pa.uint8()), 1)
        if k:
            encoded = pc.if_else(pc.not_equal(from_here, _U64[0]), encoded, _EMPTY)
        bytes_of_group.append(encoded)
        from_here = rest
    return cast("pa.Array[Any]", bytes_of_group[0]) if len(bytes_of_group) == 1 else _joined(bytes_of_group)


def _joined(parts: list[Any]) -> pa.Array[Any]:
    """Each row's parts (arrays, or scalars for every row) concatenated, in C++."""
    return cast("pa.Array[Any]", pc.binary_join_element_wise(*parts, _EMPTY))


def _fixed_width(column: pa.Array[Any], width: int) -> pa.Array[Any]:
    """A fixed-width numeric column's little-endian bytes as a binary column of ``width``-byte values,
    sharing its data buffer; nulls stay null."""
    data = column.buffers()[1]
    assert data is not None  # a numeric array always has its data buffer
    values = data.slice(column.offset * width, len(column) * width)
    validity = pc.is_valid(column).buffers()[1] if column.null_count else None  # a fresh array: offset 0
    return pa.Array.from_buffers(pa.binary(), len(column), [validity, _offsets(len(column), width), values])


def _offsets(rows: int, width: int) -> pa.Buffer:
    """The int32 offsets 0, width, 2 * width, ..., rows * width, built in C++."""
    steps = pc.cumulative_sum(pa.repeat(pa.scalar(width, pa.int32()), rows))
    return cast(pa.Buffer, pa.concat_arrays([pa.array([0], pa.int32()), steps]).buffers()[1])


__all__ = ["ColumnPlan", "plan_for"]
