"""The sink schema a user would write for given Arrow columns, in each schema language: Avro, JSON Schema and
Protobuf. Each Arrow type gets its counterpart in the language (the README's "Types across formats" table);
a type the language has no counterpart for is declared as a string, the one thing a user could declare,
and the sink format then converts the value to text or, where Arrow cannot, the pairing is refused.
"""

from __future__ import annotations

import itertools
from typing import Any

import pyarrow as pa

_AVRO_INTS = {8: "int", 16: "int", 32: "int", 64: "long"}
_AVRO_TIMESTAMPS = {"ms": "millis", "us": "micros", "ns": "nanos"}


def avro_schema(columns: pa.Schema, name: str = "Out") -> dict[str, Any]:
    """An Avro record schema for ``columns``: nullable fields as ``["null", T]``, maps with string keys
    (Avro's only keys: other keys are written as their text)."""
    names = itertools.count()
    return {"type": "record", "name": name, "fields": [
        {"name": fld.name, "type": _avro_field(fld, names)} for fld in columns]}


def _avro_field(fld: pa.Field[pa.DataType], names: itertools.count[int]) -> Any:
    declared = _avro_type(fld.type, names)
    return ["null", declared] if fld.nullable and declared != "null" else declared


def _avro_type(kind: pa.DataType, names: itertools.count[int]) -> Any:
    if pa.types.is_null(kind):
        return "null"
    if pa.types.is_boolean(kind):
        return "boolean"
    if pa.types.is_integer(kind):
        return "long" if pa.types.is_unsigned_integer(kind) and kind.bit_width >= 32 else _AVRO_INTS[kind.bit_width]
    if pa.types.is_floating(kind):
        return "float" if kind.bit_width == 32 else "double"
    if pa.types.is_string(kind):
        return "string"
    if pa.types.is_binary(kind):
        return "bytes"
    if pa.types.is_fixed_size_binary(kind):
        return {"type": "fixed", "name": f"Fixed{next(names)}", "size": kind.byte_width}
    if pa.types.is_decimal(kind):
        return {"type": "bytes", "logicalType": "decimal", "precision": kind.precision, "scale": kind.scale}
    if pa.types.is_date32(kind):
        return {"type": "int", "logicalType": "date"}
    if pa.types.is_time32(kind):
        return {"type": "int", "logicalType": "time-millis"}
    if pa.types.is_time64(kind):
        return {"type": "long", "logicalType": "time-micros"}
    if pa.types.is_timestamp(kind):
        local = "" if kind.tz is not None else "local-"
        return {"type": "long", "logicalType": f"{local}timestamp-{_AVRO_TIMESTAMPS[kind.unit]}"}
    if pa.types.is_list(kind):
        return {"type": "array", "items": _avro_field(kind.value_field, names)}
    if pa.types.is_map(kind):
        return {"type": "map", "values": _avro_field(kind.item_field, names)}
    if pa.types.is_struct(kind):
        return {"type": "record", "name": f"Record{next(names)}", "fields": [
            {"name": child.name, "type": _avro_field(child, names)} for child in kind]}
    return "string"


def json_schema(columns: pa.Schema, title: str = "Out") -> dict[str, Any]:
    """A JSON Schema object for ``columns``: nullable properties allow ``null``, the others are required."""
    return {"title": title, **_json_object(list(columns))}


def _json_object(fields: list[pa.Field[pa.DataType]]) -> dict[str, Any]:
    return {"type": "object", "properties": {fld.name: _json_property(fld) for fld in fields},
            "required": [fld.name for fld in fields if not fld.nullable]}


def _json_property(fld: pa.Field[pa.DataType]) -> dict[str, Any]:
    declared = _json_type(fld.type)
    if fld.nullable and declared["type"] != "null":
        declared = {**declared, "type": [declared["type"], "null"]}
    return declared


def _json_type(kind: pa.DataType) -> dict[str, Any]:
    if pa.types.is_null(kind):
        return {"type": "null"}
    if pa.types.is_boolean(kind):
        return {"type": "boolean"}
    if pa.types.is_integer(kind):
        return {"type": "integer"}
    if pa.types.is_floating(kind):
        return {"type": "number"}
    if pa.types.is_timestamp(kind):
        return {"type": "string", "format": "date-time"}
    if pa.types.is_date32(kind):
        return {"type": "string", "format": "date"}
    if pa.types.is_list(kind):
        return {"type": "array", "items": _json_property(kind.value_field)}
    if pa.types.is_struct(kind):
        return _json_object(list(kind))
    return {"type": "string"}


_PROTO_SCALARS = {(8, True): "int32", (16, True): "int32", (32, True): "int32", (64, True): "int64",
                  (8, False): "uint32", (16, False): "uint32", (32, False): "uint32", (64, False): "uint64"}
_PROTO_MAP_KEYS = ("int32", "int64", "uint32", "uint64", "bool", "string")


def proto_file(columns: pa.Schema, package: str = "matrix", message: str = "Out") -> str:
    """A proto3 file whose message ``message`` has a field per column: nullable scalars ``optional``,
    structs nested messages, lists ``repeated``, maps ``map``, timestamps ``google.protobuf.Timestamp``."""
    lines = ['syntax = "proto3";', f"package {package};", 'import "google/protobuf/timestamp.proto";', ""]
    lines += _proto_message(message, list(columns), itertools.count())
    return "\n".join(lines) + "\n"


def _proto_message(name: str, fields: list[pa.Field[pa.DataType]], names: itertools.count[int]) -> list[str]:
    nested: list[str] = []
    body = []
    for number, fld in enumerate(fields, start=1):
        declared = _proto_field(fld, names, nested)
        body.append(f"  {declared} {fld.name} = {number};")
    return [f"message {name} {{", *("  " + line for line in nested), *body, "}"]


def _proto_field(fld: pa.Field[pa.DataType], names: itertools.count[int], nested: list[str]) -> str:
    kind = fld.type
    if pa.types.is_list(kind) and not _is_container(kind.value_type):
        return f"repeated {_proto_type(kind.value_type, names, nested)}"
    if pa.types.is_map(kind):
        key = _proto_type(kind.key_type, names, nested)
        if key in _PROTO_MAP_KEYS and not _is_container(kind.item_type):
            return f"map<{key}, {_proto_type(kind.item_type, names, nested)}>"
        return "string"
    declared = _proto_type(kind, names, nested)
    is_message = pa.types.is_struct(kind) or pa.types.is_timestamp(kind)
    return f"optional {declared}" if fld.nullable and not is_message else declared


def _is_container(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_map(kind)


def _proto_type(kind: pa.DataType, names: itertools.count[int], nested: list[str]) -> str:
    if pa.types.is_boolean(kind):
        return "bool"
    if pa.types.is_integer(kind):
        return _PROTO_SCALARS[(kind.bit_width, pa.types.is_signed_integer(kind))]
    if pa.types.is_floating(kind):
        return "float" if kind.bit_width == 32 else "double"
    if pa.types.is_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return "bytes"
    if pa.types.is_timestamp(kind):
        return "google.protobuf.Timestamp"
    if pa.types.is_struct(kind):
        name = f"Message{next(names)}"
        nested.extend(_proto_message(name, list(kind), names))
        return name
    return "string"
