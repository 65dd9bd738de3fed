"""JSON Schema files mapped to Arrow schemas (the subset that describes flat or nested records).

=======================================  =====================================================
"string"                                  string
"string", format "date-time"              timestamp("us", tz="UTC") (RFC 3339 / ISO-8601 text)
"string", format "date"                   date32 ("YYYY-MM-DD")
"integer" / "number" / "boolean"          int64 / float64 / bool
"array" with "items"                      list<items>
"object" with "properties"                struct (nested "required" applies)
"enum" of strings (with or without type)  string
=======================================  =====================================================

A property is nullable unless it is listed in ``required`` and its type does not include "null"
(``"type": ["integer", "null"]``). Combinators (``$ref``, ``oneOf``, ``anyOf``, ``allOf``), several
non-null types, and objects without ``properties`` raise ``SchemaError`` naming the property.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from schemas.base import SchemaError
from schemas.text_files import TextFileError, read_text_file

_SIMPLE: dict[str, pa.DataType] = {
    "string": pa.string(),
    "integer": pa.int64(),
    "number": pa.float64(),
    "boolean": pa.bool_(),
    "null": pa.null(),
}
_STRING_FORMATS: dict[str, pa.DataType] = {
    "date-time": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
}
_UNSUPPORTED_KEYWORDS = ("$ref", "oneOf", "anyOf", "allOf", "not", "if")


def load_json_document(path: Path, kind: str) -> Any:
    try:
        text = read_text_file(Path(path), f"{kind} file")
    except TextFileError as exc:
        raise SchemaError(str(exc)) from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{kind} file {path} is not valid JSON: {exc}") from exc


def json_schema_to_arrow(document: Any, *, where: str) -> pa.Schema:
    """The Arrow schema of the objects a JSON Schema document describes (its top level must be an object)."""
    if not isinstance(document, dict) or document.get("type") != "object" or "properties" not in document:
        raise SchemaError(
            f"JSON Schema in {where}: the top level must be {{\"type\": \"object\", \"properties\": ...}}")
    return pa.schema(_object_fields(document, path="", where=where))


def _object_fields(document: dict[str, Any], path: str, where: str) -> list[pa.Field[pa.DataType]]:
    properties = document["properties"]
    if not isinstance(properties, dict):
        raise _fail(where, path, "'properties' must be an object")
    required = set(document.get("required", []))
    fields = []
    for name, sub in properties.items():
        sub_path = f"{path}.{name}" if path else name
        arrow_type, null_allowed = _property_type(sub, sub_path, where)
        fields.append(pa.field(name, arrow_type, nullable=null_allowed or name not in required))
    return fields


def _property_type(sub: Any, path: str, where: str) -> tuple[pa.DataType, bool]:
    """The property's Arrow type, and whether its ``type`` itself allows null."""
    if not isinstance(sub, dict):
        raise _fail(where, path, f"expected a schema object, got {sub!r}")
    for keyword in _UNSUPPORTED_KEYWORDS:
        if keyword in sub:
            raise _fail(where, path, f"'{keyword}' is not supported")
    declared = sub.get("type")
    if declared is None and "enum" in sub:
        declared = "string"
    types = declared if isinstance(declared, list) else [declared]
    non_null = [t for t in types if t != "null"]
    null_allowed = len(non_null) < len(types)
    if len(non_null) > 1:
        raise _fail(where, path, f"several non-null types {non_null} are not supported")
    if not non_null:
        return pa.null(), True
    return _single_type(non_null[0], sub, path, where), null_allowed


def _single_type(kind: Any, sub: dict[str, Any], path: str, where: str) -> pa.DataType:
    if kind == "string" and sub.get("format") in _STRING_FORMATS:
        return _STRING_FORMATS[sub["format"]]
    if kind in _SIMPLE:
        return _SIMPLE[kind]
    if kind == "array":
        if "items" not in sub:
            raise _fail(where, path, "an array needs 'items'")
        item_type, item_nullable = _property_type(sub["items"], f"{path}[]", where)
        return pa.list_(pa.field("item", item_type, nullable=item_nullable))
    if kind == "object":
        if "properties" not in sub:
            raise _fail(where, path, "an object without 'properties' is not supported")
        return pa.struct(_object_fields(sub, path, where))
    raise _fail(where, path, f"unsupported type {kind!r}")


def _fail(where: str, path: str, problem: str) -> SchemaError:
    return SchemaError(f"JSON Schema in {where}, property '{path}': {problem}")
