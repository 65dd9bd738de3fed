"""Specification of the JSON format: JSON Schema / Avro typed or inferred, bulk decode with per-record isolation."""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from pathlib import Path
from typing import Any, cast

import orjson
import pyarrow as pa
import pytest

from schemas import DecodeFailure, EncodeError, FormatSpec, SchemaError, make_format
from schemas.base import Decoded, Format
from schemas.json_format import JsonFormat
from schemas.json_schema import json_schema_to_arrow
from tests.helpers.schema_samples import ALL_TYPES_AVSC, FIELDS_WITHOUT_JSON_FORM, all_types_rows

ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "user": {"type": "string"},
        "amount": {"type": "number"},
        "paid": {"type": "boolean"},
        "ts": {"type": "string", "format": "date-time"},
        "day": {"type": ["string", "null"], "format": "date"},
        "note": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {
            "city": {"type": "string"}, "zip": {"type": ["integer", "null"]}}, "required": ["city"]},
    },
    "required": ["id", "user", "amount", "ts"],
}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def write(tmp_path: Path, name: str, document: Any) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document))
    return path


class ThroughColumns:
    """A format whose ``decode`` reads the payloads as one Arrow binary column (``decode_column``, as Kafka
    sources read them): every specification below holds for both ways."""

    def __init__(self, fmt: JsonFormat) -> None:
        self._fmt = fmt

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fmt, name)

    def decode(self, payloads: list[bytes | None]) -> Decoded:
        return self._fmt.decode_column(pa.array(payloads, pa.binary()))


@pytest.fixture
def order_json(tmp_path: Path) -> JsonFormat:
    fmt = make_format(FormatSpec("json", schema=write(tmp_path, "order.schema.json", ORDER_SCHEMA)))
    assert isinstance(fmt, JsonFormat)
    return fmt


@pytest.fixture(params=["bytes", "column"])
def orders(order_json: JsonFormat, request: pytest.FixtureRequest) -> Format:
    return order_json if request.param == "bytes" else cast(Format, ThroughColumns(order_json))


def order_rows(count: int) -> list[dict[str, Any]]:
    rng = random.Random(5)
    return [{
        "id": rng.randrange(-2**63, 2**63),
        "user": rng.choice(["ann", "bob \"the\" builder", "zoë\n", ""]),
        "amount": rng.uniform(-1e9, 1e9),
        "paid": None if n % 5 == 0 else n % 2 == 0,
        "ts": _EPOCH + dt.timedelta(microseconds=rng.randrange(-10**15, 4 * 10**15)),
        "day": None if n % 3 == 0 else dt.date(2000, 1, 1) + dt.timedelta(days=n % 20000),
        "note": None if n % 2 else f"note {n}",
        "tags": None if n % 7 == 0 else [f"t{k}" for k in range(n % 3)],
        "address": None if n % 4 == 0 else {"city": f"c{n}", "zip": None if n % 3 else n},
    } for n in range(count)]


def good_order(n: int) -> bytes:
    return orjson.dumps({"id": n, "user": f"u{n}", "amount": 1.5, "ts": "2024-05-01T12:00:00Z"})


# ------------------------------------------------------------------------------------------- round trips

def test_round_trip_of_100k_json_schema_records_is_exact(orders: Format) -> None:
    batch = pa.RecordBatch.from_pylist(order_rows(100_000), schema=orders.arrow_schema)
    decoded = orders.decode(orders.encode(batch))
    assert decoded.failures == []
    assert decoded.batch.equals(batch)


def test_round_trip_of_100k_records_with_every_avro_type_json_can_hold_is_exact(tmp_path: Path) -> None:
    avsc = json.loads(ALL_TYPES_AVSC.read_text())
    avsc["fields"] = [f for f in avsc["fields"] if f["name"] not in FIELDS_WITHOUT_JSON_FORM]
    fmt = make_format(FormatSpec("json", schema=write(tmp_path, "json_types.avsc", avsc)))
    batch = pa.RecordBatch.from_pylist(all_types_rows(100_000), schema=fmt.arrow_schema)
    decoded = fmt.decode(fmt.encode(batch))
    assert decoded.failures == []
    assert decoded.batch.equals(batch)


