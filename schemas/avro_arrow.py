"""Avro schemas mapped to Arrow types, and the "physical" forms that make Avro decoding column-wise.

Mapping (Avro -> Arrow):

==========================================  =========================================================
null / boolean / int / long                  null / bool / int32 / int64
float / double / bytes / string              float32 / float64 / binary / string
record                                       struct (fields keep their order and nullability)
array / map                                  list<T> / map<string, T>
enum                                         string (the symbol; dictionary encoding is left to callers)
fixed                                        fixed_size_binary(size)
["null", T] (either order)                   T, nullable
timestamp-millis / -micros / -nanos          timestamp("ms" / "us" / "ns", tz="UTC")
local-timestamp-millis / -micros / -nanos    timestamp("ms" / "us" / "ns") without time zone
date                                         date32
time-millis / time-micros                    time32("ms") / time64("us")
decimal (bytes or fixed)                     decimal128(precision, scale) (decimal256 above 38 digits)
uuid (on string)                             string
any other logicalType                        its underlying type (as the Avro spec requires)
==========================================  =========================================================

Unions of several non-null types and recursive records have no Arrow equivalent here: they raise
``SchemaError`` naming the field.

Why "physical" schemas: fastavro turns every timestamp/date/time into a Python ``datetime``/``date``/
``time`` object and every decimal into a ``Decimal`` (slow: ~10-30 us each), and Arrow then turns them back
into integers. Reading with a copy of the Avro schema whose time-like, uuid and decimal ``logicalType``
annotations are removed yields what Avro stores: plain integers, which Arrow casts to the logical type in
one vectorised, zero-copy step (the integer IS Arrow's storage value for these types), and big-endian
two's-complement bytes, which ``decimal_from_avro_bytes`` packs into Arrow's 16/32-byte little-endian
decimal storage (one ``int.from_bytes``/``to_bytes`` per value, no ``Decimal`` objects). The physical
Arrow schema is simply the mapping of the physical Avro schema, so both always agree.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, cast

import fastavro
import pyarrow as pa
import pyarrow.compute as pc

from schemas.base import SchemaError
from schemas.text_files import TextFileError, read_text_file

AvroSchema = str | list[Any] | dict[str, Any]

_PRIMITIVES: dict[str, pa.DataType] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}

# logicalType -> (Avro base type it must annotate, Arrow type); all are read as their base type (see above)
_TIME_LIKE: dict[str, tuple[str, pa.DataType]] = {
    "timestamp-millis": ("long", pa.timestamp("ms", tz="UTC")),
    "timestamp-micros": ("long", pa.timestamp("us", tz="UTC")),
    "timestamp-nanos": ("long", pa.timestamp("ns", tz="UTC")),
    "local-timestamp-millis": ("long", pa.timestamp("ms")),
    "local-timestamp-micros": ("long", pa.timestamp("us")),
    "local-timestamp-nanos": ("long", pa.timestamp("ns")),
    "date": ("int", pa.date32()),
    "time-millis": ("int", pa.time32("ms")),
    "time-micros": ("long", pa.time64("us")),
    "uuid": ("string", pa.string()),
}

_MAX_DECIMAL128_PRECISION = 38


def load_avro_schema(path: Path) -> AvroSchema:
    """Read and validate an ``.avsc`` file; any problem is a ``SchemaError`` naming the file."""
    try:
        text = read_text_file(Path(path), "Avro schema file")
    except TextFileError as exc:
        raise SchemaError(str(exc)) from exc
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"Avro schema file {path} is not valid JSON: {exc}") from exc
    return parse_avro_schema(schema, where=str(path))


def parse_avro_schema(schema: Any, *, where: str) -> AvroSchema:
    """Check that ``schema`` is a valid Avro schema (fastavro's parser) and return it unchanged."""
    try:
        fastavro.parse_schema(copy.deepcopy(schema))
    except Exception as exc:  # fastavro raises several unrelated exception types for bad schemas
        raise SchemaError(f"invalid Avro schema in {where}: {exc}") from exc
    return cast(AvroSchema, schema)  # fastavro accepted it, so it is a name, a union or a type object


def avro_to_arrow_schema(schema: AvroSchema, *, where: str) -> pa.Schema:
    """The Arrow schema of the records ``schema`` describes (its top level must be a record)."""
    mapper = _AvroToArrow(where)
    top = mapper.resolve_reference(schema)
    if not isinstance(top, dict) or top.get("type") not in ("record", "error"):
        raise SchemaError(f"Avro schema in {where}: the top-level type must be a record, got {_describe(top)}")
    return pa.schema(mapper.record_fields(top, path=""))


def physical_avro_schema(schema: AvroSchema) -> AvroSchema:
    """A copy of ``schema`` without time-like, uuid and decimal ``logicalType`` annotations (see module doc)."""
    if isinstance(schema, list):
        return [physical_avro_schema(branch) for branch in schema]
    if not isinstance(schema, dict):
        return schema
    stripped = {key: physical_avro_schema(value) for key, value in schema.items() if key != "fields"}
    if schema.get("logicalType") in _TIME_LIKE or schema.get("logicalType") == "decimal":
        del stripped["logicalType"]
    if "fields" in schema:
        stripped["fields"] = [
            {**fld, "type": physical_avro_schema(fld["type"])} for fld in schema["fields"]
        ]
    return stripped


class ValueOutOfRange(ValueError):
    """A value Avro decoded that its field's Arrow type cannot hold (the record is invalid for its schema)."""


class DecimalOverflow(ValueOutOfRange):
    """An Avro decimal's unscaled integer has more digits than the schema's precision allows."""


_TIME_TICKS_A_DAY = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000, "ns": 86_400_000_000_000}


