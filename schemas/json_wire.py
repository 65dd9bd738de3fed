"""How Arrow values look in JSON text, and the vectorised conversions between the two.

JSON has no timestamp, date, time or decimal, so those travel as strings (the "wire" type is string):

- timestamps with a time zone: RFC 3339 / ISO-8601 in UTC with ``Z`` and as many fraction digits as the
  unit has (``2024-05-01T12:34:56.789Z`` for ms); without a zone: the same without ``Z``. Decoding also
  accepts offsets (``+02:00``, converted to UTC) and a space instead of ``T``; text without a zone is
  taken as UTC.
- dates ``YYYY-MM-DD``; times ``HH:MM:SS[.fff]``; decimals as strings (``"12.50"``) so no digit is lost.
- NaN and infinities have no JSON form and are written as null.
- bytes (binary, fixed-size binary) are written as base64 text, as Kafka Connect's JsonConverter writes them.
- maps with string keys are written as objects; maps with other keys (a Protobuf ``map<int64, V>``) as arrays
  of ``{"key": ..., "value": ...}`` objects, since JSON object keys can only be strings and a key written as
  text would not read back as the number it was.

Reading with a schema covers what JSON Schema describes (no bytes, no maps): ``unsupported_type``.

Every conversion here works on whole columns (Arrow compute casts, ``strftime``), including values nested
in structs and lists, so no per-value Python runs on the fast path.
"""

from __future__ import annotations

import base64
from typing import Any, NamedTuple, cast

import pyarrow as pa
import pyarrow.compute as pc

_MIDNIGHT = "1970-01-01T"


def is_text_on_the_wire(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_timestamp(arrow_type) or pa.types.is_date32(arrow_type) or pa.types.is_time(arrow_type)
            or pa.types.is_decimal(arrow_type) or is_bytes(arrow_type))


def is_bytes(arrow_type: pa.DataType) -> bool:
    return (pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type)
            or pa.types.is_fixed_size_binary(arrow_type))


def has_string_keys(map_type: pa.MapType[Any, Any]) -> bool:
    return pa.types.is_string(map_type.key_type) or pa.types.is_large_string(map_type.key_type)


def wire_type(arrow_type: pa.DataType) -> pa.DataType:
    """The Arrow type a JSON reader produces for values of ``arrow_type`` (every field nullable), and the
    one the JSON writer prints (see the module doc for maps)."""
    if is_text_on_the_wire(arrow_type):
        return pa.string()
    if pa.types.is_struct(arrow_type):
        return pa.struct([pa.field(f.name, wire_type(f.type)) for f in arrow_type])
    if pa.types.is_map(arrow_type):
        if has_string_keys(arrow_type):
            return pa.map_(arrow_type.key_type, wire_type(arrow_type.item_type))
        return pa.list_(pa.field("item", pa.struct([pa.field("key", wire_type(arrow_type.key_type)),
                                                    pa.field("value", wire_type(arrow_type.item_type))])))
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return pa.list_(pa.field("item", wire_type(arrow_type.value_type)))
    return arrow_type


def wire_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, wire_type(f.type)) for f in schema])


class Unsupported(NamedTuple):
    """A value (``address.zip``, ``tags[]``, ``counts{value}``) of a type with no JSON form here."""

    path: str
    arrow_type: pa.DataType

    def __str__(self) -> str:
        return f"{self.path} ({self.arrow_type})"