def test_inferred_types_round_trip() -> None:
    fmt = make_format(FormatSpec("json"))
    assert fmt.arrow_schema is None
    decoded = fmt.decode([b'{"a": 1, "b": "x", "c": [1.5], "d": {"e": true}}', b'{"a": 2, "b": null}'])
    again = fmt.decode(fmt.encode(decoded.batch))
    assert again.batch.equals(decoded.batch)
    assert decoded.batch.to_pylist()[1] == {"a": 2, "b": None, "c": None, "d": None}


# ------------------------------------------------------------------------------------------- encoding

def test_timestamps_are_written_as_iso_8601_utc_with_z(orders: Format) -> None:
    row = order_rows(1)[0] | {"ts": dt.datetime(2024, 5, 1, 12, 34, 56, 789000, tzinfo=dt.UTC),
                              "day": dt.date(2024, 2, 29)}
    [payload] = orders.encode(pa.RecordBatch.from_pylist([row], schema=orders.arrow_schema))
    assert orjson.loads(payload)["ts"] == "2024-05-01T12:34:56.789000Z"
    assert orjson.loads(payload)["day"] == "2024-02-29"


def test_decimals_are_written_as_strings_so_no_digit_is_lost(tmp_path: Path) -> None:
    avsc = {"type": "record", "name": "P", "fields": [
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 30, "scale": 10}}]}
    fmt = make_format(FormatSpec("json", schema=write(tmp_path, "p.avsc", avsc)))
    from decimal import Decimal

    batch = pa.RecordBatch.from_pydict({"price": pa.array([Decimal("12345678901234567890.0123456789")],
                                                          pa.decimal128(30, 10))})
    [payload] = fmt.encode(batch)
    assert payload == b'{"price":"12345678901234567890.0123456789"}'


def test_non_finite_floats_are_written_as_null() -> None:
    fmt = make_format(FormatSpec("json"))
    batch = pa.RecordBatch.from_pydict({"x": [float("nan"), float("inf"), 1.0]})
    assert fmt.encode(batch) == [b'{"x":null}', b'{"x":null}', b'{"x":1.0}']


def test_encode_column_holds_the_values_encode_returns_as_one_binary_column(order_json: JsonFormat) -> None:
    batch = pa.RecordBatch.from_pylist(order_rows(50), schema=order_json.arrow_schema)
    column = order_json.encode_column(batch)
    assert column.type == pa.binary()
    assert column.to_pylist() == order_json.encode(batch)
    assert order_json.encode_column(batch.slice(0, 0)).to_pylist() == []


def test_encode_of_a_column_without_json_form_names_it() -> None:
    with pytest.raises(EncodeError, match=r"column took \(duration\[s\]\) has no JSON representation"):
        make_format(FormatSpec("json")).encode(pa.RecordBatch.from_pydict({"took": pa.array([1], pa.duration("s"))}))


def test_a_map_with_string_keys_is_written_as_an_object() -> None:
    counts = pa.array([[("a", 1), ("b", None)], [], None], pa.map_(pa.string(), pa.int64()))
    written = make_format(FormatSpec("json")).encode(pa.RecordBatch.from_pydict({"counts": counts}))
    assert [orjson.loads(value) for value in written] == [
        {"counts": {"a": 1, "b": None}}, {"counts": {}}, {"counts": None}]


def test_a_map_with_other_keys_is_written_as_an_array_of_key_value_objects() -> None:
    names = pa.array([[(7, "seven"), (-1, "minus one")], None], pa.map_(pa.int64(), pa.string()))
    written = make_format(FormatSpec("json")).encode(pa.RecordBatch.from_pydict({"names": names}))
    assert [orjson.loads(value) for value in written] == [
        {"names": [{"key": 7, "value": "seven"}, {"key": -1, "value": "minus one"}]}, {"names": None}]


def test_values_nested_in_a_map_are_written_as_their_json_text() -> None:
    seen = pa.array([[("first", dt.datetime(2024, 5, 1, 12, tzinfo=dt.UTC))]],
                    pa.map_(pa.string(), pa.timestamp("ms", tz="UTC")))
    written = make_format(FormatSpec("json")).encode(pa.RecordBatch.from_pydict({"seen": seen}))
    assert orjson.loads(written[0]) == {"seen": {"first": "2024-05-01T12:00:00.000Z"}}


