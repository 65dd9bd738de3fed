"""Avro records of primitive fields encoded and decoded column by column, without a Python object per value.

Why: fastavro reads and writes one row at a time through a dict: about 7-9 µs per row each way on the
benchmark's four fields, the largest single cost of an Avro source or sink. For a record whose fields are
all primitive (boolean, int, long, float, double, string, bytes) or a union of ``null`` and one of them,
every field of the whole batch can be handled at once, from and into Arrow binary columns.

Two engines do it, with the same answers. The C module ``schemas/_native_avro.c`` (built at install when a C
compiler is there; ``EPOCHLINE_NATIVE_AVRO=0`` turns it off) walks each payload once, filling the Arrow
buffers, and writes each row once from them: 0.07-0.13 µs per record each way on the benchmark's records,
against 0.55-0.85 for the second engine, numpy and Arrow compute, measured on 2026-12-04 (bench/README.md).

Without the C module, encoding uses Arrow compute kernels, and ``binary_join_element_wise`` then concatenates
the fields of each row in C++: a varint is the 7-bit groups of the zigzag value, each group present where the
value needs it (an empty element where it does not); a double is its little-endian bytes, which is exactly
the float64 column's data buffer; a string is its length's varint followed by its UTF-8 bytes. Decoding walks
the payloads' data buffer one field at a time for every row at once with numpy (``_Reader``): where each
row's next field starts is an array, a varint is read one 7-bit group per step for the rows whose previous
byte had its high bit set, a double is eight gathered bytes seen as float64, a string's bytes are gathered
into the Arrow data buffer.

Decoding is only ever an exact shortcut: any payload that does not end exactly after its record, a varint
longer than 64 bits or an ``int`` beyond 32, an invalid union branch, boolean or UTF-8, makes ``decode``
return None, and the caller reads that batch record by record with fastavro, which names each bad record's
problem.

Anything else (records inside records, arrays, maps, enums, fixed, other unions, logical types that stay
in the physical schema, a record without fields) has no plan and keeps fastavro; so does a batch with a null
in a field that is not nullable, whose row fastavro then names in the error. ``tests/schemas/
test_avro_columns.py`` holds both engines, in both directions, to fastavro's bytes and records on generated
batches.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.avro_arrow import AvroSchema
from schemas.extensions import array_from_buffers, binary_array_from_buffers, column_buffers, load_extension

if TYPE_CHECKING:  # annotations only
    import numpy.typing as npt

    Positions = npt.NDArray[np.int64]
    Rows = slice | npt.NDArray[np.intp]  # which rows of the batch a read is for: all (a slice), or these

_ARROW_OF_PRIMITIVE = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
                       "double": pa.float64(), "string": pa.string(), "bytes": pa.binary()}
_WIDTH = {"boolean": 1, "float": 4, "double": 8}
_VARINT_GROUPS = 10  # a 64-bit zigzag value needs at most ten 7-bit groups
_U64 = {n: pa.scalar(n, pa.uint64()) for n in (0, 0x7F, 0x80, *range(7, 7 * _VARINT_GROUPS, 7))}
"""uint64 operands: a Python int would make Arrow cast the uint64 values to int64 (and fail above 2**63)."""
_EMPTY = pa.scalar(b"", pa.binary())
"""What an absent part joins as. Not null with ``null_handling="skip"``: pyarrow 26 then drops the rows whose
parts are all null from the result instead of giving them an empty value."""
_BRANCH_BYTE = (0x00, 0x02)
"""The union branch indexes 0 and 1 as Avro writes them (zigzag varints)."""
_BRANCH = tuple(pa.scalar(bytes([byte]), pa.binary()) for byte in _BRANCH_BYTE)
_NUMPY_OF_FIXED: dict[str, np.dtype[Any]] = {"float": np.dtype("<f4"), "double": np.dtype("<f8")}
_LETTER = {"boolean": "b", "int": "i", "long": "l", "float": "f", "double": "d", "string": "s", "bytes": "y"}
"""The C module's one-letter code of each primitive kind."""
_INT32 = (-(2**31), 2**31 - 1)
_MAX_OFFSET = 2**31 - 1  # the int32 offsets of Arrow's string and binary arrays
_MAX_NATIVE_FIELDS = 256
"""The most fields the C module reads and writes (``MAX_FIELDS`` in the C file); wider records take numpy."""

SWITCH = "EPOCHLINE_NATIVE_AVRO"
"""Environment variable: ``0`` (or ``false``/``off``/``no``) keeps the C module unused."""


@functools.cache
def native_avro() -> ModuleType | None:
    """The C module, or None when it is switched off or was not built (logged once, with the reason)."""
    return load_extension("schemas._native_avro", switch=SWITCH, what="native Avro codec",
                          instead="Avro records are read and written column-wise in numpy and Arrow compute")


@dataclass(frozen=True)
class _Field:
    name: str
    kind: str  # an Avro primitive type name, a key of _ARROW_OF_PRIMITIVE
    null_branch: int | None  # where "null" is in the field's union (0 or 1); None: not nullable