def to_logical(array: pa.Array[Any], target: pa.DataType) -> pa.Array[Any]:
    """Leaf conversion of a physically-read column to its Arrow type (use with ``map_leaves``).

    Raises ``ValueOutOfRange`` for a value the type cannot hold: a decimal beyond its precision, a time of
    day outside [0, 24h) (Arrow would build the array, and it would fail validation)."""
    if array.type == target:
        return array
    if pa.types.is_decimal(target):
        return decimal_from_avro_bytes(array, target)
    if pa.types.is_time(target) and array.null_count < len(array):
        low, high = pc.min_max(array).values()
        if low.as_py() < 0 or high.as_py() >= _TIME_TICKS_A_DAY[target.unit]:
            raise ValueOutOfRange(f"a time of day outside [0, 24h) is not a valid {target}")
    return array.cast(target)


def to_physical(array: pa.Array[Any], target: pa.DataType) -> pa.Array[Any]:
    """Leaf conversion of an Arrow column to what the physical Avro schema writes (use with ``map_leaves``)."""
    if array.type == target:
        return array
    if pa.types.is_decimal(array.type):
        return decimal_to_avro_bytes(array, target)
    return array.cast(target)


def decimal_from_avro_bytes(array: pa.Array[Any], target: pa.DataType) -> pa.Array[Any]:
    """Avro decimal bytes (big-endian two's-complement unscaled integers) as an Arrow decimal column.

    Raises ``DecimalOverflow`` for an unscaled integer of more than ``precision`` digits, even one that fits
    the storage's 16 or 32 bytes (Arrow would hold it, as a value that fails validation)."""
    width = target.byte_width
    unscaled = [0 if raw is None else int.from_bytes(raw, "big", signed=True) for raw in array.to_pylist()]
    limit = 10 ** cast(pa.Decimal128Type, target).precision  # or a Decimal256Type: both have one
    if unscaled and (max(unscaled) >= limit or min(unscaled) <= -limit):
        raise DecimalOverflow(f"a decimal value has more digits than {target} holds")
    data = b"".join(value.to_bytes(width, "little", signed=True) for value in unscaled)  # nulls: zero bytes
    validity = array.is_valid().buffers()[1] if array.null_count else None
    return pa.Array.from_buffers(target, len(array), [validity, pa.py_buffer(data)], null_count=array.null_count)


def decimal_to_avro_bytes(array: pa.Array[Any], target: pa.DataType) -> pa.Array[Any]:
    """An Arrow decimal column as Avro decimal bytes: minimal length for ``bytes``, sign-extended for ``fixed``."""
    width = array.type.byte_width
    data = cast(pa.Buffer, array.buffers()[1])  # a decimal column always has its data buffer
    storage = memoryview(data)[array.offset * width:(array.offset + len(array)) * width]
    size = target.byte_width if pa.types.is_fixed_size_binary(target) else None
    valid = array.is_valid().to_pylist()
    encoded: list[bytes | None] = []
    for position, is_valid in enumerate(valid):
        if not is_valid:
            encoded.append(None)
            continue
        unscaled = int.from_bytes(storage[position * width:(position + 1) * width], "little", signed=True)
        length = size or (unscaled if unscaled >= 0 else ~unscaled).bit_length() // 8 + 1
        encoded.append(unscaled.to_bytes(length, "big", signed=True))
    return pa.array(encoded, type=target)


