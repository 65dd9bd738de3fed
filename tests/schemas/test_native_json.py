"""Specification of the C reader and writer for flat JSON (``schemas.native_json``): the reader reads what it
takes to the same values as the reference path and hands back everything else, so no payload's verdict
depends on the path; the writer writes the bytes DuckDB's ``to_json`` writes.

Each check decodes the same payloads twice through ``JsonFormat.decode_column``: once as shipped (the C
reader first) and once with ``EPOCHLINE_NATIVE_JSON=0`` (the reference path only), and wants the same batch,
the same decoded rows and the same failures with the same reasons. Counting the batches the C reader took
keeps the comparison from passing by never using it.
"""

from __future__ import annotations

import datetime as dt
import random
import struct
from collections.abc import Iterator
from typing import cast

import duckdb
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from schemas.base import Decoded
from schemas.json_format import JsonFormat
from schemas.json_wire import wire_schema
from schemas.native_json import SWITCH, FlatJsonReader, flat_json_reader, flat_json_writer, native_json

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("user", pa.string(), nullable=False),
    pa.field("amount", pa.float64()),
    pa.field("paid", pa.bool_()),
    pa.field("ts", pa.timestamp("ms", tz="UTC")),
    pa.field("note", pa.string()),
])

pytestmark = pytest.mark.skipif(native_json() is None, reason="schemas/_native_json.c was not built")


@pytest.fixture(scope="module")
def formats() -> Iterator[tuple[JsonFormat, JsonFormat]]:
    """(as shipped, reference path only)."""
    shipped = JsonFormat(SCHEMA, source="the test schema")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SWITCH, "0")
        native_json.cache_clear()
        reference = JsonFormat(SCHEMA, source="the test schema")
    native_json.cache_clear()
    yield shipped, reference


def decode_both(formats: tuple[JsonFormat, JsonFormat], payloads: list[bytes]) -> tuple[Decoded, Decoded]:
    shipped, reference = formats
    column = pa.array(payloads, pa.binary())
    return shipped.decode_column(column), reference.decode_column(column)


def assert_same(got: Decoded, expected: Decoded) -> None:
    assert got.indices == expected.indices
    assert got.failures == expected.failures
    assert got.batch.schema == expected.batch.schema
    assert got.batch.equals(expected.batch), (got.batch.to_pylist(), expected.batch.to_pylist())


def taken(payloads: list[bytes]) -> bool:
    """Whether the C reader takes these payloads (reads them itself rather than handing them back)."""
    reader = flat_json_reader(wire_schema(SCHEMA))
    assert isinstance(reader, FlatJsonReader)
    return reader.read(pa.array(payloads, pa.binary())) is not None


def good_row(rng: random.Random) -> dict[str, object]:
    return {
        "id": rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randrange(-10**12, 10**12)]),
        "user": rng.choice(["", "ann", "zoë", "日本", "😀", "tab\there", 'quote"', "back\\slash", "\x00nul", "/"]),
        "amount": rng.choice([0.0, -0.0, 1.5, 1619.17, 5, -3, 1e22, 1e23, 1.7976931348623157e308, 5e-324,
                              0.1 + 0.2, 123456789.123456789, 2.2250738585072014e-308, rng.uniform(-1e6, 1e6),
                              rng.random() * 10 ** rng.randrange(-30, 30), None]),
        "paid": rng.choice([True, False, None]),
        "ts": rng.choice(["2025-11-24T16:00:00.000Z", "2024-02-29T23:59:59.999+02:00", "1970-01-01 00:00:00Z"]),
        "note": rng.choice([None, "n", "x" * 300, "\u2028", "\ud7ff"]),
    }


def good_payload(rng: random.Random) -> bytes:
    row = good_row(rng)
    if rng.random() < 0.2:
        row["extra"] = rng.choice([{"nested": [1, {"a": None}], "deep": [[[]]]}, [], "s", 1e300, True])
    if rng.random() < 0.2:
        del row[rng.choice(["amount", "paid", "note"])]
    items = list(row.items())
    rng.shuffle(items)
    text = orjson.dumps(dict(items), option=orjson.OPT_INDENT_2 if rng.random() < 0.2 else None)
    if rng.random() < 0.1:
        text = b" \t\r\n" + text + b"\n "
    if rng.random() < 0.2:  # escapes where a writer may put them
        text = text.replace(b'"ann"', b'"\\u0061nn"').replace(b"zo\xc3\xab", b"zo\\u00eb").replace(
            b"\xf0\x9f\x98\x80", b"\\ud83d\\ude00")
    return text


