"""Every format through the broker and KafkaSource, value for value; bad records become dead letters."""

from __future__ import annotations

import decimal
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from connectors.admin import create_topic, end_offsets
from connectors.batch import SourceBatch
from connectors.dead_letter import PoisonRecord
from connectors.metadata import METADATA_COLUMNS
from connectors.source import KafkaSource, SourceSettings
from engine.testing.connectors import produce_keyed, read_until
from schemas import FormatSpec, make_format

ROWS = 100_000
SCHEMA_ID = 42
ORDER_SCHEMA = {
    "type": "record", "name": "Order", "namespace": "epochline.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": ["null", "string"], "default": None},
        {"name": "amount", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 12,
                                              "scale": 2}]},
        {"name": "created", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "updated", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "opens", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "closes", "type": ["null", {"type": "long", "logicalType": "time-micros"}]},
        {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "score", "type": ["null", "double"]},
        {"name": "vip", "type": "boolean"},
    ],
}


@pytest.fixture
def schema_dir(tmp_path: Path) -> Path:
    """A directory holding the order schema as ``order.avsc`` and as Confluent id ``<SCHEMA_ID>.avsc``."""
    for name in ("order.avsc", f"{SCHEMA_ID}.avsc"):
        (tmp_path / name).write_text(json.dumps(ORDER_SCHEMA))
    return tmp_path


def spec_for(format_name: str, schema_dir: Path) -> FormatSpec:
    if format_name == "raw":
        return FormatSpec("raw")
    if format_name == "avro-confluent":
        return FormatSpec("avro-confluent", schema_dir=schema_dir, schema_id=SCHEMA_ID)
    return FormatSpec(format_name, schema=schema_dir / "order.avsc")  # type: ignore[arg-type]


def with_nulls(values: pa.Array, every: int) -> pa.Array:
    """``values`` with every ``every``-th row set to null."""
    mask = pa.array([i % every == 0 for i in range(len(values))])
    return pc.if_else(mask, pa.scalar(None, values.type), values)


def order_batch(schema: pa.Schema, rows: int) -> pa.RecordBatch:
    """``rows`` orders covering every logical type, with nulls in every nullable column."""
    ids = pa.array(range(rows), pa.int64())
    columns = {
        "id": ids,
        "customer": with_nulls(pa.array([f"kundin-{i % 977}-ü" for i in range(rows)]), 5),
        "amount": with_nulls(pa.array([decimal.Decimal(i * 37 - 500_000).scaleb(-2) for i in range(rows)],
                                      schema.field("amount").type), 7),
        "created": pc.add(ids, 1_700_000_000_000).cast(schema.field("created").type),
        "updated": with_nulls(pc.add(pc.multiply(ids, 1_001), 1_700_000_000_000_123)
                              .cast(schema.field("updated").type), 3),
        "day": pc.add(ids, -20_000).cast(pa.int32()).cast(schema.field("day").type),
        "opens": pc.multiply(ids, 863).cast(pa.int32()).cast(schema.field("opens").type),
        "closes": with_nulls(pc.multiply(ids, 863_999).cast(schema.field("closes").type), 4),
        "ref": pa.array([str(uuid.UUID(int=i * 7919)) for i in range(rows)]),
        "score": with_nulls(pc.divide(ids.cast(pa.float64()), 3.0), 6),
        "vip": pc.equal(pc.bit_wise_and(ids, 1), 1),
    }
    return pa.RecordBatch.from_pydict(columns, schema=schema)


def raw_batch(_: pa.Schema, rows: int) -> pa.RecordBatch:
    values = [None if i % 9 == 0 else f"{i}:".encode() + bytes(range(i % 256)) for i in range(rows)]
    return pa.record_batch({"value": pa.array(values, pa.binary())})



def read_all(source: KafkaSource, bootstrap: str, deadline_s: float = 120.0) -> list[SourceBatch]:
    return read_until(source, end_offsets(bootstrap, source.settings.topic), deadline_s)


def value_table(batches: list[SourceBatch], sort_key: str) -> pa.Table:
    table = pa.Table.from_batches([b.batch for b in batches]).drop_columns(list(METADATA_COLUMNS))
    return table.sort_by(sort_key)


@pytest.mark.parametrize(("format_name", "build", "sort_key"), [
    ("json", order_batch, "id"),
    ("avro", order_batch, "id"),
    ("avro-confluent", order_batch, "id"),
    ("raw", raw_batch, "value"),
])
def test_100k_records_round_trip_through_the_broker_value_for_value(
        kafka_bootstrap: str, unique_topic: str, schema_dir: Path, format_name: str,
        build: Callable[[pa.Schema, int], pa.RecordBatch], sort_key: str) -> None:
    spec = spec_for(format_name, schema_dir)
    expected = build(make_format(spec).arrow_schema, ROWS)
    create_topic(kafka_bootstrap, unique_topic, partitions=2)
    produce_keyed(kafka_bootstrap, unique_topic, make_format(spec).encode(expected))
    settings = SourceSettings(name="src", topic=unique_topic, format=spec)
    with KafkaSource(settings, kafka_bootstrap, f"group-{unique_topic}") as source:
        source.open()
        batches = read_all(source, kafka_bootstrap)
    assert all(not b.dead_letters for b in batches)
    read = value_table(batches, sort_key)
    assert read.schema == expected.schema
    assert read.num_rows == ROWS
    assert read.equals(pa.Table.from_batches([expected]).sort_by(sort_key))


