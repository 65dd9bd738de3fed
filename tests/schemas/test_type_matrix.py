"""Every type a decoder produces is written by every sink format, or the pairing is refused up front.

For each source format a fixed schema with every type it expresses (nested records, lists, maps with string
and other keys, enums, oneofs, decimals, dates, times, timestamps with and without a zone, bytes, nulls at
every level, Protobuf's Timestamp and wrappers), and for each sink format the schema a user would write for
the source's columns (``tests.helpers.sink_schemas``). Hypothesis generates records; each goes: source bytes
-> Arrow (the source decodes) -> the sink's bytes (``sinks.writer.encode_rows``, as a run writes) -> Arrow or
JSON again (the sink decodes) -> compared with the value it came from by the equivalence written down here:

- a sink with a schema holds a value as Arrow's safe cast converts it to the schema's type (an enum as its
  name, a timestamp in the sink's unit, a map key as text for Avro, a date, time or decimal as text where
  the schema language has no such type); a value the cast refuses (an int64 beyond an Avro int, bytes that
  are not UTF-8 into a string, a timestamp with digits below the sink's unit) and, for Protobuf, a null list
  element (Protobuf has none) leave the row unwritten, named for the dead-letter topic. Map entries are
  compared in key order (Protobuf keeps none).
- ``json`` (no schema) is compared as the JSON it writes: timestamps, dates and times as ISO-8601 text,
  decimals as text, bytes as base64, maps with string keys as objects and others as arrays of key/value
  objects; a float32 is the float32 its shortest text reads back as.
- a pairing whose columns the sink cannot write at all is refused by ``schemas.compatibility.sink_problems``
  (what ``validate`` and a start report), column by column as ``REFUSED`` lists; the other columns are then
  written by a sink schema without the refused ones, as a user would after dropping them.

Non-finite floats are not generated: JSON writes them as null (tests/schemas/test_json.py).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Context, Decimal
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import EncodeError, FormatSpec, make_format
from schemas.arrow_batches import conform_batch
from schemas.base import Format
from schemas.compatibility import sink_problems
from sinks.writer import SinkSettings, encode_rows
from tests.helpers.schema_registry import FakeSchemaRegistry
from tests.helpers.schema_samples import ALL_TYPES_AVSC
from tests.helpers.sink_schemas import avro_schema, json_schema, proto_file

HERE = Path(__file__).parent
RECORD_SCHEMA = HERE / "matrix" / "record.schema.json"
NESTED_AVSC = HERE / "matrix" / "nested.avsc"
ALL_TYPES_PROTO = HERE / "protos" / "all_types.proto"
EXAMPLES_PER_PAIR = 12
UTC = dt.UTC

SINKS = ("json", "avro", "avro-confluent", "protobuf-confluent", "json-confluent", "raw")

COLORS = ["RED", "GREEN", "BLUE"]
PROTO_COLORS = ["COLOR_UNSPECIFIED", *COLORS]


@dataclass(frozen=True)
class Source:
    """A source format over its fixed schema, with what its values must be: enum columns' names, and a rule
    for the whole row (a oneof sets one member)."""

    spec: Callable[[Path], FormatSpec]
    enums: dict[str, list[str]]
    fix_row: Callable[[dict[str, Any]], dict[str, Any]] = lambda row: row


def one_oneof_member(row: dict[str, Any]) -> dict[str, Any]:
    """Everything's ``payment`` oneof: the first of its members the row sets, the others unset."""
    members = ("card", "account", "billing")
    chosen = next((name for name in members if row[name] is not None), None)
    return {**row, **{name: None for name in members if name != chosen}}


def avro_confluent_spec(directory: Path) -> FormatSpec:
    (directory / "1.avsc").write_text(ALL_TYPES_AVSC.read_text())
    return FormatSpec("avro-confluent", schema_dir=directory, schema_id=1)


SOURCES = {
    "json": Source(lambda _: FormatSpec("json", schema=RECORD_SCHEMA), {"color": COLORS}),
    "json-confluent": Source(lambda _: FormatSpec("json-confluent", schema=RECORD_SCHEMA, schema_id=1),
                             {"color": COLORS}),
    "avro": Source(lambda _: FormatSpec("avro", schema=ALL_TYPES_AVSC), {"color": COLORS}),
    "avro-confluent": Source(avro_confluent_spec, {"color": COLORS}),
    "avro-nested": Source(lambda _: FormatSpec("avro", schema=NESTED_AVSC), {"shades[]": ["LIGHT", "DARK"]}),
    "protobuf-confluent": Source(
        lambda _: FormatSpec("protobuf-confluent", schema=ALL_TYPES_PROTO, message="epochline.test.Everything",
                             schema_id=1),
        {"color": PROTO_COLORS, "maybe_color": PROTO_COLORS, "palette[]": PROTO_COLORS}, one_oneof_member),
}