@dataclass(frozen=True)
class ColumnPlan:
    """How to encode and decode the records of one physical Avro schema column-wise (``plan_for`` makes
    one); ``native`` is the C module, or None for numpy and Arrow compute."""

    fields: tuple[_Field, ...]
    native: ModuleType | None

    @functools.cached_property
    def _kinds(self) -> str:
        """Each field's kind as the C module's letter."""
        return "".join(_LETTER[spec.kind] for spec in self.fields)

    @functools.cached_property
    def _branches(self) -> str:
        """Each field's place of null in its union (``0`` or ``1``), ``-`` where it is not nullable."""
        return "".join("-" if spec.null_branch is None else str(spec.null_branch) for spec in self.fields)

    def encode(self, batch: pa.RecordBatch, prefix: bytes = b"") -> pa.BinaryArray | None:
        """Every row of ``batch`` (physical types, in the schema's field order) as Avro bytes after
        ``prefix``; None when the batch does not fit the plan (a type differs, or a null where the schema
        has none), or its bytes would pass int32 offsets, for the caller to encode row by row."""
        if [f.name for f in self.fields] != batch.schema.names:
            return None
        for spec, column in zip(self.fields, batch.columns):
            if column.type != _ARROW_OF_PRIMITIVE[spec.kind] or (spec.null_branch is None and column.null_count):
                return None
        if batch.num_rows == 0:
            return pa.array([], pa.binary())
        if self.native is not None:
            return self._encode_in_c(self.native, batch, prefix)
        parts: list[Any] = [pa.scalar(prefix, pa.binary())] if prefix else []
        for spec, column in zip(self.fields, batch.columns):
            if spec.null_branch is None:
                parts.append(_encoded(spec.kind, column))
            else:
                present = pc.is_valid(column)
                parts.append(pc.if_else(present, _BRANCH[1 - spec.null_branch], _BRANCH[spec.null_branch]))
                if column.null_count < len(column):
                    parts.append(pc.fill_null(_encoded(spec.kind, column), _EMPTY))
        return cast(pa.BinaryArray, _joined(parts))

    def decode(self, values: pa.BinaryArray, schema: pa.Schema, prefix: bytes = b"") -> pa.RecordBatch | None:
        """The records of ``values`` (each ``prefix`` then one Avro record) as a batch of ``schema``, the
        plan's physical Arrow schema; None when any value is null or not exactly such a record, for the
        caller to read the batch record by record."""
        if values.null_count or values.type != pa.binary():
            return None
        if self.native is not None:
            return self._decode_in_c(self.native, values, schema, prefix)
        try:
            reader = _Reader(values, prefix)
            columns = [reader.column(spec) for spec in self.fields]
            reader.expect_all_read()
        except _Malformed:
            return None
        return pa.RecordBatch.from_arrays(columns, schema=schema)

    def _encode_in_c(self, native: ModuleType, batch: pa.RecordBatch, prefix: bytes) -> pa.BinaryArray | None:
        columns = [column_buffers(column) for column in batch.columns]
        written = native.encode(batch.num_rows, prefix, self._kinds, self._branches, columns)
        return binary_array_from_buffers(batch.num_rows, written) if written is not None else None

    def _decode_in_c(self, native: ModuleType, values: pa.BinaryArray, schema: pa.Schema,
                     prefix: bytes) -> pa.RecordBatch | None:
        _, offsets, data = values.buffers()
        buffers = native.decode(data if data is not None else b"", offsets, values.offset, len(values), prefix,
                                self._kinds, self._branches)
        if buffers is None:
            return None
        return pa.RecordBatch.from_arrays([array_from_buffers(target.type, len(values), field_buffers)
                                           for target, field_buffers in zip(schema, buffers)], schema=schema)


class _Malformed(Exception):
    """A payload of the batch is not a record of the plan: the batch is read record by record instead."""