def unsupported_type(arrow_type: pa.DataType, path: str, *, writing: bool = False) -> Unsupported | None:
    """The first value inside ``arrow_type`` that has no JSON form here, else None. Reading (with a schema)
    takes what JSON Schema describes; ``writing`` also takes bytes and maps (module doc)."""
    if pa.types.is_struct(arrow_type):
        for fld in arrow_type:
            found = unsupported_type(fld.type, f"{path}.{fld.name}", writing=writing)
            if found:
                return found
        return None
    if pa.types.is_list(arrow_type) or (writing and pa.types.is_large_list(arrow_type)):
        return unsupported_type(arrow_type.value_type, f"{path}[]", writing=writing)
    if writing and pa.types.is_map(arrow_type):
        return (unsupported_type(arrow_type.key_type, f"{path}{{key}}", writing=True)
                or unsupported_type(arrow_type.item_type, f"{path}{{value}}", writing=True))
    if is_bytes(arrow_type):
        return None if writing else Unsupported(path, arrow_type)
    supported = (pa.types.is_null(arrow_type) or pa.types.is_boolean(arrow_type) or pa.types.is_integer(arrow_type)
                 or pa.types.is_float32(arrow_type) or pa.types.is_float64(arrow_type)
                 or pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
                 or is_text_on_the_wire(arrow_type))
    return None if supported else Unsupported(path, arrow_type)


def text_to_value(array: pa.Array[Any], target: pa.DataType) -> pa.Array[Any]:
    """Decode direction: a JSON reader's column to the target type (strings parsed, others cast)."""
    if array.type == target:
        return array
    if pa.types.is_time(target):
        return _text_to_time(array, target)
    return array.cast(target)


def value_to_text(array: pa.Array[Any], wire: pa.DataType) -> pa.Array[Any]:
    """Encode direction: a target-typed column to what the JSON writer should print (see module doc)."""
    kind = array.type
    if pa.types.is_timestamp(kind):
        return _timestamp_to_iso(array, kind)
    if is_bytes(kind):
        return _base64(array)
    if is_text_on_the_wire(kind):
        return array.cast(pa.string())
    if pa.types.is_floating(kind):
        # pyarrow-stubs type if_else as "array or scalar"; an array condition gives an array
        return cast("pa.Array[Any]", pc.if_else(pc.is_finite(array), array, pa.scalar(None, kind)))
    return array


def _timestamp_to_iso(array: pa.Array[Any], kind: pa.TimestampType[Any, Any]) -> pa.Array[Any]:
    """ISO-8601 text, ``Z`` for zoned timestamps (their values are UTC instants).

    Arrow's zone-aware formatting (``strftime``, or a cast of a zoned timestamp to string) looks the zone
    up per value and costs ~3 µs a row; the cast of the same instants as a naive timestamp is ~0.1 µs
    and prints the same UTC wall time, with a space where ISO-8601 wants ``T``.
    """
    text = array.cast(pa.timestamp(kind.unit)).cast(pa.string())
    text = pc.replace_substring(text, " ", "T", max_replacements=1)
    if kind.tz is None:
        return text
    # pyarrow-stubs: binary_join_element_wise takes arrays and Python strings mixed (the stubs want one kind)
    zoned: pa.StringArray = pc.binary_join_element_wise(text, "Z", "")  # type: ignore[call-overload]
    return zoned


def _base64(array: pa.Array[Any]) -> pa.Array[Any]:
    """Bytes as base64 text. Arrow has no base64 kernel, so this one goes value by value (bytes are rare in
    JSON records; a pipeline of bytes is better written as avro or raw)."""
    values = cast(list[bytes | None], array.to_pylist())
    return pa.array([base64.b64encode(value).decode() if value is not None else None for value in values], pa.string())


def _text_to_time(array: pa.Array[Any], target: pa.Time32Type[Any] | pa.Time64Type[Any]) -> pa.Array[Any]:
    """Arrow cannot cast string to time, so parse ``HH:MM:SS[.f]`` as a timestamp on 1970-01-01."""
    # pyarrow-stubs: binary_join_element_wise takes arrays and Python strings mixed (the stubs want one kind)
    on_epoch_day: pa.StringArray = pc.binary_join_element_wise(_MIDNIGHT, array, "")  # type: ignore[call-overload]
    ticks = on_epoch_day.cast(pa.timestamp(target.unit)).cast(pa.int64())
    if pa.types.is_time32(target):
        return ticks.cast(pa.int32()).cast(target)
    return ticks.cast(target)