_NOT_JSON_SCHEMA = "JSON Schema (as mapped here) has no map"
_NESTED = "Protobuf has no list of lists, nor a list or map as a map value"
REFUSED: dict[tuple[str, str], dict[str, str]] = {
    **{(source, "raw"): {"value": "the raw format writes a 'value' column of bytes or text"} for source in SOURCES},
    ("avro", "json-confluent"): {"scores": _NOT_JSON_SCHEMA},
    ("avro-confluent", "json-confluent"): {"scores": _NOT_JSON_SCHEMA},
    ("protobuf-confluent", "json-confluent"): {"counts": _NOT_JSON_SCHEMA, "addresses": _NOT_JSON_SCHEMA,
                                               "ratios": _NOT_JSON_SCHEMA},
    ("avro-nested", "json-confluent"): {"groups": _NOT_JSON_SCHEMA, "deep": _NOT_JSON_SCHEMA},
    ("avro-nested", "protobuf-confluent"): {"grid": _NESTED, "groups": _NESTED, "deep": _NESTED},
}
"""The source columns each refused pairing names, and why (the README's table says the same)."""


# -- the generated records --------------------------------------------------------------------------------------

def values_of(kind: pa.DataType, path: str, source: Source) -> st.SearchStrategy[Any]:
    """Values of ``kind`` that the source's schema allows (``path`` names enum columns)."""
    if path in source.enums:
        return st.sampled_from(source.enums[path])
    if pa.types.is_struct(kind):
        return st.fixed_dictionaries({child.name: field_values(child, f"{path}.{child.name}", source)
                                      for child in kind})
    if pa.types.is_list(kind):
        return st.lists(field_values(kind.value_field, f"{path}[]", source), max_size=3)
    if pa.types.is_map(kind):
        keys = values_of(kind.key_type, f"{path}{{key}}", source)
        return st.dictionaries(keys, field_values(kind.item_field, f"{path}{{value}}", source), max_size=3).map(
            lambda entries: sorted(entries.items()))
    return scalars_of(kind)


def field_values(fld: pa.Field[pa.DataType], path: str, source: Source) -> st.SearchStrategy[Any]:
    values = values_of(fld.type, path, source)
    return st.none() | values if fld.nullable else values


def scalars_of(kind: pa.DataType) -> st.SearchStrategy[Any]:
    if pa.types.is_null(kind):
        return st.none()
    if pa.types.is_boolean(kind):
        return st.booleans()
    if pa.types.is_integer(kind):
        bits = kind.bit_width
        if pa.types.is_signed_integer(kind):
            return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        return st.integers(0, (1 << bits) - 1)
    if pa.types.is_floating(kind):
        return st.floats(width=kind.bit_width, allow_nan=False, allow_infinity=False)
    if pa.types.is_string(kind):
        return st.text(max_size=6)
    if pa.types.is_binary(kind):
        return st.binary(max_size=6)
    if pa.types.is_fixed_size_binary(kind):
        return st.binary(min_size=kind.byte_width, max_size=kind.byte_width)
    if pa.types.is_decimal(kind):  # unscaled integers, scaled exactly (Python's default context rounds at 28 digits)
        largest, exact = 10 ** kind.precision - 1, Context(prec=kind.precision)
        return st.integers(-largest, largest).map(lambda unscaled: Decimal(unscaled).scaleb(-kind.scale, exact))
    if pa.types.is_date32(kind):
        return st.dates()
    if pa.types.is_time(kind):
        return st.times().map(lambda value: truncated(value, kind.unit))
    if pa.types.is_timestamp(kind):
        low, high = (dt.datetime(1678, 1, 1), dt.datetime(2261, 12, 31)) if kind.unit == "ns" else (
            dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30))  # what an int64 of nanoseconds spans
        moments = st.datetimes(low, high).map(lambda value: truncated(value, kind.unit))
        return moments.map(lambda value: value.replace(tzinfo=UTC)) if kind.tz is not None else moments
    raise AssertionError(f"no values of {kind} are generated")