def test_bytes_are_written_as_base64_text() -> None:
    batch = pa.RecordBatch.from_pydict({"raw": pa.array([b"\x00\xff", b"", None], pa.binary()),
                                        "digest": pa.array([b"ab", b"cd", None], pa.binary(2))})
    written = make_format(FormatSpec("json")).encode(batch)
    assert [orjson.loads(value) for value in written] == [
        {"raw": "AP8=", "digest": "YWI="}, {"raw": "", "digest": "Y2Q="}, {"raw": None, "digest": None}]


def test_encode_without_a_required_column_names_it(orders: Format) -> None:
    with pytest.raises(EncodeError, match="no column 'user'"):
        orders.encode(pa.RecordBatch.from_pydict({"id": [1]}))


# ------------------------------------------------------------------------------------------- failures

@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"not json at all", "not JSON: "),
        (b'{"id": 1,', "not JSON: "),
        (b"", "empty payload: not JSON"),
        (b"  \n ", "empty payload: not JSON"),
        (b"[1, 2]", "not a JSON object: got array"),
        (b"42", "not a JSON object: got integer"),
        (b'"text"', "not a JSON object: got string"),
        (b'{"id": "7", "user": "u", "amount": 1, "ts": "2024-01-01T00:00:00Z"}',
         "field 'id': expected integer, got string \"7\""),
        (b'{"id": 1.5, "user": "u", "amount": 1, "ts": "2024-01-01T00:00:00Z"}',
         "field 'id': expected integer, got number 1.5"),
        (b'{"id": 1, "user": "u", "amount": true, "ts": "2024-01-01T00:00:00Z"}',
         "field 'amount': expected number, got boolean true"),
        (b'{"id": 1, "amount": 1, "ts": "2024-01-01T00:00:00Z"}', "missing required field 'user'"),
        (b'{"id": 1, "user": null, "amount": 1, "ts": "2024-01-01T00:00:00Z"}',
         "field 'user' is null but the schema does not allow null"),
        (b'{"id": 1, "user": "u", "amount": 1, "ts": "yesterday"}',
         "field 'ts': 'yesterday' is not an ISO-8601 date-time"),
        (b'{"id": 1, "user": "u", "amount": 1, "ts": 1714564800}',
         "field 'ts': expected string (an ISO-8601 date-time), got integer 1714564800"),
        (b'{"id": 1, "user": "u", "amount": 1, "ts": "2024-01-01T00:00:00Z", "day": "2024-13-45"}',
         "field 'day': '2024-13-45' is not an ISO-8601 date (YYYY-MM-DD)"),
        (b'{"id": 1, "user": "u", "amount": 1, "ts": "2024-01-01T00:00:00Z", "address": {"zip": 1}}',
         "missing required field 'address.city'"),
        (b'{"id": 1, "user": "u", "amount": 1, "ts": "2024-01-01T00:00:00Z", "address": {"city": 5}}',
         "field 'address.city': expected string, got integer 5"),
        (b'{"id": 1, "user": "u", "amount": 1, "ts": "2024-01-01T00:00:00Z", "tags": ["a", 2]}',
         "field 'tags[1]': expected string, got integer 2"),
        (b'{"id": 1, "user": "u", "amount": 1, "ts": "2024-01-01T00:00:00Z", "tags": ["a", null]}',
         "field 'tags[1]' is null but the schema does not allow null"),
        (b'{"id": 99999999999999999999, "user": "u", "amount": 1, "ts": "2024-01-01T00:00:00Z"}',
         "field 'id': expected integer, got number 1e+20"),  # orjson reads integers beyond 64 bits as floats
        (b'{"id": 1, "user": "u", "amount": 1, "ts": "2024-01-01T00:00:00Z", "address": {"city": "c", "zip": 2e3}}',
         "field 'address.zip': expected integer, got number 2000.0"),
    ],
)
def test_bad_payload_is_a_failure_naming_the_problem(orders: Format, payload: bytes, reason: str) -> None:
    decoded = orders.decode([good_order(0), payload, good_order(2)])
    assert decoded.indices == [0, 2]
    assert decoded.batch.column("id").to_pylist() == [0, 2]
    [failure] = decoded.failures
    assert failure.index == 1
    assert reason in failure.reason


def test_two_objects_in_one_payload_are_a_failure(orders: Format) -> None:
    decoded = orders.decode([good_order(0), good_order(1) + good_order(2), good_order(3)])
    assert decoded.indices == [0, 2]
    assert decoded.failures[0].index == 1


def test_null_payload_is_a_tombstone_failure(orders: Format) -> None:
    assert orders.decode([None]).failures == [DecodeFailure(0, "null payload (tombstone)")]