# -- dead letters ------------------------------------------------------------------------------------------------

GOOD_ROW = {"id": 1, "customer": None, "amount": None, "created": 0, "updated": None, "day": 0, "opens": 0,
            "closes": None, "ref": str(uuid.UUID(int=1)), "score": None, "vip": False}


def good_payloads(spec: FormatSpec, count: int) -> list[bytes]:
    codec = make_format(spec)
    rows = [dict(GOOD_ROW, id=i) for i in range(count)]
    return codec.encode(pa.RecordBatch.from_pylist(rows, schema=codec.arrow_schema))


def corrupt_truncate(payload: bytes) -> bytes:
    return payload[:-4]


def corrupt_magic_byte(payload: bytes) -> bytes:
    return b"\x07" + payload[1:]


def corrupt_schema_id(payload: bytes) -> bytes:
    return b"\x00" + (999).to_bytes(4, "big") + payload[5:]


def corrupt_json(payload: bytes) -> bytes:
    return payload[:-1] + b","


@pytest.mark.parametrize(("format_name", "corrupt", "reason"), [
    ("json", corrupt_json, "not JSON"),
    ("avro", corrupt_truncate, "truncated"),
    ("avro-confluent", corrupt_magic_byte, "wrong magic byte 0x07"),
    ("avro-confluent", corrupt_schema_id, "unknown schema id 999"),
    ("json", lambda _: None, "tombstone"),
    ("avro", lambda _: None, "tombstone"),
])
def test_bad_record_becomes_a_dead_letter_with_its_bytes_and_reason(
        kafka_bootstrap: str, unique_topic: str, schema_dir: Path, format_name: str,
        corrupt: Callable[[bytes], bytes | None], reason: str) -> None:
    spec = spec_for(format_name, schema_dir)
    payloads: list[bytes | None] = list(good_payloads(spec, 5))
    payloads[2] = corrupt(payloads[2])
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce_keyed(kafka_bootstrap, unique_topic, payloads)
    settings = SourceSettings(name="src", topic=unique_topic, format=spec)
    with KafkaSource(settings, kafka_bootstrap, f"group-{unique_topic}") as source:
        source.open()
        batches = read_all(source, kafka_bootstrap)
    dead = [d for b in batches for d in b.dead_letters]
    assert [(d.topic, d.partition, d.offset, d.key, d.value, d.stage) for d in dead] == [
        (unique_topic, 0, 2, b"2", payloads[2], "decode")]
    assert reason in dead[0].reason
    decoded = pa.Table.from_batches([b.batch for b in batches])
    assert decoded.column("id").to_pylist() == [0, 1, 3, 4]
    assert decoded.column("__kafka_offset").to_pylist() == [0, 1, 3, 4], "metadata lines up with its row"


def test_batch_of_only_bad_records_still_advances_the_position(
        kafka_bootstrap: str, unique_topic: str, schema_dir: Path) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce_keyed(kafka_bootstrap, unique_topic, [b"{broken"] * 20)
    settings = SourceSettings(name="src", topic=unique_topic, format=spec_for("json", schema_dir))
    with KafkaSource(settings, kafka_bootstrap, f"group-{unique_topic}") as source:
        source.open()
        batches = read_all(source, kafka_bootstrap)
        assert source.position().offsets == {0: 20}
    assert sum(len(b.dead_letters) for b in batches) == 20
    assert sum(b.batch.num_rows for b in batches) == 0


def test_halt_on_error_raises_poison_record_and_hands_nothing_out(
        kafka_bootstrap: str, unique_topic: str, schema_dir: Path) -> None:
    spec = spec_for("avro", schema_dir)
    payloads = good_payloads(spec, 3)
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce_keyed(kafka_bootstrap, unique_topic, [payloads[0], corrupt_truncate(payloads[1]), payloads[2]])
    settings = SourceSettings(name="src", topic=unique_topic, format=spec, on_error="halt")
    with KafkaSource(settings, kafka_bootstrap, f"group-{unique_topic}") as source:
        source.open()
        with pytest.raises(PoisonRecord, match=f"topic '{unique_topic}' partition 0 offset 1: decode: .*truncated"):
            read_all(source, kafka_bootstrap, deadline_s=20)
        assert source.position().offsets == {0: 0}


def test_dead_letter_headers_name_origin_and_reason(
        kafka_bootstrap: str, unique_topic: str, schema_dir: Path) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce_keyed(kafka_bootstrap, unique_topic, [b"{broken"])
    settings = SourceSettings(name="src", topic=unique_topic, format=spec_for("json", schema_dir))
    with KafkaSource(settings, kafka_bootstrap, f"group-{unique_topic}") as source:
        source.open()
        dead = [d for b in read_all(source, kafka_bootstrap) for d in b.dead_letters]
    headers = dict(dead[0].headers())
    assert headers["epochline.topic"] == unique_topic.encode()
    assert (headers["epochline.partition"], headers["epochline.offset"]) == (b"0", b"0")
    assert headers["epochline.stage"] == b"decode"
    assert headers["epochline.reason"].startswith(b"not JSON")