def truncated(value: Any, unit: str) -> Any:
    return value.replace(microsecond=value.microsecond // 1000 * 1000) if unit in ("s", "ms") else value


def rows_of(source: Source, schema: pa.Schema) -> st.SearchStrategy[list[dict[str, Any]]]:
    row = st.fixed_dictionaries({fld.name: field_values(fld, fld.name, source) for fld in schema})
    return st.lists(row.map(source.fix_row), min_size=1, max_size=4)


# -- the pairs --------------------------------------------------------------------------------------------------

@dataclass
class Pair:
    source: Format
    sink: Format
    """The sink, with a schema for the columns it writes."""
    refused: list[str]
    """What ``sink_problems`` says of the sink with a schema for every source column."""
    columns: list[str]
    """The source columns the sink writes: all but the refused ones."""


@pytest.fixture(scope="module")
def registry() -> Iterator[FakeSchemaRegistry]:
    with FakeSchemaRegistry() as fake:
        yield fake


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory, registry: FakeSchemaRegistry) -> Callable[[str, str], Pair]:
    """The pair of formats for (source, sink), made once per module."""
    made: dict[tuple[str, str], Pair] = {}

    def pair(source_name: str, sink_name: str) -> Pair:
        if (source_name, sink_name) not in made:
            directory = tmp_path_factory.mktemp(f"{source_name}-{sink_name}")
            source = make_format(SOURCES[source_name].spec(directory))
            assert source.arrow_schema is not None
            columns = source.arrow_schema
            sink = sink_format(sink_name, columns, directory, registry)
            refused = [str(problem) for problem in sink_problems(columns, sink)]
            kept = pa.schema([fld for fld in columns if fld.name not in refused_columns(refused)])
            if refused and sink_name != "raw":
                sink = sink_format(sink_name, kept, directory / "kept", registry)
            made[source_name, sink_name] = Pair(source, sink, refused, kept.names)
        return made[source_name, sink_name]
    return pair


def refused_columns(problems: list[str]) -> set[str]:
    """The top-level columns ``column address.zip: ...`` problems name."""
    return {re.split(r"[.\[{:]", problem.removeprefix("column "))[0] for problem in problems}


def sink_format(name: str, columns: pa.Schema, directory: Path, registry: FakeSchemaRegistry) -> Format:
    """The sink format ``name`` with the schema a user would write for ``columns``."""
    directory.mkdir(exist_ok=True)
    topic = f"matrix-{directory.name}"
    if name in ("avro", "avro-confluent"):
        path = directory / "out.avsc"
        path.write_text(json.dumps(avro_schema(columns)))
        if name == "avro":
            return make_format(FormatSpec("avro", schema=path))
        return make_format(FormatSpec("avro-confluent", schema=path, registry_url=registry.url, topic=topic))
    if name == "json-confluent":
        path = directory / "out.schema.json"
        path.write_text(json.dumps(json_schema(columns)))
        return make_format(FormatSpec("json-confluent", schema=path, registry_url=registry.url, topic=topic))
    if name == "protobuf-confluent":
        path = directory / "out.proto"
        path.write_text(proto_file(columns))
        return make_format(FormatSpec("protobuf-confluent", schema=path, message="matrix.Out", schema_id=1))
    return make_format(FormatSpec(name))  # type: ignore[arg-type]  # json or raw


# -- the equivalence --------------------------------------------------------------------------------------------

UNFIT = object()
"""The row holds a value the sink's schema cannot: it is left unwritten, for the dead-letter topic."""


def expected_in_sink(row: pa.RecordBatch, sink: Format) -> Any:
    """What the sink holds of a one-row batch: its values as Arrow's safe cast converts them to the sink
    schema's types, or ``UNFIT``."""
    assert sink.arrow_schema is not None
    try:
        [converted] = conform_batch(row, sink.arrow_schema, fmt=sink.name).to_pylist()
    except EncodeError:
        return UNFIT
    if sink.name == "protobuf-confluent" and has_null_element(converted):
        return UNFIT
    return in_key_order(converted)


def has_null_element(value: Any) -> bool:
    if isinstance(value, dict):
        return any(has_null_element(item) for item in value.values())
    if isinstance(value, list):
        return any(item is None or has_null_element(item) for item in value)
    if isinstance(value, tuple):
        return value[1] is None or has_null_element(value[1])
    return False


def in_key_order(value: Any) -> Any:
    """Map entries (lists of pairs) sorted by key, everywhere in ``value``."""
    if isinstance(value, dict):
        return {name: in_key_order(item) for name, item in value.items()}
    if isinstance(value, list):
        items = [in_key_order(item) for item in value]
        if items and all(isinstance(item, tuple) for item in items):
            return sorted(items, key=lambda entry: entry[0])
        return items
    if isinstance(value, tuple):
        return (value[0], in_key_order(value[1]))
    return value