def test_required_nulls_are_found_without_leaving_the_bulk_path(orders: Format) -> None:
    missing = b'{"id": 3, "amount": 1, "ts": "2024-01-01T00:00:00Z"}'
    decoded = orders.decode([good_order(0), missing, good_order(2)])
    assert decoded.indices == [0, 2]
    assert decoded.failures == [DecodeFailure(1, "missing required field 'user'")]


def test_many_bad_rows_among_many_good_ones_are_all_isolated(orders: Format) -> None:
    payloads = [good_order(n) if n % 10 else b"{broken" for n in range(5000)]
    decoded = orders.decode(payloads)
    assert len(decoded.failures) == 500
    assert decoded.indices == [n for n in range(5000) if n % 10]
    assert decoded.batch.column("id").to_pylist() == decoded.indices


def test_pretty_printed_payloads_with_line_breaks_decode(orders: Format) -> None:
    payload = json.dumps({"id": 1, "user": "multi\nline", "amount": 2, "ts": "2024-01-01T00:00:00+02:00"},
                         indent=2).encode()
    [row] = orders.decode([payload]).batch.to_pylist()
    assert row["user"] == "multi\nline"
    assert row["ts"] == dt.datetime(2023, 12, 31, 22, 0, tzinfo=dt.UTC)


def test_whitespace_around_a_payload_and_line_breaks_inside_it_decode_in_any_batch(orders: Format) -> None:
    pretty = json.dumps({"id": 9, "user": "p", "amount": 2, "ts": "2024-01-01T00:00:00Z"}, indent=2).encode()
    payloads = [b" \t" + good_order(0), good_order(1) + b"\n", b"\r\n" + good_order(2) + b" ", pretty]
    for batch in (payloads, [*payloads, b"{broken"], [good_order(n) for n in range(3, 400)] + payloads):
        decoded = orders.decode(batch)
        assert decoded.batch.column("id").to_pylist()[-4:] == [0, 1, 2, 9]


def test_a_raw_line_break_inside_a_string_is_a_failure_even_alone(orders: Format) -> None:
    """Blanking line breaks for Arrow's line-delimited reader once turned this invalid payload into a valid one."""
    payload = b'{"id": 1, "user": "a\nb", "amount": 1, "ts": "2024-01-01T00:00:00Z"}'
    for batch in ([payload], [payload, good_order(2)], [b"{", payload]):
        failures = orders.decode(batch).failures
        assert [f.reason for f in failures if f.index == batch.index(payload)] == [
            "not JSON: unexpected control character in string: line 1 column 21 (char 20)"]


def test_a_payload_cut_short_does_not_run_on_into_the_next_ones(orders: Format) -> None:
    """Arrow reads objects, not lines: the first runs on into the second, the third's two objects make up the
    count, and all three were rows (with the wrong payloads' offsets)."""
    cut = good_order(0)[:-1] + b', "extra":'
    decoded = orders.decode([cut, b'{"deep": 1}}', good_order(1) + good_order(2), good_order(3)])
    assert decoded.indices == [3]
    assert [f.index for f in decoded.failures] == [0, 1, 2]


@pytest.mark.parametrize("payload", [
    b"null", b" null ", b"1", b'"s"', b"[]", b"", b"\xef\xbb\xbf" + good_order(7),
    good_order(7)[:-1] + b', "x": NaN}', good_order(7)[:-1] + b', "x": [-Infinity]}',
    good_order(7)[:-1] + b', "x": 1.8e308}', good_order(7)[:-1] + b', "x": -' + b"9" * 400 + b"}",
    good_order(7)[:-1] + b', "x": "\xff"}', good_order(7)[:-1] + b', "\xc0\xaf": 1}',
    good_order(7)[:-1] + b', "x": ' + b"[" * 1024 + b"]" * 1024 + b"}",
], ids=["null", "spaced null", "number", "string", "array", "empty", "byte order mark", "NaN", "-Infinity",
        "1.8e308", "400 digits", "invalid UTF-8", "invalid UTF-8 name", "1025 levels"])
def test_json_arrow_reads_and_orjson_refuses_is_a_failure_in_any_batch(orders: Format, payload: bytes) -> None:
    many = [good_order(n) for n in range(300)]  # a buffer large enough for the other scanner
    for batch in ([payload], [payload, good_order(1)], [good_order(1), payload], [b"{", payload], [*many, payload]):
        decoded = orders.decode(batch)
        assert batch.index(payload) not in decoded.indices, batch[:2]
        assert len(decoded.indices) + len(decoded.failures) == len(batch)


