"""Avro encoded and decoded column by column (``schemas.avro_columns``) is exactly fastavro, or declines:
in C (``schemas/_native_avro.c``) and in numpy and Arrow compute alike."""

from __future__ import annotations

import dataclasses
import io
import math
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.avro_columns import SWITCH, ColumnPlan, native_avro, plan_for

ARROW = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
         "double": pa.float64(), "string": pa.string(), "bytes": pa.binary()}
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "boolean": st.booleans(),
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32, allow_nan=False),
    "double": st.floats(),
    "string": st.text(max_size=300),
    "bytes": st.binary(max_size=300),
}


ENGINES = pytest.mark.parametrize("engine", [
    pytest.param("C", marks=pytest.mark.skipif(native_avro() is None, reason="schemas/_native_avro.c was not built")),
    "numpy"])
"""Every test that encodes or decodes runs once per engine."""


def plan_of(schema: dict[str, Any], engine: str) -> ColumnPlan:
    plan = plan_for(schema)
    assert plan is not None
    return dataclasses.replace(plan, native=native_avro() if engine == "C" else None)


def column(payloads: list[bytes]) -> pa.BinaryArray:
    return pa.array(payloads, pa.binary())


def encoded(plan: ColumnPlan, batch: pa.RecordBatch, prefix: bytes = b"") -> list[bytes] | None:
    values = plan.encode(batch, prefix)
    return values.to_pylist() if values is not None else None


@st.composite
def schemas_and_rows(draw: st.DrawFn) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    fields = []
    for number in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(sorted(ARROW)))
        shape = draw(st.sampled_from(["bare", "dict", "null first", "null last"]))
        avro_type: Any = {"bare": kind, "dict": {"type": kind}, "null first": ["null", kind],
                          "null last": [kind, "null"]}[shape]
        fields.append({"name": f"f{number}", "type": avro_type, "kind": kind, "nullable": shape.startswith("null")})
    rows = draw(st.lists(st.fixed_dictionaries({
        field["name"]: (st.none() | VALUES[field["kind"]]) if field["nullable"] else VALUES[field["kind"]]
        for field in fields}), min_size=1, max_size=40))
    schema = {"type": "record", "name": "R", "fields": [{"name": f["name"], "type": f["type"]} for f in fields]}
    return schema, rows


def fastavro_records(schema: dict[str, Any], payloads: list[bytes], start: int = 0) -> list[dict[str, Any]] | None:
    """Each payload read by fastavro from ``start``, or None if any of them is not exactly one record."""
    parsed = fastavro.parse_schema(schema)
    records = []
    for payload in payloads:
        buffer = io.BytesIO(payload)
        buffer.seek(start)
        try:
            records.append(fastavro.schemaless_reader(buffer, parsed, None))
        except Exception:  # noqa: BLE001 - whatever fastavro raises, the payload is not a record
            return None
        if buffer.tell() != len(payload):
            return None
    return records


def fastavro_bytes(schema: dict[str, Any], rows: list[dict[str, Any]], prefix: bytes = b"") -> list[bytes]:
    parsed = fastavro.parse_schema(schema)
    out = []
    for row in rows:
        buffer = io.BytesIO(prefix)
        buffer.seek(len(prefix))
        fastavro.schemaless_writer(buffer, parsed, row)
        out.append(buffer.getvalue())
    return out


def batch_of(schema: dict[str, Any], rows: list[dict[str, Any]]) -> pa.RecordBatch:
    arrow = pa.schema([(f["name"], ARROW[f["type"] if isinstance(f["type"], str) else
                                          f["type"]["type"] if isinstance(f["type"], dict) else
                                          next(t for t in f["type"] if t != "null")]) for f in schema["fields"]])
    return pa.RecordBatch.from_pylist(rows, schema=arrow)


@ENGINES
@settings(max_examples=300, deadline=None)
@given(schemas_and_rows(), st.binary(max_size=5), st.integers(0, 3))
def test_every_primitive_and_nullable_field_is_written_as_fastavro_writes_it(
        engine: str, case: tuple[dict[str, Any], list[dict[str, Any]]], prefix: bytes, skipped: int) -> None:
    schema, rows = case
    plan = plan_of(schema, engine)
    batch = batch_of(schema, rows).slice(min(skipped, len(rows) - 1))  # a slice: columns with an offset

    assert encoded(plan, batch, prefix) == fastavro_bytes(schema, batch.to_pylist(), prefix)


