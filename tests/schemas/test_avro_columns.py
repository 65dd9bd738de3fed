"""Avro encoded column by column (``schemas.avro_columns``) writes exactly the bytes fastavro writes."""

from __future__ import annotations

import io
import math
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.avro_columns import plan_for

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


@settings(max_examples=300, deadline=None)
@given(schemas_and_rows(), st.binary(max_size=5), st.integers(0, 3))
def test_every_primitive_and_nullable_field_is_written_as_fastavro_writes_it(
        case: tuple[dict[str, Any], list[dict[str, Any]]], prefix: bytes, skipped: int) -> None:
    schema, rows = case
    plan = plan_for(schema)
    assert plan is not None
    batch = batch_of(schema, rows).slice(min(skipped, len(rows) - 1))  # a slice: columns with an offset

    assert plan.encode(batch, prefix) == fastavro_bytes(schema, batch.to_pylist(), prefix)


def test_the_varint_edges_and_a_sliced_batch_are_exact() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}, {"name": "x", "type": "double"},
                                                        {"name": "s", "type": ["null", "string"]}]}
    edges = [0, 1, -1, 63, 64, -64, -65, 8191, 8192, 2**31, 2**62, 2**63 - 1, -(2**63)]
    rows = [{"n": n, "x": x, "s": s} for n in edges for x in (0.0, -0.0, math.inf, math.nan)
            for s in (None, "", "é" * 70)]
    batch = batch_of(schema, rows).slice(5, len(rows) - 9)
    plan = plan_for(schema)

    assert plan is not None and plan.encode(batch) == fastavro_bytes(schema, batch.to_pylist())


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


def test_a_null_where_the_schema_has_none_is_left_to_the_row_by_row_writer() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "long"}]}
    plan = plan_for(schema)

    assert plan is not None
    assert plan.encode(pa.RecordBatch.from_pylist([{"n": 1}, {"n": None}])) is None