@pytest.mark.parametrize("value", [b"NaN", b"[1, -Infinity]", b'{"a": {"b": 1.8e308}}', b"9" * 400,
                                   b"[" * 1024 + b"]" * 1024],
                         ids=["NaN", "-Infinity", "1.8e308", "400 digits", "1025 levels"])
def test_without_a_schema_json_arrow_reads_and_orjson_refuses_is_a_failure_in_any_batch(value: bytes) -> None:
    """Without a schema Arrow keeps every member, so these show as NaN or infinite values in what it read."""
    inferred = make_format(FormatSpec("json"))
    payload = good_order(7)[:-1] + b', "x": ' + value + b"}"
    many = [good_order(n) for n in range(300)]
    for batch in ([payload], [payload, good_order(1)], [good_order(1), payload], [b"{", payload], [*many, payload]):
        decoded = inferred.decode(batch)
        assert batch.index(payload) not in decoded.indices
        assert len(decoded.indices) == len(batch) - 1 - (batch[0] == b"{")


@pytest.mark.parametrize("payload", [
    good_order(7)[:-1] + b', "x": [1e308, -1.7976931348623157e308, 1e-400, 123456789012345678901234567890]}',
    good_order(7)[:-1] + b', "x": ' + b"[" * 1023 + b"]" * 1023 + b"}",
    good_order(7)[:-1] + b', "x": "NaN, Infinity, 1e999, ' + b"9" * 400 + b'"}',
    good_order(7).replace(b"2024-05-01T12:00:00Z", b"0000-01-01T00:00:00Z"),  # year 0: Python's parser refuses it
], ids=["numbers at the double's edges", "1024 levels", "tokens inside a string", "year 0"])
def test_what_arrow_and_orjson_both_read_decodes_in_any_batch(orders: Format, payload: bytes) -> None:
    many = [good_order(n) for n in range(300)]
    for batch in ([payload], [payload, good_order(1)], [b"{", payload], [*many, payload]):
        assert batch.index(payload) in orders.decode(batch).indices


def test_a_wrong_type_nested_deeper_than_orjson_writes_is_a_failure_with_a_preview(orders: Format) -> None:
    for kind, value in (("array", b"[" * 1000 + b"]" * 1000), ("object", b'{"a":' * 1000 + b"1" + b"}" * 1000)):
        payload = b'{"id": 1, "user": ' + value + b', "amount": 1, "ts": "2024-01-01T00:00:00Z"}'
        [failure] = orders.decode([payload]).failures
        assert failure.reason.startswith(f"field 'user': expected string, got {kind} ")
        assert failure.reason.endswith("...") and len(failure.reason) < 120


def test_key_order_in_the_payload_does_not_matter(orders: Format) -> None:
    payload = b'{"ts": "2024-01-01T00:00:00Z", "amount": 2, "user": "u", "id": 1}'
    [row] = orders.decode([payload]).batch.to_pylist()
    assert (row["id"], row["user"], row["amount"]) == (1, "u", 2.0)


def test_unknown_fields_are_ignored(orders: Format) -> None:
    payload = b'{"id": 1, "user": "u", "amount": 1, "ts": "2024-01-01T00:00:00Z", "extra": {"deep": [1]}}'
    assert orders.decode([payload]).batch.num_rows == 1


def test_inference_fails_rows_whose_types_conflict_with_earlier_rows() -> None:
    fmt = make_format(FormatSpec("json"))
    decoded = fmt.decode([b'{"a": 1}', b'{"a": 2}', b'{"a": "three"}', b'{"a": 4}', b"[]"])
    assert decoded.batch.column("a").to_pylist() == [1, 2, 4]
    assert decoded.indices == [0, 1, 3]
    assert "incompatible types" in decoded.failures[0].reason and decoded.failures[0].index == 2
    assert decoded.failures[1] == DecodeFailure(4, "not a JSON object: got array")


# ------------------------------------------------------------------------------------------- JSON Schema mapping