class _Reader:
    """The payloads' data buffer, and where each row's next field starts."""

    def __init__(self, values: pa.BinaryArray, prefix: bytes) -> None:
        _, offsets, data = values.buffers()
        self.data = np.frombuffer(memoryview(data if data is not None else b""), np.uint8)
        assert offsets is not None  # a binary array always has its offsets
        rows = slice(values.offset, values.offset + len(values) + 1)
        bounds = np.frombuffer(memoryview(offsets), np.int32)[rows].astype(np.int64)
        starts = bounds[:-1]
        self.ends: Positions = bounds[1:]
        self.at: Positions = starts + len(prefix)
        if np.any(self.at > self.ends):
            raise _Malformed
        for offset, byte in enumerate(prefix):
            if np.any(self.data[starts + offset] != byte):
                raise _Malformed

    def column(self, spec: _Field) -> pa.Array[Any]:
        if spec.null_branch is None:
            return self._values(spec.kind, slice(None))
        branch = self._bytes(slice(None), 1)[:, 0]
        present = branch == _BRANCH_BYTE[1 - spec.null_branch]
        if np.any(~present & (branch != _BRANCH_BYTE[spec.null_branch])):
            raise _Malformed  # a branch index the union does not have
        values = self._values(spec.kind, np.flatnonzero(present))
        places = np.cumsum(present) - 1  # row -> its value among the present ones
        return values.take(pa.array(places, mask=~present))

    def expect_all_read(self) -> None:
        if not np.array_equal(self.at, self.ends):
            raise _Malformed  # bytes left after a record

    def _values(self, kind: str, rows: Rows) -> pa.Array[Any]:
        if kind in ("int", "long"):
            values = _unzigzag(self._varints(rows))
            if kind == "int":
                if values.size and (values.min() < _INT32[0] or values.max() > _INT32[1]):
                    raise _Malformed
                return pa.array(values.astype(np.int32))
            return pa.array(values)
        if kind == "boolean":
            flags = self._bytes(rows, 1)[:, 0]
            if np.any(flags > 1):
                raise _Malformed
            return pa.array(flags.astype(np.bool_))
        if kind in _NUMPY_OF_FIXED:
            dtype = _NUMPY_OF_FIXED[kind]
            return cast("pa.Array[Any]", pa.array(self._bytes(rows, dtype.itemsize).view(dtype).ravel()))
        return self._strings(rows, pa.string() if kind == "string" else pa.binary())

    def _bytes(self, rows: Rows, width: int) -> npt.NDArray[np.uint8]:
        """The next ``width`` bytes of each row, one row of the matrix per row."""
        at = self.at[rows]  # a view when rows is a slice: read before moving on
        if np.any(at + width > self.ends[rows]):
            raise _Malformed  # truncated
        gathered = self.data[at[:, None] + np.arange(width)]
        self.at[rows] = at + width
        return cast("npt.NDArray[np.uint8]", gathered)

    def _varints(self, rows: Rows) -> npt.NDArray[np.uint64]:
        """The next varint of each row: group k is read only for the rows whose group k - 1 said more follow."""
        at, ends = self.at[rows].copy(), self.ends[rows]
        values = np.zeros(len(at), np.uint64)
        going = np.arange(len(at))
        for group in range(_VARINT_GROUPS):
            where = at[going]
            if np.any(where >= ends[going]):
                raise _Malformed  # truncated inside the varint
            byte = self.data[where]
            if group == _VARINT_GROUPS - 1 and np.any(byte > 1):
                raise _Malformed  # more than 64 bits
            values[going] |= (byte & 0x7F).astype(np.uint64) << np.uint64(7 * group)
            at[going] = where + 1
            more = (byte & 0x80) != 0
            if not more.any():
                break
            going = going[more]
        self.at[rows] = at
        return values

    def _strings(self, rows: Rows, arrow_type: pa.DataType) -> pa.Array[Any]:
        """A length varint, then that many bytes, per row: the bytes gathered into one Arrow data buffer."""
        lengths = _unzigzag(self._varints(rows))
        at = self.at[rows]
        if np.any(lengths < 0) or np.any(at + lengths > self.ends[rows]):
            raise _Malformed
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        if total > _MAX_OFFSET:
            raise _Malformed  # beyond the 32-bit offsets of one Arrow string array: left to the per-record path
        gathered = self.data[np.repeat(at - offsets[:-1], lengths) + np.arange(total)]
        self.at[rows] = at + lengths
        array = pa.Array.from_buffers(arrow_type, len(lengths),
                                      [None, _buffer(offsets.astype(np.int32)), _buffer(gathered)])
        try:
            array.validate(full=True)  # UTF-8 for strings
        except pa.ArrowInvalid:
            raise _Malformed from None
        return array


def _unzigzag(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """Zigzag back to signed: ``(n >> 1) ^ -(n & 1)``."""
    halves = (values >> np.uint64(1)).astype(np.int64)
    return cast("npt.NDArray[np.int64]", halves ^ -(values & np.uint64(1)).astype(np.int64))


def _buffer(values: npt.NDArray[Any]) -> pa.Buffer:
    """A numpy array's memory as an Arrow buffer, without a copy."""
    data = cast("pa.Buffer | None", pa.array(values).buffers()[1])
    assert data is not None  # a numeric array always has its data buffer
    return data


def plan_for(physical_schema: AvroSchema) -> ColumnPlan | None:
    """The column-wise plan for a record schema of primitive and nullable-primitive fields, else None."""
    if not isinstance(physical_schema, dict) or physical_schema.get("type") != "record":
        return None
    fields = []
    if not physical_schema["fields"]:
        return None  # no field to count the rows by
    for field in physical_schema["fields"]:
        spec = _field_of(field["name"], field["type"])
        if spec is None:
            return None
        fields.append(spec)
    return ColumnPlan(tuple(fields), native_avro() if len(fields) <= _MAX_NATIVE_FIELDS else None)


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


__all__ = ["SWITCH", "ColumnPlan", "native_avro", "plan_for"]