def from_json(value: Any, kind: pa.DataType) -> Any:
    """What the ``json`` format's text of a value of ``kind`` stands for (see the module doc)."""
    if value is None:
        return None
    if pa.types.is_timestamp(kind):
        return dt.datetime.fromisoformat(value)
    if pa.types.is_date32(kind):
        return dt.date.fromisoformat(value)
    if pa.types.is_time(kind):
        return dt.time.fromisoformat(value)
    if pa.types.is_decimal(kind):
        return Decimal(value)
    if pa.types.is_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return base64.b64decode(value)
    if pa.types.is_floating(kind):
        return as_written_float(value, kind)
    if pa.types.is_list(kind):
        return [from_json(item, kind.value_type) for item in value]
    if pa.types.is_struct(kind):
        return {child.name: from_json(value[child.name], child.type) for child in kind}
    if pa.types.is_map(kind):
        if isinstance(value, dict):
            return [(key, from_json(item, kind.item_type)) for key, item in value.items()]
        return [(from_json(entry["key"], kind.key_type), from_json(entry["value"], kind.item_type)) for entry in value]
    return value


def as_written_float(value: Any, kind: pa.DataType) -> Any:
    if value is None:
        return None
    return float(np.float32(value)) if kind.bit_width == 32 else float(value)


def source_values(value: Any, kind: pa.DataType) -> Any:
    """A value of ``kind`` as ``to_pylist`` gives it, with float32 values as ``as_written_float`` reads them."""
    if value is None:
        return None
    if pa.types.is_floating(kind):
        return as_written_float(value, kind)
    if pa.types.is_list(kind):
        return [source_values(item, kind.value_type) for item in value]
    if pa.types.is_struct(kind):
        return {child.name: source_values(value[child.name], child.type) for child in kind}
    if pa.types.is_map(kind):
        return [(key, source_values(item, kind.item_type)) for key, item in value]
    return value


# -- the matrix -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sink_name", SINKS)
@pytest.mark.parametrize("source_name", list(SOURCES))
def test_a_sink_refuses_the_columns_it_cannot_write_and_takes_the_others(
        source_name: str, sink_name: str, pairs: Callable[[str, str], Pair]) -> None:
    """The refusals are ``REFUSED``'s; a sink schema without the refused columns is refused nothing."""
    pair = pairs(source_name, sink_name)
    assert refused_columns(pair.refused) == set(REFUSED.get((source_name, sink_name), {}))
    if sink_name != "raw":
        assert pair.source.arrow_schema is not None
        assert sink_problems(pair.source.arrow_schema.empty_table().select(pair.columns).schema, pair.sink) == []


@pytest.mark.parametrize("sink_name", [name for name in SINKS if name != "raw"])
@pytest.mark.parametrize("source_name", list(SOURCES))
@settings(max_examples=EXAMPLES_PER_PAIR, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_every_source_type_is_written_by_every_sink_or_refused_up_front(
        source_name: str, sink_name: str, pairs: Callable[[str, str], Pair], data: st.DataObject) -> None:
    pair = pairs(source_name, sink_name)
    source_schema = pair.source.arrow_schema
    assert source_schema is not None
    generated = pa.RecordBatch.from_pylist(data.draw(rows_of(SOURCES[source_name], source_schema)),
                                           schema=source_schema)
    decoded = pair.source.decode(pair.source.encode(generated))
    assert decoded.failures == []
    rows = decoded.batch.select(pair.columns)

    values, _, unwritten = encode_rows(pa.Table.from_batches([rows]), pair.sink, SinkSettings("out", "tx", "g"))

    if sink_name == "json":
        assert unwritten == []
        written = [orjson.loads(value or b"") for value in values]
        assert [{fld.name: from_json(value[fld.name], fld.type) for fld in rows.schema} for value in written] == [
            {fld.name: source_values(row[fld.name], fld.type) for fld in rows.schema} for row in rows.to_pylist()]
        return
    expected = [expected_in_sink(rows.slice(index, 1), pair.sink) for index in range(rows.num_rows)]
    assert [refused.row for refused in unwritten] == [index for index, row in enumerate(expected) if row is UNFIT]
    read_back = pair.sink.decode(values)
    assert read_back.failures == []
    assert [in_key_order(row) for row in read_back.batch.to_pylist()] == [row for row in expected if row is not UNFIT]
