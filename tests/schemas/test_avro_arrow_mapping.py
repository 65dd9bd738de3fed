"""Specification of the Avro -> Arrow type mapping (schemas/avro_arrow.py)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from schemas import SchemaError
from schemas.avro_arrow import (
    avro_to_arrow_schema,
    decimal_from_avro_bytes,
    decimal_to_avro_bytes,
    physical_avro_schema,
)


def one_field(avro_type: Any) -> pa.Field:
    schema = {"type": "record", "name": "R", "fields": [{"name": "x", "type": avro_type}]}
    return avro_to_arrow_schema(schema, where="test").field("x")


@pytest.mark.parametrize(
    ("avro_type", "arrow_type"),
    [
        ("null", pa.null()),
        ("boolean", pa.bool_()),
        ("int", pa.int32()),
        ("long", pa.int64()),
        ("float", pa.float32()),
        ("double", pa.float64()),
        ("bytes", pa.binary()),
        ("string", pa.string()),
        ({"type": "string"}, pa.string()),
    ],
)
def test_primitives_map_to_their_arrow_types(avro_type: Any, arrow_type: pa.DataType) -> None:
    assert one_field(avro_type).type == arrow_type


@pytest.mark.parametrize(
    ("logical", "arrow_type"),
    [
        ({"type": "long", "logicalType": "timestamp-millis"}, pa.timestamp("ms", tz="UTC")),
        ({"type": "long", "logicalType": "timestamp-micros"}, pa.timestamp("us", tz="UTC")),
        ({"type": "long", "logicalType": "timestamp-nanos"}, pa.timestamp("ns", tz="UTC")),
        ({"type": "long", "logicalType": "local-timestamp-millis"}, pa.timestamp("ms")),
        ({"type": "long", "logicalType": "local-timestamp-micros"}, pa.timestamp("us")),
        ({"type": "int", "logicalType": "date"}, pa.date32()),
        ({"type": "int", "logicalType": "time-millis"}, pa.time32("ms")),
        ({"type": "long", "logicalType": "time-micros"}, pa.time64("us")),
        ({"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}, pa.decimal128(10, 2)),
        ({"type": "fixed", "name": "D", "size": 16, "logicalType": "decimal", "precision": 38, "scale": 9},
         pa.decimal128(38, 9)),
        ({"type": "bytes", "logicalType": "decimal", "precision": 50, "scale": 5}, pa.decimal256(50, 5)),
        ({"type": "bytes", "logicalType": "decimal", "precision": 7}, pa.decimal128(7, 0)),
        ({"type": "string", "logicalType": "uuid"}, pa.string()),
    ],
)
def test_logical_types_map_to_arrow_logical_types(logical: dict[str, Any], arrow_type: pa.DataType) -> None:
    assert one_field(logical).type == arrow_type


def test_unknown_or_misplaced_logical_types_fall_back_to_the_underlying_type() -> None:
    assert one_field({"type": "long", "logicalType": "made-up"}).type == pa.int64()
    assert one_field({"type": "int", "logicalType": "timestamp-millis"}).type == pa.int32()


@pytest.mark.parametrize("union", [["null", "long"], ["long", "null"]])
def test_union_with_null_is_a_nullable_field(union: list[str]) -> None:
    fld = one_field(union)
    assert (fld.type, fld.nullable) == (pa.int64(), True)


def test_plain_types_are_not_nullable() -> None:
    assert one_field("long").nullable is False


def test_record_maps_to_struct_keeping_order_and_nullability() -> None:
    record = {"type": "record", "name": "Inner", "fields": [
        {"name": "b", "type": "string"}, {"name": "a", "type": ["null", "int"]}]}
    assert one_field(record).type == pa.struct([pa.field("b", pa.string(), nullable=False), pa.field("a", pa.int32())])


def test_array_maps_to_list_with_item_nullability() -> None:
    assert one_field({"type": "array", "items": "long"}).type == pa.list_(pa.field("item", pa.int64(), nullable=False))
    assert one_field({"type": "array", "items": ["null", "long"]}).type == pa.list_(pa.int64())


def test_map_maps_to_string_keyed_map() -> None:
    arrow_type = one_field({"type": "map", "values": "double"}).type
    assert pa.types.is_map(arrow_type)
    assert (arrow_type.key_type, arrow_type.item_type) == (pa.string(), pa.float64())


def test_enum_maps_to_string() -> None:
    assert one_field({"type": "enum", "name": "E", "symbols": ["A", "B"]}).type == pa.string()


def test_fixed_maps_to_fixed_size_binary() -> None:
    assert one_field({"type": "fixed", "name": "F", "size": 6}).type == pa.binary(6)


def test_named_types_can_be_referenced_again_by_name() -> None:
    schema = {"type": "record", "name": "R", "namespace": "ns", "fields": [
        {"name": "home", "type": {"type": "record", "name": "Addr", "fields": [{"name": "city", "type": "string"}]}},
        {"name": "work", "type": ["null", "Addr"]},
        {"name": "other", "type": "ns.Addr"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["X"]}},
        {"name": "kind2", "type": "Kind"},
    ]}
    arrow = avro_to_arrow_schema(schema, where="test")
    assert arrow.field("work").type == arrow.field("home").type == arrow.field("other").type
    assert arrow.field("kind2").type == pa.string()


def test_union_of_several_non_null_types_is_a_schema_error_naming_the_field() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "outer", "type": {"type": "record", "name": "I", "fields": [
            {"name": "either", "type": ["null", "string", "long"]}]}}]}
    with pytest.raises(SchemaError, match=r"field 'outer\.either'.*union of several non-null types"):
        avro_to_arrow_schema(schema, where="my.avsc")


def test_recursive_record_is_a_schema_error() -> None:
    schema = {"type": "record", "name": "Node", "fields": [
        {"name": "next", "type": ["null", "Node"]}]}
    with pytest.raises(SchemaError, match=r"field 'next'.*recursive record 'Node'"):
        avro_to_arrow_schema(schema, where="node.avsc")


def test_top_level_must_be_a_record() -> None:
    with pytest.raises(SchemaError, match="top-level type must be a record"):
        avro_to_arrow_schema("long", where="x.avsc")


def test_physical_schema_drops_time_like_uuid_and_decimal_logical_types_only() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 1}},
        {"name": "days", "type": {"type": "array", "items": {"type": "int", "logicalType": "date"}}},
        {"name": "other", "type": {"type": "string", "logicalType": "made-up"}}]}
    physical = physical_avro_schema(schema)
    assert physical["fields"][0]["type"] == {"type": "long"}
    assert physical["fields"][1]["type"] == {"type": "bytes", "precision": 4, "scale": 1}
    assert physical["fields"][2]["type"]["items"] == {"type": "int"}
    assert physical["fields"][3]["type"]["logicalType"] == "made-up"
    assert schema["fields"][0]["type"]["logicalType"] == "timestamp-millis"  # the original is untouched


def test_physical_arrow_schema_is_the_storage_of_the_logical_one() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "t", "type": {"type": "array", "items": {"type": "long", "logicalType": "timestamp-micros"}}},
        {"name": "f", "type": {"type": "fixed", "name": "F", "size": 5, "logicalType": "decimal", "precision": 9}}]}
    physical = avro_to_arrow_schema(physical_avro_schema(schema), where="test")
    assert physical.field("t").type == pa.list_(pa.field("item", pa.int64(), nullable=False))
    assert physical.field("f").type == pa.binary(5)


@pytest.mark.parametrize(
    ("unscaled", "avro_bytes"),
    [(0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x00\x80"), (-1, b"\xff"), (-128, b"\x80"),
     (-129, b"\xff\x7f"), (10**37, (10**37).to_bytes(16, "big", signed=True).lstrip(b"\x00"))],
)
def test_decimal_bytes_are_minimal_big_endian_twos_complement(unscaled: int, avro_bytes: bytes) -> None:
    from decimal import Decimal

    decimals = pa.array([Decimal(unscaled).scaleb(-2), None], pa.decimal128(38, 2))
    encoded = decimal_to_avro_bytes(decimals, pa.binary())
    assert encoded.to_pylist() == [avro_bytes, None]
    assert decimal_from_avro_bytes(encoded, pa.decimal128(38, 2)).equals(decimals)


def test_fixed_decimals_are_sign_extended_to_the_fixed_size() -> None:
    from decimal import Decimal

    decimals = pa.array([Decimal("-0.01"), Decimal("0.02")], pa.decimal128(5, 2)).slice(0, 2)
    assert decimal_to_avro_bytes(decimals, pa.binary(4)).to_pylist() == [b"\xff\xff\xff\xff", b"\x00\x00\x00\x02"]