BROKEN = [
    b"", b" ", b"null", b"[]", b"1", b'"s"', b"{", b"}", b"{}{}", b'{"id":1,"user":"a"} x',
    b'{"id":1,"user":"a",}', b'{"id":1,"user":"a" "x":1}', b"{'id':1}", b'{"id":01,"user":"a"}',
    b'{"id":1.0,"user":"a"}', b'{"id":1e2,"user":"a"}', b'{"id":"1","user":"a"}', b'{"id":true,"user":"a"}',
    b'{"id":9223372036854775808,"user":"a"}', b'{"id":-9223372036854775809,"user":"a"}',
    b'{"id":123456789012345678901,"user":"a"}', b'{"id":1,"user":1}', b'{"id":1,"user":null}', b'{"user":"a"}',
    b'{"id":1,"user":"a","amount":NaN}', b'{"id":1,"user":"a","amount":Infinity}',
    b'{"id":1,"user":"a","amount":-Infinity}', b'{"id":1,"user":"a","amount":1e309}',
    b'{"id":1,"user":"a","amount":-1e400}', b'{"id":1,"user":"a","amount":.5}', b'{"id":1,"user":"a","amount":1.}',
    b'{"id":1,"user":"a","amount":+1}', b'{"id":1,"user":"a","amount":"1.5"}', b'{"id":1,"user":"a","amount":1e}',
    b'{"id":1,"user":"a","amount":0x10}', b'{"id":1,"user":"a","paid":1}', b'{"id":1,"user":"a","paid":"true"}',
    b'{"id":1,"user":"a","paid":True}', b'{"id":1,"user":"a","ts":"not a time"}', b'{"id":1,"user":"a","ts":5}',
    b'{"id":1,"user":"a","ts":"1970-01-01 00:00:00"}',
    b'{"id":1,"user":"a\x01"}', b'{"id":1,"user":"a\nb"}', b'{"id":1,"user":"\xff"}', b'{"id":1,"user":"\xc0\xaf"}',
    b'{"id":1,"user":"\xed\xa0\x80"}', b'{"id":1,"user":"\\ud800"}', b'{"id":1,"user":"\\udc00"}',
    b'{"id":1,"user":"\\ud800\\u0041"}', b'{"id":1,"user":"\\x41"}', b'{"id":1,"user":"\\u00g1"}',
    b'{"id":1,"user":"a","id":2}', b'{"id":1,"user":"a","note":"n","note":null}', b'{"\\u0069d":1,"user":"a"}',
    b'{"id":1,"user":"a","x":[1,2,}', b'{"id":1,"user":"a","x":{"a"}}', b'{"id":1,"user":"a","x":tru}',
    b'{"id":1,"user":"a","x":' + b"[" * 2000 + b"]" * 2000 + b"}", b'{"id":1,"user":"a","x":1e999}',
    b'{"id":1,"user":"a","x":' + b"9" * 400 + b"}", b'{"id":1,"user":"a","x":"\xff"}',
    b'{"id":1,"user":"a","amount":' + b"1" * 30 + b".5}", b'{"id":1,"user":"a","amount":0.' + b"3" * 70 + b"}",
    b'\xef\xbb\xbf{"id":1,"user":"a"}', b'{"id":1,"user":"a"}\x00', b'{"id":1,"user":"a"}\r\n',
]


def test_a_batch_of_flat_objects_is_read_by_the_c_reader_to_the_reference_values(formats):
    rng = random.Random(1)
    for _ in range(50):
        payloads = [good_payload(rng) for _ in range(rng.randrange(1, 200))]
        assert taken(payloads)
        got, expected = decode_both(formats, payloads)
        assert not expected.failures
        assert_same(got, expected)