class _AvroToArrow:
    """One mapping pass: remembers named types (records, enums, fixed) so later references resolve."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.named: dict[str, dict[str, Any]] = {}
        self.in_progress: set[int] = set()  # id() of the records being mapped, to detect recursion
        self.namespace = ""  # the enclosing namespace, inherited by names without one (Avro spec)

    def fail(self, path: str, problem: str) -> SchemaError:
        location = f"field '{path}'" if path else "top level"
        return SchemaError(f"Avro schema in {self.where}, {location}: {problem}")

    def resolve_reference(self, schema: AvroSchema) -> AvroSchema:
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            return self.named.get(schema, schema)
        return schema

    def record_fields(self, record: dict[str, Any], path: str) -> list[pa.Field[pa.DataType]]:
        full = self.register(record)
        enclosing, self.namespace = self.namespace, full.rpartition(".")[0]
        self.in_progress.add(id(record))
        fields = [self.field(fld["name"], fld["type"], _join(path, fld["name"])) for fld in record["fields"]]
        self.in_progress.discard(id(record))
        self.namespace = enclosing
        return fields

    def register(self, named: dict[str, Any]) -> str:
        """Remember a named type under its full name and its short name; return the full name."""
        name = named["name"]
        namespace = named.get("namespace", self.namespace)
        full = name if "." in name or not namespace else f"{namespace}.{name}"
        self.named[full] = named
        self.named[full.rpartition(".")[2]] = named
        return full

    def field(self, name: str, schema: AvroSchema, path: str) -> pa.Field[pa.DataType]:
        arrow_type, nullable = self.nullable_type(schema, path)
        return pa.field(name, arrow_type, nullable=nullable)

    def nullable_type(self, schema: AvroSchema, path: str) -> tuple[pa.DataType, bool]:
        if isinstance(schema, list):
            branches = [b for b in schema if b != "null"]
            has_null = len(branches) < len(schema)
            if not branches:
                return pa.null(), True
            if len(branches) > 1:
                raise self.fail(
                    path,
                    f"union of several non-null types {[_describe(b) for b in branches]} is not supported "
                    "(only [\"null\", T] maps to Arrow)",
                )
            return self.arrow_type(branches[0], path), has_null
        arrow_type = self.arrow_type(schema, path)
        return arrow_type, pa.types.is_null(arrow_type)

    def arrow_type(self, schema: AvroSchema, path: str) -> pa.DataType:
        if isinstance(schema, str):
            return self.named_or_primitive(schema, path)
        if isinstance(schema, list):
            raise self.fail(path, "a union directly inside a union is not valid Avro")
        kind = schema.get("type")
        if isinstance(kind, (dict, list)):
            return self.arrow_type(kind, path)
        logical = schema.get("logicalType")
        if logical is not None:
            mapped = self.logical_type(schema, logical, path)
            if mapped is not None:
                return mapped
        if kind in _PRIMITIVES:
            return _PRIMITIVES[kind]
        if kind in ("record", "error"):
            return pa.struct(self.record_fields(schema, path))
        if kind == "enum":
            self.register(schema)
            return pa.string()
        if kind == "fixed":
            self.register(schema)
            return pa.binary(int(schema["size"]))
        if kind == "array":
            item, nullable = self.nullable_type(schema["items"], f"{path}[]")
            return pa.list_(pa.field("item", item, nullable=nullable))
        if kind == "map":
            value, nullable = self.nullable_type(schema["values"], f"{path}{{}}")
            value_field = pa.field("value", value, nullable=nullable)
            # pyarrow-stubs: map_ also takes a Field as the item type (it carries the values' nullability)
            map_type: pa.DataType = pa.map_(pa.string(), value_field)  # type: ignore[call-overload]
            return map_type
        if isinstance(kind, str):
            return self.named_or_primitive(kind, path)
        raise self.fail(path, f"unsupported Avro type {_describe(schema)}")

    def named_or_primitive(self, name: str, path: str) -> pa.DataType:
        if name in _PRIMITIVES:
            return _PRIMITIVES[name]
        named = self.named.get(name)
        if named is None:
            raise self.fail(path, f"unknown named type '{name}'")
        if id(named) in self.in_progress:
            raise self.fail(path, f"recursive record '{name}' cannot be represented in Arrow")
        if named["type"] in ("record", "error"):
            return pa.struct(self.record_fields(named, path))
        return self.arrow_type(named, path)

    def logical_type(self, schema: dict[str, Any], logical: str, path: str) -> pa.DataType | None:
        base = schema.get("type")
        if logical in _TIME_LIKE:
            expected_base, arrow_type = _TIME_LIKE[logical]
            return arrow_type if base == expected_base else None
        if logical == "decimal" and base in ("bytes", "fixed"):
            if base == "fixed":
                self.register(schema)
            precision = int(schema.get("precision", 0))
            scale = int(schema.get("scale", 0))
            if precision < 1 or not 0 <= scale <= precision:
                raise self.fail(path, f"decimal needs 1 <= precision and 0 <= scale <= precision, got "
                                      f"precision={precision} scale={scale}")
            if precision <= _MAX_DECIMAL128_PRECISION:
                return pa.decimal128(precision, scale)
            return pa.decimal256(precision, scale)
        return None


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _describe(schema: Any) -> str:
    if isinstance(schema, dict):
        return str(schema.get("name") or schema.get("type"))
    return str(schema)
