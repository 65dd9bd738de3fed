"""Specification of the plain Avro format: schemaless records with one .avsc schema."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from pathlib import Path

import fastavro
import pyarrow as pa
import pytest

from schemas import DecodeFailure, EncodeError, FormatSpec, SchemaError, make_format
from schemas.base import Format
from tests.helpers.schema_samples import ALL_TYPES_AVSC, all_types_rows, count_per_record_reads

SMALL_SCHEMA = {"type": "record", "name": "Small", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
]}


@pytest.fixture(scope="module")
def all_types() -> Format:
    return make_format(FormatSpec("avro", schema=ALL_TYPES_AVSC))


@pytest.fixture
def small(tmp_path: Path) -> Format:
    path = tmp_path / "small.avsc"
    path.write_text(json.dumps(SMALL_SCHEMA))
    return make_format(FormatSpec("avro", schema=path))


def fastavro_bytes(record: dict) -> bytes:
    """A record written by fastavro itself (the reference implementation), not by our encoder."""
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(SMALL_SCHEMA), record)
    return buffer.getvalue()


def test_round_trip_of_100k_records_with_every_type_is_exact(all_types: Format) -> None:
    batch = pa.RecordBatch.from_pylist(all_types_rows(100_000), schema=all_types.arrow_schema)
    decoded = all_types.decode(all_types.encode(batch))
    assert decoded.failures == []
    assert decoded.indices == list(range(100_000))
    assert decoded.batch.equals(batch)


def test_decoded_values_match_what_fastavro_writes(small: Format) -> None:
    import datetime as dt

    ts = dt.datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=dt.UTC)
    decoded = small.decode([fastavro_bytes({"id": 7, "name": None, "ts": ts})])
    assert decoded.batch.to_pylist() == [{"id": 7, "name": None, "ts": ts}]


def test_truncated_payload_is_a_failure_saying_truncated(small: Format) -> None:
    payload = fastavro_bytes({"id": 1, "name": "a long enough name", "ts": 0})
    decoded = small.decode([payload[:6]])
    assert decoded.failures == [DecodeFailure(0, decoded.failures[0].reason)]
    assert "truncated" in decoded.failures[0].reason


def test_trailing_garbage_is_a_failure_saying_invalid(small: Format) -> None:
    decoded = small.decode([fastavro_bytes({"id": 1, "name": None, "ts": 0}) + b"\xff\xff"])
    assert "invalid" in decoded.failures[0].reason
    assert "left over" in decoded.failures[0].reason


def test_random_garbage_never_raises_and_every_payload_is_accounted_for(small: Format) -> None:
    import random

    rng = random.Random(3)
    garbage = [rng.randbytes(rng.randrange(0, 40)) for _ in range(2000)]
    decoded = small.decode(garbage)
    assert len(decoded.indices) + len(decoded.failures) == len(garbage)
    for failure in decoded.failures:
        assert "Avro payload is" in failure.reason


def test_decimal_wider_than_its_precision_is_a_failure_beside_good_rows(tmp_path: Path) -> None:
    schema = {"type": "record", "name": "D", "fields": [
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}}]}
    path = tmp_path / "d.avsc"
    path.write_text(json.dumps(schema))
    fmt = make_format(FormatSpec("avro", schema=path))
    physical = fastavro.parse_schema({"type": "record", "name": "D", "fields": [{"name": "amount", "type": "bytes"}]})
    too_wide = io.BytesIO()
    fastavro.schemaless_writer(too_wide, physical, {"amount": (10**40).to_bytes(17, "big", signed=True)})
    good = fmt.encode(pa.RecordBatch.from_pydict({"amount": pa.array([1, 2], pa.decimal128(10, 2))}))
    decoded = fmt.decode([good[0], too_wide.getvalue(), good[1]])
    assert decoded.indices == [0, 2]
    assert decoded.failures[0].index == 1
    assert "more digits than decimal128(10, 2)" in decoded.failures[0].reason


def avro_format(tmp_path: Path, fields: list[dict[str, object]]) -> Format:
    path = tmp_path / "r.avsc"
    path.write_text(json.dumps({"type": "record", "name": "R", "fields": fields}))
    return make_format(FormatSpec("avro", schema=path))


def test_decimal_beyond_its_precision_within_16_bytes_is_a_failure_naming_the_field(tmp_path: Path) -> None:
    fmt = avro_format(tmp_path, [{"name": "p", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10,
                                                         "scale": 2}}])
    too_many_digits, ten_digits = b"\x7f" + b"\xff" * 15, (10**10 - 1).to_bytes(5, "big", signed=True)
    decoded = fmt.decode([b"\x02\x01", b"\x20" + too_many_digits, b"\x0a" + ten_digits])  # length, then the bytes
    assert decoded.indices == [0, 2]
    assert decoded.batch.column("p").to_pylist() == [Decimal("0.01"), Decimal("99999999.99")]
    decoded.batch.validate(full=True)
    assert "field 'p': a decimal value has more digits than decimal128(10, 2) holds" in decoded.failures[0].reason


@pytest.mark.parametrize(("field", "value"), [
    ({"type": "int"}, 1 << 31), ({"type": "int"}, -(1 << 31) - 1), ({"type": "int", "logicalType": "date"}, 1 << 40),
])
def test_an_int_beyond_32_bits_is_a_failure_naming_the_field(tmp_path: Path, field: dict[str, object],
                                                              value: int) -> None:
    fmt = avro_format(tmp_path, [{"name": "id", "type": "long"}, {"name": "n", "type": field}])
    as_long = fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "id", "type": "long"}, {"name": "n", "type": "long"}]})
    payloads = []
    for record in ({"id": 1, "n": 5}, {"id": 2, "n": value}, {"id": 3, "n": -5}):
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, as_long, record)
        payloads.append(buffer.getvalue())
    decoded = fmt.decode(payloads)
    assert decoded.indices == [0, 2]
    assert [f.index for f in decoded.failures] == [1]
    assert f"field 'n': {value} does not fit in 32 bits (Avro int)" in decoded.failures[0].reason


@pytest.mark.parametrize("field", [{"type": "int", "logicalType": "time-millis"},
                                   {"type": "long", "logicalType": "time-micros"}])
@pytest.mark.parametrize("ticks", [-1, 86_400_000_000])
def test_a_time_of_day_outside_a_day_is_a_failure_naming_the_field(tmp_path: Path, field: dict[str, object],
                                                                   ticks: int) -> None:
    fmt = avro_format(tmp_path, [{"name": "t", "type": field}])
    plain = fastavro.parse_schema({"type": "record", "name": "R", "fields": [{"name": "t", "type": "long"}]})
    payloads = []
    for value in (0, ticks // 1000 if field["type"] == "int" and ticks > 0 else ticks, 1000):
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, plain, {"t": value})
        payloads.append(buffer.getvalue())
    decoded = fmt.decode(payloads)
    assert decoded.indices == [0, 2]
    decoded.batch.validate(full=True)
    assert "field 't': a time of day outside [0, 24h)" in decoded.failures[0].reason


def test_a_varint_longer_than_64_bits_is_a_failure_not_a_wrapped_value(tmp_path: Path) -> None:
    fmt = avro_format(tmp_path, [{"name": "id", "type": "long"}, {"name": "s", "type": "string"}])
    ten_bytes = b"\xff" * 9 + b"\x01"  # -2**63, the longest valid varint
    decoded = fmt.decode([ten_bytes + b"\x02a", b"\x80" * 10 + b"\x02" + b"\x02a", b"\xfe" + b"\xff" * 8 + b"\x03\x02a",
                          b"\x80" * 11 + b"\x02a"])
    assert decoded.indices == [0]
    assert decoded.batch.to_pylist() == [{"id": -(1 << 63), "s": "a"}]
    assert [f.index for f in decoded.failures] == [1, 2, 3]
    assert "field 'id': 1180591620717411303424 does not fit in 64 bits (Avro long)" in decoded.failures[0].reason


def test_payloads_read_by_the_exact_reader_decode_the_same(all_types: Format) -> None:
    """Text in a non-Latin script has long runs of bytes above 0x7f, so these payloads are varint suspects."""
    rows = all_types_rows(200)
    for row in rows:
        row["s"] = "日本語のテキスト" * 3
    batch = pa.RecordBatch.from_pylist(rows, schema=all_types.arrow_schema)
    decoded = all_types.decode(all_types.encode(batch))
    assert decoded.failures == []
    assert decoded.batch.equals(batch)


def test_null_payload_is_a_tombstone_failure(small: Format) -> None:
    assert small.decode([None]).failures == [DecodeFailure(0, "null payload (tombstone)")]


def test_good_rows_survive_beside_bad_ones_in_input_order(small: Format) -> None:
    good = [fastavro_bytes({"id": n, "name": f"n{n}", "ts": n}) for n in range(4)]
    decoded = small.decode([good[0], b"\x01", good[1], None, good[2], good[3][:-1] + b"", good[3]])
    assert decoded.indices == [0, 2, 4, 6]
    assert decoded.batch.column("id").to_pylist() == [0, 1, 2, 3]
    assert [f.index for f in decoded.failures] == [1, 3, 5]


def test_a_batch_of_well_formed_records_is_read_column_wise_and_one_bad_record_sends_it_record_by_record(
        small: Format, monkeypatch: pytest.MonkeyPatch) -> None:
    good = [fastavro_bytes({"id": n, "name": None if n % 2 else f"n{n}", "ts": n}) for n in range(100)]
    reads = count_per_record_reads(monkeypatch)

    whole = small.decode(good)
    assert (reads[0], whole.indices, whole.failures) == (0, list(range(100)), [])
    mixed = small.decode([*good[:50], good[50] + b"\x00", *good[51:]])
    assert reads[0] == 100
    assert mixed.batch.slice(0, 50).equals(whole.batch.slice(0, 50))
    assert mixed.batch.slice(50).equals(whole.batch.slice(51))
    assert [f.index for f in mixed.failures] == [50] and "left over" in mixed.failures[0].reason


def test_encode_picks_columns_by_name_and_casts_compatible_types(small: Format) -> None:
    batch = pa.RecordBatch.from_pydict({
        "extra": ["ignored"],
        "ts": pa.array([1_700_000_000_000_000], pa.timestamp("us", tz="UTC")),
        "id": pa.array([5], pa.int32()),
    })
    decoded = small.decode(small.encode(batch))
    assert decoded.batch.to_pylist()[0]["id"] == 5
    assert decoded.batch.column("name").null_count == 1
    assert decoded.batch.column("ts").cast(pa.int64()).to_pylist() == [1_700_000_000_000]


def test_encode_without_a_required_column_names_it(small: Format) -> None:
    with pytest.raises(EncodeError, match="no column 'ts'"):
        small.encode(pa.RecordBatch.from_pydict({"id": [1]}))


def test_encode_of_a_null_in_a_required_column_names_it(small: Format) -> None:
    batch = pa.RecordBatch.from_pydict({"id": [1, None], "ts": pa.array([0, 0], pa.timestamp("ms", tz="UTC"))})
    with pytest.raises(EncodeError, match="column 'id' has 1 null"):
        small.encode(batch)


def test_encode_refuses_a_lossy_timestamp_cast(small: Format) -> None:
    batch = pa.RecordBatch.from_pydict({"id": [1], "ts": pa.array([1_001], pa.timestamp("us", tz="UTC"))})
    with pytest.raises(EncodeError, match="column 'ts'"):
        small.encode(batch)


def test_encode_of_an_unknown_enum_symbol_names_the_row(all_types: Format) -> None:
    rows = all_types_rows(2)
    rows[1]["color"] = "PURPLE"
    with pytest.raises(EncodeError, match="row 1"):
        all_types.encode(pa.RecordBatch.from_pylist(rows, schema=all_types.arrow_schema))


def test_missing_schema_file_is_a_schema_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="nope.avsc"):
        make_format(FormatSpec("avro", schema=tmp_path / "nope.avsc"))


def test_unparsable_schema_file_is_a_schema_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "broken.avsc"
    path.write_text('{"type": "record", "name": ')
    with pytest.raises(SchemaError, match="broken.avsc is not valid JSON"):
        make_format(FormatSpec("avro", schema=path))


def test_invalid_avro_schema_is_a_schema_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "invalid.avsc"
    path.write_text(json.dumps({"type": "record", "name": "R", "fields": [{"name": "x", "type": "nosuchtype"}]}))
    with pytest.raises(SchemaError, match="invalid Avro schema in .*invalid.avsc"):
        make_format(FormatSpec("avro", schema=path))


def test_unsupported_union_is_a_schema_error_naming_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "union.avsc"
    path.write_text(json.dumps({"type": "record", "name": "R", "fields": [{"name": "x", "type": ["int", "string"]}]}))
    with pytest.raises(SchemaError, match=r"union.avsc, field 'x'"):
        make_format(FormatSpec("avro", schema=path))


def test_avro_without_a_schema_is_a_schema_error() -> None:
    with pytest.raises(SchemaError, match="avro format needs a schema"):
        make_format(FormatSpec("avro"))