@pytest.mark.parametrize("payload", BROKEN, ids=range(len(BROKEN)))
def test_a_payload_it_does_not_take_gets_the_reference_verdict_among_good_ones(formats, payload):
    rng = random.Random(len(payload))
    payloads = [good_payload(rng) for _ in range(5)] + [payload] + [good_payload(rng) for _ in range(5)]
    got, expected = decode_both(formats, payloads)
    assert_same(got, expected)


def test_what_it_takes_alone_decodes_as_the_reference_decodes_it(formats):
    """Every broken payload on its own: when the C reader takes it, the reference took it too, to the same
    values (a null in a required field is found after the read, the same way on both paths)."""
    for payload in BROKEN:
        got, expected = decode_both(formats, [payload])
        assert_same(got, expected)
        if taken([payload]):
            assert got.indices == [0] or got.failures, payload


def test_numbers_round_as_the_reference_rounds_them(formats):
    """Doubles from short decimals (exact arithmetic) and long ones (correctly rounded strtod), integers into
    double fields, exponents, subnormals and the edges of the range."""
    rng = random.Random(3)
    texts = ["0", "-0", "-0.0", "1E5", "1e-5", "2.5e+3", "9007199254740993", "-9223372036854775808",
             "4.9e-324", "2.4e-324", "1.7976931348623157e308", "0.30000000000000004", "123456789012345.678"]
    texts += [repr(rng.uniform(-1, 1) * 10 ** rng.randrange(-320, 300)) for _ in range(300)]
    texts += [f"{rng.randrange(10**18)}.{rng.randrange(10**18)}e{rng.randrange(-40, 40)}" for _ in range(300)]
    payloads = [b'{"id":1,"user":"u","amount":%s}' % text.encode() for text in texts]
    assert taken(payloads)
    assert_same(*decode_both(formats, payloads))


def test_a_schema_with_a_nested_or_narrow_field_or_too_many_fields_is_left_to_the_reference_path():
    assert flat_json_reader(pa.schema([pa.field("id", pa.int64())])) is not None
    assert flat_json_reader(pa.schema([pa.field("id", pa.int32())])) is None
    assert flat_json_reader(pa.schema([pa.field(f"f{i}", pa.int64()) for i in range(257)])) is None
    assert flat_json_reader(pa.schema([pa.field("tags", pa.list_(pa.string()))])) is None
    assert flat_json_reader(pa.schema([pa.field("a", pa.struct([pa.field("b", pa.int64())]))])) is None


def test_the_switch_turns_the_c_reader_and_writer_off(monkeypatch):
    monkeypatch.setenv(SWITCH, "off")
    native_json.cache_clear()
    try:
        assert flat_json_reader(pa.schema([pa.field("id", pa.int64())])) is None
        assert flat_json_writer() is None
    finally:
        native_json.cache_clear()


# ------------------------------------------------------------------------------------------------ writing


def write_flat_json(batch: pa.RecordBatch) -> pa.BinaryArray | None:
    writer = flat_json_writer()
    assert writer is not None
    return writer.write(batch)


def duckdb_json(batch: pa.RecordBatch) -> list[bytes]:
    connection = duckdb.connect()
    connection.register("rows", pa.Table.from_batches([batch]))
    return [row[0] for row in connection.sql("SELECT to_json(rows)::BLOB FROM rows").fetchall()]


def random_double(rng: random.Random) -> float:
    """Doubles of every shape: any bit pattern, short decimals at every scale, integers, powers of ten."""
    choice = rng.randrange(4)
    if choice == 0:
        return cast(float, struct.unpack("<d", rng.randbytes(8))[0])
    if choice == 1:
        return round(rng.uniform(-1e4, 1e4), rng.randrange(0, 8)) * 10.0 ** rng.randrange(-12, 12)
    if choice == 2:
        return float(rng.randrange(-2**60, 2**60))
    return rng.choice([1.0, -1.0]) * 10.0 ** rng.randrange(-30, 30) * rng.choice([1, 1.5, 2.5, 9.999])