@ENGINES
def test_the_varint_edges_and_a_sliced_batch_are_exact(engine: str) -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}, {"name": "x", "type": "double"},
                                                        {"name": "s", "type": ["null", "string"]}]}
    edges = [0, 1, -1, 63, 64, -64, -65, 8191, 8192, 2**31, 2**62, 2**63 - 1, -(2**63)]
    rows = [{"n": n, "x": x, "s": s} for n in edges for x in (0.0, -0.0, math.inf, math.nan)
            for s in (None, "", "é" * 70)]
    batch = batch_of(schema, rows).slice(5, len(rows) - 9)
    plan = plan_of(schema, engine)

    assert encoded(plan, batch) == fastavro_bytes(schema, batch.to_pylist())
    assert plan.decode(column(fastavro_bytes(schema, batch.to_pylist())), batch.schema) is not None


@pytest.mark.parametrize("field_type", [
    {"type": "record", "name": "Inner", "fields": [{"name": "a", "type": "int"}]},
    {"type": "array", "items": "int"},
    {"type": "map", "values": "int"},
    {"type": "enum", "name": "E", "symbols": ["A"]},
    {"type": "fixed", "name": "F", "size": 2},
    ["null", "int", "string"],
    ["int", "string"],
    {"type": "string", "logicalType": "uuid"},
])
def test_other_field_types_have_no_column_plan(field_type: Any) -> None:
    assert plan_for({"type": "record", "name": "R", "fields": [{"name": "f", "type": field_type}]}) is None


@ENGINES
def test_a_null_where_the_schema_has_none_is_left_to_the_row_by_row_writer(engine: str) -> None:
    plan = plan_of({"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}]}, engine)

    assert plan.encode(pa.RecordBatch.from_pylist([{"n": 1}, {"n": None}])) is None


@ENGINES
def test_an_empty_batch_is_no_values(engine: str) -> None:
    plan = plan_of(LONG_AND_FRIENDS, engine)
    schema = arrow_schema_of(LONG_AND_FRIENDS)

    assert encoded(plan, batch_of(LONG_AND_FRIENDS, [])) == []
    decoded = plan.decode(column([]), schema)
    assert decoded is not None and decoded.num_rows == 0 and decoded.schema == schema


def arrow_schema_of(schema: dict[str, Any]) -> pa.Schema:
    return batch_of(schema, []).schema


def same_batch(decoded: pa.RecordBatch, schema: dict[str, Any], records: list[dict[str, Any]]) -> bool:
    """``decoded`` holds exactly ``records`` in the schema's Arrow types (NaN counting as equal to NaN)."""
    def comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: "NaN" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()} for row in rows]
    return decoded.schema == arrow_schema_of(schema) and comparable(decoded.to_pylist()) == comparable(
        batch_of(schema, records).to_pylist())


@ENGINES
@settings(max_examples=300, deadline=None)
@given(schemas_and_rows(), st.binary(max_size=5), st.integers(0, 3))
def test_well_formed_records_are_decoded_to_what_fastavro_reads(
        engine: str, case: tuple[dict[str, Any], list[dict[str, Any]]], prefix: bytes, skipped: int) -> None:
    schema, rows = case
    plan = plan_of(schema, engine)
    payloads = fastavro_bytes(schema, rows, prefix)
    skipped = min(skipped, len(payloads) - 1)

    decoded = plan.decode(column(payloads).slice(skipped), arrow_schema_of(schema), prefix)  # offsets start later
    payloads = payloads[skipped:]

    assert decoded is not None
    assert same_batch(decoded, schema, fastavro_records(schema, payloads, len(prefix)) or [])


@ENGINES
@settings(max_examples=500, deadline=None)
@given(schemas_and_rows(), st.data())
def test_a_damaged_batch_is_declined_or_decoded_exactly_as_fastavro_reads_it(
        engine: str, case: tuple[dict[str, Any], list[dict[str, Any]]], data: st.DataObject) -> None:
    """Cutting, extending or overwriting bytes of one payload: either every payload is still exactly one
    record (and the batch is what fastavro reads), or the plan declines the batch for fastavro to name."""
    schema, rows = case
    plan = plan_of(schema, engine)
    payloads = fastavro_bytes(schema, rows)
    victim = data.draw(st.integers(0, len(payloads) - 1))
    damaged = bytearray(payloads[victim])
    damage = data.draw(st.sampled_from(["cut", "extend", "overwrite"]))
    if damage == "cut" and damaged:
        del damaged[data.draw(st.integers(0, len(damaged) - 1)):]
    elif damage == "extend" or not damaged:
        damaged += data.draw(st.binary(min_size=1, max_size=4))
    else:
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    payloads[victim] = bytes(damaged)

    decoded = plan.decode(column(payloads), arrow_schema_of(schema))
    expected = fastavro_records(schema, payloads)

    if decoded is not None:
        assert expected is not None
        assert same_batch(decoded, schema, expected)


