"""Specification of json-confluent: JSON Schema in the Confluent wire format, against confluent-kafka's own
JSONSerializer and JSONDeserializer and the fake Schema Registry (tests/helpers/schema_registry.py)."""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from connectors.admin import create_topic
from connectors.metadata import METADATA_COLUMNS
from engine.testing.connectors import produce_keyed, read_batches
from schemas import EncodeError, FormatSpec, SchemaError, make_format
from schemas.base import Format
from schemas.registry import RegistryUnavailable, SchemaNotRegistered

if TYPE_CHECKING:  # imported by pytest as the plugin below; importing it here first would skip assert rewriting
    from tests.helpers.schema_registry import FakeSchemaRegistry

pytest_plugins = ["tests.helpers.schema_registry"]

ORDER_V1: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "customer": {"type": "string"},
        "amount": {"type": "number", "minimum": 0},
        "placed": {"type": "string", "format": "date-time"},
        "status": {"enum": ["NEW", "PAID", "SHIPPED"]},
        "address": {"type": "object", "properties": {"street": {"type": "string"},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["street"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "note": {"type": ["string", "null"]},
    },
    "required": ["id", "amount", "placed", "status", "tags", "note"],
}
ORDER_V2: dict[str, Any] = {**ORDER_V1, "properties": {**ORDER_V1["properties"], "coupon": {"type": "string"}}}
"""V1 evolved compatibly: one more optional property."""

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def orders(count: int, seed: int = 5) -> list[dict[str, Any]]:
    """Orders as a JSONSerializer user writes them: optional properties absent (not null) when unknown."""
    rng = random.Random(seed)
    rows = []
    for n in range(count):
        placed = _EPOCH + dt.timedelta(microseconds=rng.randrange(10**15, 2 * 10**15))
        row: dict[str, Any] = {
            "id": n, "amount": round(rng.uniform(0, 10_000), 2), "placed": placed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "status": rng.choice(["NEW", "PAID", "SHIPPED"]), "tags": [f"t{k}" for k in range(n % 3)],
            "note": None if n % 4 else f'note {n}: "quoted", ünïcødé ✓',
        }
        if n % 3:
            row["customer"] = f"kundin-{n % 977}-ü"
        if n % 5:
            row["address"] = {"street": f"{n} Main St", **({"zip": f"{n % 100_000:05d}"} if n % 2 else {})}
        rows.append(row)
    return rows


def as_arrow_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as Arrow holds them: date-times parsed (absent properties become nulls on the way in)."""
    return [{**row, "placed": dt.datetime.fromisoformat(row["placed"])} for row in rows]


def framed(schema_id: int, value: Any) -> bytes:
    """A value framed by hand as Confluent's JSONSerializer frames it, independent of our encoder."""
    return b"\x00" + schema_id.to_bytes(4, "big") + json.dumps(value).encode()


def context(topic: str) -> SerializationContext:
    return SerializationContext(topic, MessageField.VALUE)


def confluent_serializer(registry: FakeSchemaRegistry, schema: dict[str, Any], *, strategy: str = "TOPIC",
                         auto_register: bool = True, validate: bool = True) -> JSONSerializer:
    return JSONSerializer(json.dumps(schema), SchemaRegistryClient({"url": registry.url}),
                          conf={"subject.name.strategy.type": strategy, "auto.register.schemas": auto_register,
                                "validate": validate})


def confluent_deserializer(registry: FakeSchemaRegistry) -> JSONDeserializer:
    return JSONDeserializer(None, schema_registry_client=SchemaRegistryClient({"url": registry.url}))


@pytest.fixture
def order_file(tmp_path: Path) -> Path:
    path = tmp_path / "order.json"
    path.write_text(json.dumps(ORDER_V1, indent=2))
    return path


def spec(registry: FakeSchemaRegistry | None, topic: str = "orders", **options: Any) -> FormatSpec:
    return FormatSpec("json-confluent", registry_url=registry.url if registry else None, topic=topic, **options)


# -- decode ------------------------------------------------------------------------------------------------------

def test_records_of_confluents_serializer_decode_into_the_schema_registered_for_the_topic(
        schema_registry: FakeSchemaRegistry) -> None:
    rows = orders(2_000)
    serializer = confluent_serializer(schema_registry, ORDER_V1)
    payloads = [serializer(row, context("orders")) for row in rows]
    fmt = make_format(spec(schema_registry))
    decoded = fmt.decode(payloads)
    assert decoded.failures == []
    assert decoded.indices == list(range(len(rows)))
    assert decoded.batch.equals(pa.RecordBatch.from_pylist(as_arrow_rows(rows), schema=fmt.arrow_schema))


def test_reader_schema_is_the_schema_file_else_schema_id_else_the_subjects_latest_version(
        schema_registry: FakeSchemaRegistry, order_file: Path) -> None:
    v1 = schema_registry.register("orders-value", ORDER_V1, "JSON")
    schema_registry.register("orders-value", ORDER_V2, "JSON")
    assert "coupon" not in make_format(spec(schema_registry, schema=order_file)).arrow_schema.names
    assert "coupon" not in make_format(spec(schema_registry, schema_id=v1)).arrow_schema.names
    assert "coupon" in make_format(spec(schema_registry)).arrow_schema.names


def test_a_writer_schema_evolved_compatibly_mid_topic_is_read_into_the_reader_schema(
        schema_registry: FakeSchemaRegistry) -> None:
    v1 = schema_registry.register("orders-value", ORDER_V1, "JSON")
    v2 = schema_registry.register("orders-value", ORDER_V2, "JSON")
    old, new = orders(2)
    payloads = [framed(v1, old), framed(v2, {**new, "coupon": "SPRING"})]
    as_v1 = make_format(spec(schema_registry, schema_id=v1)).decode(payloads)
    assert as_v1.failures == []
    assert as_v1.batch.to_pylist() == [{"customer": None, "address": None, **row} for row in as_arrow_rows([old, new])]
    as_latest = make_format(spec(schema_registry)).decode(payloads)
    assert as_latest.batch.column("coupon").to_pylist() == [None, "SPRING"]


def test_each_body_is_validated_against_the_schema_registered_under_its_own_id(
        schema_registry: FakeSchemaRegistry) -> None:
    capped = {**ORDER_V1, "properties": {**ORDER_V1["properties"], "amount": {"type": "number", "maximum": 100}}}
    v1 = schema_registry.register("orders-value", ORDER_V1, "JSON")
    strict = schema_registry.register("orders-value", capped, "JSON")
    row = {**orders(1)[0], "amount": 500}
    decoded = make_format(spec(schema_registry, schema_id=v1)).decode([framed(v1, row), framed(strict, row)])
    assert decoded.indices == [0]
    assert decoded.failures[0].index == 1
    assert decoded.failures[0].reason == (f"body violates JSON Schema id {strict} at $.amount: "
                                          "500 is greater than the maximum of 100")


@pytest.mark.parametrize(("body", "path", "message"), [
    ({"id": "seven"}, "$.id", "'seven' is not of type 'integer'"),
    ({"status": "LOST"}, "$.status", "'LOST' is not one of ['NEW', 'PAID', 'SHIPPED']"),
    ({"address": {"street": "1 Main St", "zip": "ABC"}}, "$.address.zip", "'ABC' does not match '^[0-9]{5}$'"),
    ({"tags": ["ok", 3]}, "$.tags[1]", "3 is not of type 'string'"),
    ({"customer": None}, "$.customer", "None is not of type 'string'"),
])
def test_a_body_that_violates_its_schema_is_a_failure_naming_the_path_and_the_violation(
        schema_registry: FakeSchemaRegistry, body: dict[str, Any], path: str, message: str) -> None:
    schema_id = schema_registry.register("orders-value", ORDER_V1, "JSON")
    decoded = make_format(spec(schema_registry)).decode([framed(schema_id, {**orders(1)[0], **body})])
    assert decoded.batch.num_rows == 0
    assert decoded.failures[0].reason == f"body violates JSON Schema id {schema_id} at {path}: {message}"


def test_a_missing_required_property_is_a_failure_naming_it(schema_registry: FakeSchemaRegistry) -> None:
    schema_id = schema_registry.register("orders-value", ORDER_V1, "JSON")
    row = {key: value for key, value in orders(1)[0].items() if key != "placed"}
    [failure] = make_format(spec(schema_registry)).decode([framed(schema_id, row)]).failures
    assert failure.reason == f"body violates JSON Schema id {schema_id} at $: 'placed' is a required property"


def test_references_of_a_writer_schema_are_resolved_from_the_registry(
        schema_registry: FakeSchemaRegistry, order_file: Path) -> None:
    address = ORDER_V1["properties"]["address"]
    schema_registry.register("address", address, "JSON")
    writer = {**ORDER_V1, "properties": {**ORDER_V1["properties"], "address": {"$ref": "address.json"}}}
    schema_id = schema_registry.register("orders-value", writer, "JSON",
                                         [{"name": "address.json", "subject": "address", "version": 1}])
    good, bad = orders(2)[0], {**orders(2)[1], "address": {"zip": "12345"}}
    decoded = make_format(spec(schema_registry, schema=order_file)).decode([framed(schema_id, good),
                                                                             framed(schema_id, bad)])
    assert decoded.indices == [0]
    assert decoded.failures[0].reason == f"body violates JSON Schema id {schema_id} at $.address: " \
                                         "'street' is a required property"


def test_unknown_schema_id_is_a_failure_naming_the_id_and_the_registry(
        schema_registry: FakeSchemaRegistry, order_file: Path) -> None:
    [failure] = make_format(spec(schema_registry, schema=order_file)).decode([framed(99, orders(1)[0])]).failures
    assert failure.reason == f"unknown schema id 99 (not found in schema registry {schema_registry.url})"


def test_an_id_of_a_schema_that_is_not_json_schema_is_a_failure(
        schema_registry: FakeSchemaRegistry, order_file: Path) -> None:
    avro_id = schema_registry.register("users-value", {"type": "record", "name": "U", "fields": []})
    [failure] = make_format(spec(schema_registry, schema=order_file)).decode([framed(avro_id, {})]).failures
    assert failure.reason == f"schema id {avro_id} is registered as AVRO, not JSON Schema"


@pytest.mark.parametrize(("payload", "reason"), [
    (None, "null payload (tombstone)"),
    (b"\x00\x00\x01", "payload too short for Confluent wire format: 3 byte(s), need at least 5 (magic byte + "
                      "4-byte schema id)"),
    (b'{"id": 1}', "wrong magic byte 0x7b (expected 0x00: not Confluent wire format)"),
    (b"\x00\x00\x00\x00\x01{broken", "body of schema id 1 is not JSON: "),
])
def test_header_and_syntax_problems_are_failures_naming_the_problem(
        schema_registry: FakeSchemaRegistry, payload: bytes | None, reason: str) -> None:
    assert schema_registry.register("orders-value", ORDER_V1, "JSON") == 1
    [failure] = make_format(spec(schema_registry)).decode([payload]).failures
    assert failure.reason.startswith(reason)


def test_good_rows_survive_beside_every_kind_of_bad_one_in_input_order(schema_registry: FakeSchemaRegistry) -> None:
    schema_id = schema_registry.register("orders-value", ORDER_V1, "JSON")
    good = [framed(schema_id, row) for row in orders(3)]
    payloads = [good[0], None, framed(42, {}), good[1], framed(schema_id, {"id": "x"}), b"\x01\x00", good[2]]
    decoded = make_format(spec(schema_registry)).decode(payloads)
    assert decoded.indices == [0, 3, 6]
    assert decoded.batch.column("id").to_pylist() == [0, 1, 2]
    assert [f.index for f in decoded.failures] == [1, 2, 4, 5]


def test_writer_schemas_are_fetched_once_per_id(schema_registry: FakeSchemaRegistry) -> None:
    schema_id = schema_registry.register("orders-value", ORDER_V1, "JSON")
    fmt = make_format(spec(schema_registry))
    for _ in range(3):
        fmt.decode([framed(schema_id, row) for row in orders(10)])
    assert schema_registry.requests.count(f"GET /schemas/ids/{schema_id}") == 1


def test_without_a_registry_bodies_are_validated_against_the_schema_file(order_file: Path) -> None:
    row = orders(1)[0]
    decoded = make_format(spec(None, schema=order_file)).decode([framed(7, row), framed(8, {**row, "id": "x"})])
    assert decoded.indices == [0]
    assert decoded.failures[0].reason == "body violates JSON Schema id 8 at $.id: 'x' is not of type 'integer'"


def test_an_unreachable_registry_raises_instead_of_failing_every_record(
        schema_registry: FakeSchemaRegistry, order_file: Path) -> None:
    fmt = make_format(spec(schema_registry, schema=order_file))
    schema_registry.stop()
    with pytest.raises(RegistryUnavailable, match="is unreachable for schema id 1"):
        fmt.decode([framed(1, orders(1)[0])])
    assert issubclass(RegistryUnavailable, SchemaError)


# -- encode ------------------------------------------------------------------------------------------------------

def order_batch(fmt: Format, rows: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(as_arrow_rows(rows), schema=fmt.arrow_schema)


def test_encoded_records_are_read_back_by_confluents_deserializer_exactly(
        schema_registry: FakeSchemaRegistry, order_file: Path) -> None:
    rows = orders(2_000)
    fmt = make_format(spec(schema_registry, schema=order_file))
    payloads = fmt.encode(order_batch(fmt, rows))
    deserializer = confluent_deserializer(schema_registry)
    assert [deserializer(p, context("orders")) for p in payloads] == rows


def test_encode_registers_the_schema_under_the_topic_subject_and_frames_its_id(
        schema_registry: FakeSchemaRegistry, order_file: Path) -> None:
    schema_registry.register("elsewhere-value", ORDER_V2, "JSON")
    fmt = make_format(spec(schema_registry, schema=order_file))
    payloads = fmt.encode(order_batch(fmt, orders(3)))
    assert schema_registry.subjects() == ["elsewhere-value", "orders-value"]
    assert schema_registry.latest("orders-value").schema_id == 2
    assert {p[:5] for p in payloads} == {b"\x00\x00\x00\x00\x02"}
    fmt.encode(order_batch(fmt, orders(3)))
    assert schema_registry.requests.count("POST /subjects/orders-value/versions") == 1, "registered once"


@pytest.mark.parametrize(("strategy", "confluent_strategy", "subject"), [
    ("topic", "TOPIC", "orders-value"), ("record", "RECORD", "Order"), ("topic-record", "TOPIC_RECORD", "orders-Order"),
])
def test_subject_strategies_name_the_subject_confluents_serializer_uses(
        schema_registry: FakeSchemaRegistry, order_file: Path, strategy: str, confluent_strategy: str,
        subject: str) -> None:
    fmt = make_format(spec(schema_registry, schema=order_file, subject_strategy=strategy))
    [ours] = fmt.encode(order_batch(fmt, orders(1)))
    assert schema_registry.subjects() == [subject]
    serializer = confluent_serializer(schema_registry, ORDER_V1, strategy=confluent_strategy, auto_register=False)
    theirs = serializer(orders(1)[0], context("orders"))
    assert theirs is not None and theirs[:5] == ours[:5], "Confluent's serializer finds our registration"


def test_without_auto_register_encode_uses_the_id_a_producer_registered(
        schema_registry: FakeSchemaRegistry, order_file: Path) -> None:
    schema_registry.register("orders-value", ORDER_V2, "JSON")
    confluent_serializer(schema_registry, ORDER_V1)(orders(1)[0], context("orders"))
    fmt = make_format(spec(schema_registry, schema=order_file, auto_register=False))
    payloads = fmt.encode(order_batch(fmt, orders(2)))
    assert {p[:5] for p in payloads} == {b"\x00\x00\x00\x00\x02"}
    assert schema_registry.versions("orders-value") == [1, 2]


def test_without_auto_register_an_unregistered_schema_is_a_schema_error_naming_the_subject(
        schema_registry: FakeSchemaRegistry, order_file: Path) -> None:
    fmt = make_format(spec(schema_registry, schema=order_file, auto_register=False, subject_strategy="topic-record"))
    with pytest.raises(SchemaNotRegistered, match="not registered under subject 'orders-Order'"):
        fmt.encode(order_batch(fmt, orders(1)))
    assert schema_registry.subjects() == []


def test_record_strategies_need_the_schemas_title(schema_registry: FakeSchemaRegistry, tmp_path: Path) -> None:
    untitled = tmp_path / "untitled.json"
    untitled.write_text(json.dumps({key: value for key, value in ORDER_V1.items() if key != "title"}))
    fmt = make_format(spec(schema_registry, schema=untitled, subject_strategy="record"))
    with pytest.raises(SchemaError, match="needs a record name .*'title'"):
        fmt.encode(order_batch(fmt, orders(1)))


def test_encode_with_schema_id_frames_that_id_and_registers_nothing(schema_registry: FakeSchemaRegistry) -> None:
    schema_registry.register("orders-value", ORDER_V1, "JSON", schema_id=300)
    fmt = make_format(spec(schema_registry, schema_id=300))
    assert {p[:5] for p in fmt.encode(order_batch(fmt, orders(2)))} == {b"\x00\x00\x00\x01\x2c"}
    assert [r for r in schema_registry.requests if r.startswith("POST")] == []


def test_a_reader_schema_read_from_the_registry_is_written_with_its_own_id(schema_registry: FakeSchemaRegistry) -> None:
    schema_registry.register("orders-value", ORDER_V2, "JSON")
    latest = schema_registry.register("orders-value", ORDER_V1, "JSON")
    fmt = make_format(spec(schema_registry, auto_register=False))
    assert {p[:5] for p in fmt.encode(order_batch(fmt, orders(2)))} == {b"\x00" + latest.to_bytes(4, "big")}
    assert [r for r in schema_registry.requests if r.startswith("POST")] == []


def test_a_null_where_the_schema_has_no_null_is_left_out_and_a_nullable_one_is_written(
        schema_registry: FakeSchemaRegistry, order_file: Path) -> None:
    fmt = make_format(spec(schema_registry, schema=order_file))
    row = {**orders(4)[3], "address": {"street": "1 Main St"}}
    assert "customer" not in row and row["note"] is None
    [payload] = fmt.encode(order_batch(fmt, [row]))
    body = json.loads(payload[5:])
    assert "customer" not in body and "zip" not in body["address"]
    assert body["note"] is None


def test_a_value_the_schema_forbids_is_an_encode_error_naming_the_row_and_path(
        schema_registry: FakeSchemaRegistry, order_file: Path) -> None:
    fmt = make_format(spec(schema_registry, schema=order_file))
    rows = orders(3)
    rows[2]["status"] = "LOST"
    with pytest.raises(EncodeError, match=r"row 2 does not match the JSON Schema from .*order.json at \$.status: "
                                          r"'LOST' is not one of"):
        fmt.encode(order_batch(fmt, rows))


def test_encode_without_schema_id_or_registry_is_a_schema_error(order_file: Path) -> None:
    fmt = make_format(spec(None, schema=order_file))
    with pytest.raises(SchemaError, match="needs schema_id .* or registry_url"):
        fmt.encode(order_batch(fmt, orders(1)))


# -- configuration -------------------------------------------------------------------------------------------------

def test_configuration_errors_name_what_is_missing(schema_registry: FakeSchemaRegistry, tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="needs registry_url .* or a JSON Schema file"):
        make_format(spec(None))
    with pytest.raises(SchemaError, match=f"schema_id 77 is not in schema registry {schema_registry.url}"):
        make_format(spec(schema_registry, schema_id=77))
    with pytest.raises(SchemaError, match="subject 'orders-value' has no registered version"):
        make_format(spec(schema_registry))
    avro_id = schema_registry.register("users-value", {"type": "record", "name": "U", "fields": []})
    with pytest.raises(SchemaError, match=f"id {avro_id} is registered as AVRO, not JSON Schema"):
        make_format(spec(schema_registry, schema_id=avro_id))
    unmappable = tmp_path / "refs.json"
    unmappable.write_text(json.dumps({"type": "object", "properties": {"a": {"$ref": "#/definitions/a"}}}))
    with pytest.raises(SchemaError, match="property 'a': '\\$ref' is not supported"):
        make_format(spec(schema_registry, schema=unmappable))


# -- through the broker ----------------------------------------------------------------------------------------------



def test_50k_records_go_from_confluents_serializer_through_the_broker_and_back_to_its_deserializer(
        kafka_bootstrap: str, unique_topic: str, schema_registry: FakeSchemaRegistry, order_file: Path) -> None:
    rows = orders(50_000)
    # The rows are known to be valid; the deserializer below validates what we wrote, which is what counts.
    serializer = confluent_serializer(schema_registry, ORDER_V1, validate=False)
    create_topic(kafka_bootstrap, unique_topic, partitions=2)
    produce_keyed(kafka_bootstrap, unique_topic, (serializer(row, context(unique_topic)) for row in rows))

    batches = read_batches(kafka_bootstrap, unique_topic, spec(schema_registry, topic=unique_topic))
    assert [d for b in batches for d in b.dead_letters] == []
    read = pa.Table.from_batches([b.batch for b in batches]).drop_columns(list(METADATA_COLUMNS)).sort_by("id")
    assert read.equals(pa.Table.from_pylist(as_arrow_rows(rows), schema=read.schema))

    out_topic = f"{unique_topic}-out"
    sink = make_format(spec(schema_registry, topic=out_topic, schema=order_file))
    create_topic(kafka_bootstrap, out_topic, partitions=1)
    produce_keyed(kafka_bootstrap, out_topic, sink.encode(read.combine_chunks().to_batches()[0]))
    assert schema_registry.latest(f"{out_topic}-value") == schema_registry.latest(f"{unique_topic}-value")

    raw = read_batches(kafka_bootstrap, out_topic, FormatSpec("raw"))
    deserializer = confluent_deserializer(schema_registry)
    values = [value for b in raw for value in b.batch.column("value").to_pylist()]
    assert [deserializer(value, context(out_topic)) for value in values] == rows


def test_unknown_ids_and_violating_bodies_become_dead_letters_with_their_reasons(
        kafka_bootstrap: str, unique_topic: str, schema_registry: FakeSchemaRegistry) -> None:
    serializer = confluent_serializer(schema_registry, ORDER_V1)
    payloads: list[bytes | None] = [serializer(row, context(unique_topic)) for row in orders(5)]
    payloads[1] = framed(999, orders(2)[1])
    payloads[3] = framed(1, {**orders(4)[3], "id": "three"})
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce_keyed(kafka_bootstrap, unique_topic, payloads)
    batches = read_batches(kafka_bootstrap, unique_topic, spec(schema_registry, topic=unique_topic))
    dead = [d for b in batches for d in b.dead_letters]
    assert [(d.offset, d.value, d.stage) for d in dead] == [(1, payloads[1], "decode"), (3, payloads[3], "decode")]
    assert dead[0].reason == f"unknown schema id 999 (not found in schema registry {schema_registry.url})"
    assert dead[1].reason == "body violates JSON Schema id 1 at $.id: 'three' is not of type 'integer'"
    decoded = pa.Table.from_batches([b.batch for b in batches])
    assert decoded.column("id").to_pylist() == [0, 2, 4]
    assert decoded.column("__kafka_offset").to_pylist() == [0, 2, 4]