def test_rows_are_written_byte_for_byte_as_duckdb_writes_them():
    rng = random.Random(5)
    rows = 5000
    doubles = [random_double(rng) for _ in range(rows)]
    batch = pa.RecordBatch.from_arrays([
        pa.array([rng.choice([0, -1, 2**63 - 1, -(2**63), rng.randrange(-10**15, 10**15), None])
                  for _ in range(rows)], pa.int64()),
        pa.array([None if rng.random() < 0.05 else value for value in doubles], pa.float64()),
        pa.array([rng.choice([True, False, None]) for _ in range(rows)], pa.bool_()),
        pa.array([rng.choice([None, "", "plain", 'q"uote', "back\\slash", "/", "\x7f", "zoë 日本 😀", "\u2028",
                              "".join(map(chr, range(32)))]) for _ in range(rows)], pa.string()),
    ], names=["id", "amount", "paid", "note"])
    finite = pc.is_finite(batch.column("amount"))
    batch = batch.filter(pc.or_kleene(finite, pc.is_null(batch.column("amount"))))
    written = write_flat_json(batch)
    assert written is not None
    assert written.to_pylist() == duckdb_json(batch)
    sliced = batch.slice(7, 300)  # arrays with an offset
    assert cast(pa.BinaryArray, write_flat_json(sliced)).to_pylist() == duckdb_json(sliced)


def test_the_json_format_writes_flat_rows_in_c_and_reads_them_back():
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("amount", pa.float64()),
                        pa.field("ts", pa.timestamp("ms", tz="UTC")), pa.field("note", pa.string())])
    batch = pa.RecordBatch.from_pylist([
        {"id": 1, "amount": 0.1 + 0.2, "ts": dt.datetime(2025, 1, 2, 3, 4, 5, 6000, tzinfo=dt.UTC), "note": "a\nb"},
        {"id": -2, "amount": float("nan"), "ts": None, "note": None},
    ], schema=schema)
    fmt = JsonFormat(schema, source="the test schema")
    assert fmt.encode(batch) == [
        b'{"id":1,"amount":0.30000000000000004,"ts":"2025-01-02T03:04:05.006Z","note":"a\\nb"}',
        b'{"id":-2,"amount":null,"ts":null,"note":null}',
    ]
    decoded = fmt.decode_column(pa.array(fmt.encode(batch.slice(0, 1)), pa.binary()))
    assert decoded.batch.equals(batch.slice(0, 1))


def test_a_batch_with_a_nested_or_narrow_column_is_left_to_duckdb():
    assert write_flat_json(pa.RecordBatch.from_pydict({"n": pa.array([1], pa.int32())})) is None
    assert write_flat_json(pa.RecordBatch.from_pydict({"t": pa.array([["a"]], pa.list_(pa.string()))})) is None
    assert write_flat_json(pa.RecordBatch.from_pydict({"n": pa.array([1], pa.int64())})) is not None


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
@pytest.mark.parametrize("tz", [None, "UTC", "Europe/Berlin"])
def test_timestamps_are_written_as_the_json_format_writes_them_through_duckdb(unit, tz):
    rng = random.Random(f"{unit}{tz}")
    per_second = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[unit]
    low, high = (-62_135_596_800, 253_402_300_799) if unit != "ns" else (-(2**63) // 10**9 + 1, 2**63 // 10**9 - 1)
    seconds = [low, high, 0, -1, 951_782_400, 4_107_542_400] + [rng.randrange(low, high) for _ in range(500)]
    ticks = [second * per_second + rng.randrange(per_second) for second in seconds] + [None]
    schema = pa.schema([pa.field("ts", pa.timestamp(unit, tz=tz))])
    batch = pa.RecordBatch.from_arrays([pa.array(ticks, pa.int64()).cast(schema.field("ts").type)], schema=schema)
    shipped = JsonFormat(schema, source="the test schema")
    assert write_flat_json(batch) is not None
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SWITCH, "0")
        native_json.cache_clear()
        assert shipped.encode(batch) == JsonFormat(schema, source="the test schema").encode(batch)
    native_json.cache_clear()


def test_a_timestamp_outside_years_1_to_9999_is_left_to_duckdb():
    late = pa.RecordBatch.from_pydict({"ts": pa.array([253_402_300_800], pa.timestamp("s"))})
    assert write_flat_json(late) is None