LONG_AND_FRIENDS = {"type": "record", "name": "R", "fields": [
    {"name": "n", "type": "long"}, {"name": "i", "type": "int"}, {"name": "b", "type": "boolean"},
    {"name": "s", "type": ["null", "string"]}]}
GOOD = b"\x02" + b"\x04" + b"\x01" + b"\x02" + b"\x04hi"  # n=1, i=2, b=true, s: branch 1, "hi"


@pytest.mark.parametrize(("bad", "why"), [
    (b"\xff" * 10 + b"\x01" + b"\x04\x01\x00", "a varint longer than ten bytes"),
    (b"\xff" * 9 + b"\x02" + b"\x04\x01\x00", "a ten-byte varint beyond 64 bits"),
    (b"\x02" + b"\x80\x80\x80\x80\x10" + b"\x01\x00", "an int beyond 32 bits"),
    (b"\x02\x04\x02\x00", "a boolean that is neither 0 nor 1"),
    (b"\x02\x04\x01\x04", "a union branch the union does not have"),
    (b"\x02\x04\x01\x02\x04\xff\xfe", "a string that is not UTF-8"),
    (b"\x02\x04\x01\x02\x06\xed\xa0\x80", "a string holding a UTF-16 surrogate"),
    (b"\x02\x04\x01\x02\x04\xc0\x80", "a string with an overlong UTF-8 form"),
    (b"\x02\x04\x01\x02\x08\xf4\x90\x80\x80", "a string past U+10FFFF"),
    (b"\x02\x04\x01\x02\x03x", "a negative string length"),
    (b"\x02\x04\x01\x02\x06hi", "a string running past the payload"),
    (GOOD + b"\x00", "a byte left after the record"),
    (GOOD[:2], "a payload ending inside the record"),
    (b"", "an empty payload"),
])
@ENGINES
def test_one_malformed_payload_makes_the_plan_decline_the_batch(engine: str, bad: bytes, why: str) -> None:
    plan = plan_of(LONG_AND_FRIENDS, engine)
    schema = arrow_schema_of(LONG_AND_FRIENDS)
    assert plan.decode(column([GOOD, GOOD]), schema) is not None

    assert plan.decode(column([GOOD, bad, GOOD]), schema) is None, why


@ENGINES
def test_a_null_value_makes_the_plan_decline_the_batch(engine: str) -> None:
    plan = plan_of(LONG_AND_FRIENDS, engine)

    assert plan.decode(pa.array([GOOD, None], pa.binary()), arrow_schema_of(LONG_AND_FRIENDS)) is None


@ENGINES
def test_a_payload_without_the_expected_prefix_makes_the_plan_decline_the_batch(engine: str) -> None:
    plan = plan_of(LONG_AND_FRIENDS, engine)
    schema = arrow_schema_of(LONG_AND_FRIENDS)
    header = b"\x00\x00\x00\x00\x01"
    assert plan.decode(column([header + GOOD]), schema, header)

    assert plan.decode(column([b"\x00\x00\x00\x00\x02" + GOOD]), schema, header) is None
    assert plan.decode(column([b"\x00\x00"]), schema, header) is None


def test_a_record_wider_than_the_c_module_reads_is_read_and_written_in_numpy() -> None:
    schema = {"type": "record", "name": "Wide", "fields": [{"name": f"f{n}", "type": "long"} for n in range(300)]}
    plan = plan_for(schema)
    batch = batch_of(schema, [{f"f{n}": n * row for n in range(300)} for row in range(3)])

    assert plan is not None and plan.native is None
    assert encoded(plan, batch) == fastavro_bytes(schema, batch.to_pylist())
    assert plan.decode(column(fastavro_bytes(schema, batch.to_pylist())), batch.schema) == batch


def test_the_switch_turns_the_c_module_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SWITCH, "off")
    native_avro.cache_clear()
    try:
        plan = plan_for(LONG_AND_FRIENDS)
        assert plan is not None and plan.native is None
    finally:
        native_avro.cache_clear()


def test_a_record_without_fields_has_no_column_plan() -> None:
    assert plan_for({"type": "record", "name": "Empty", "fields": []}) is None