def test_json_schema_maps_to_arrow_types_and_nullability() -> None:
    schema = json_schema_to_arrow(ORDER_SCHEMA, where="test")
    assert schema == pa.schema([
        pa.field("id", pa.int64(), nullable=False),
        pa.field("user", pa.string(), nullable=False),
        pa.field("amount", pa.float64(), nullable=False),
        pa.field("paid", pa.bool_()),
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("day", pa.date32()),
        pa.field("note", pa.string()),
        pa.field("tags", pa.list_(pa.field("item", pa.string(), nullable=False))),
        pa.field("address", pa.struct([pa.field("city", pa.string(), nullable=False), pa.field("zip", pa.int64())])),
    ])


def test_required_property_whose_type_allows_null_is_nullable() -> None:
    schema = json_schema_to_arrow({"type": "object", "properties": {"x": {"type": ["null", "integer"]}},
                                   "required": ["x"]}, where="test")
    assert schema.field("x").nullable


def test_string_enum_maps_to_string() -> None:
    schema = json_schema_to_arrow({"type": "object", "properties": {"c": {"enum": ["a", "b"]}}}, where="test")
    assert schema.field("c").type == pa.string()


@pytest.mark.parametrize(
    ("prop", "message"),
    [
        ({"type": ["integer", "string"]}, "several non-null types"),
        ({"oneOf": [{"type": "integer"}]}, "'oneOf' is not supported"),
        ({"$ref": "#/defs/x"}, "'$ref' is not supported"),
        ({"type": "object"}, "object without 'properties'"),
        ({"type": "array"}, "array needs 'items'"),
        ({"type": "tuple"}, "unsupported type 'tuple'"),
    ],
)
def test_unsupported_json_schema_is_a_schema_error_naming_file_and_property(
        tmp_path: Path, prop: dict[str, Any], message: str) -> None:
    path = write(tmp_path, "bad.schema.json", {"type": "object", "properties": {"outer": {
        "type": "object", "properties": {"inner": prop}}}})
    with pytest.raises(SchemaError, match=rf"bad.schema.json, property 'outer.inner': .*{re.escape(message)}"):
        make_format(FormatSpec("json", schema=path))


def test_missing_schema_file_is_a_schema_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="absent.json"):
        make_format(FormatSpec("json", schema=tmp_path / "absent.json"))


def test_unparsable_schema_file_is_a_schema_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{")
    with pytest.raises(SchemaError, match="broken.json is not valid JSON"):
        make_format(FormatSpec("json", schema=path))


def test_avro_schema_with_bytes_is_refused_for_json_naming_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, "b.avsc", {"type": "record", "name": "B", "fields": [{"name": "blob", "type": "bytes"}]})
    with pytest.raises(SchemaError, match="field blob .*no JSON representation"):
        make_format(FormatSpec("json", schema=path))


def test_integer_beyond_an_avro_int_is_a_failure_naming_the_range(tmp_path: Path) -> None:
    path = write(tmp_path, "i.avsc", {"type": "record", "name": "I", "fields": [{"name": "i", "type": "int"}]})
    decoded = make_format(FormatSpec("json", schema=path)).decode([b'{"i": 1}', b'{"i": 3000000000}'])
    assert decoded.indices == [0]
    assert decoded.failures == [DecodeFailure(1, "field 'i': 3000000000 is out of range for int32")]


def test_random_corruptions_never_raise_and_every_payload_is_accounted_for(orders: Format) -> None:
    rng = random.Random(9)
    payloads = []
    for n in range(3000):
        payload = bytearray(good_order(n))
        for _ in range(rng.randrange(0, 3)):
            payload[rng.randrange(len(payload))] = rng.randrange(256)
        payloads.append(bytes(payload[:rng.randrange(len(payload) + 1)] if n % 5 == 0 else payload))
    decoded = orders.decode(payloads)
    assert sorted(decoded.indices + [f.index for f in decoded.failures]) == list(range(3000))
    assert decoded.batch.num_rows == len(decoded.indices)
    intact = [n for n, p in enumerate(payloads) if p == good_order(n)]
    assert set(intact) <= set(decoded.indices)


def test_without_a_schema_a_column_decodes_as_its_values_do() -> None:
    inferred = make_format(FormatSpec("json"))
    assert isinstance(inferred, JsonFormat)
    mixed = [b'{"a": 1}', b'{"a": "x"}', None, b'{"a": NaN}', b' {"c": 1} ']
    for batch in ([b'{"a": 1}', b'{"a": 2, "b": [1]}'], mixed):
        assert inferred.decode_column(pa.array(batch, pa.binary())) == inferred.decode(batch)
