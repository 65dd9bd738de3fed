"""Specification of the Confluent wire format (magic byte + schema id + Avro), by registry or directory."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import TYPE_CHECKING

import fastavro
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from schemas import FormatSpec, SchemaError, make_format
from schemas.base import Format
from schemas.registry import SchemaNotRegistered
from tests.helpers.schema_samples import ALL_TYPES_AVSC, all_types_rows, count_per_record_reads

if TYPE_CHECKING:  # imported by pytest as the plugin below; importing it here first would skip assert rewriting
    from tests.helpers.schema_registry import FakeSchemaRegistry

pytest_plugins = ["tests.helpers.schema_registry"]

USER_V1 = {"type": "record", "name": "User", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
]}
USER_V2 = {"type": "record", "name": "User", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "email", "type": ["null", "string"], "default": None},
]}
INCOMPATIBLE = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "string"}]}


@pytest.fixture
def registry(schema_registry: FakeSchemaRegistry) -> FakeSchemaRegistry:
    """The fake registry holding USER_V1, USER_V2 and INCOMPATIBLE as ids 1, 2 and 3 (as a producer left them)."""
    ids = [schema_registry.register("users-value", USER_V1), schema_registry.register("users-value", USER_V2),
           schema_registry.register("other-value", INCOMPATIBLE)]
    assert ids == [1, 2, 3]
    return schema_registry


@pytest.fixture
def schema_dir(tmp_path: Path) -> Path:
    for schema_id, schema in {1: USER_V1, 2: USER_V2, 3: INCOMPATIBLE}.items():
        (tmp_path / f"{schema_id}.avsc").write_text(json.dumps(schema))
    (tmp_path / "10.avsc").write_text(ALL_TYPES_AVSC.read_text())
    return tmp_path


def framed(schema_id: int, schema: dict, record: dict) -> bytes:
    """A record framed by hand exactly as Confluent's serializers do, independent of our encoder."""
    buffer = io.BytesIO()
    buffer.write(b"\x00" + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), record)
    return buffer.getvalue()


def test_round_trip_of_100k_records_with_every_type_is_exact(schema_dir: Path) -> None:
    fmt = make_format(FormatSpec("avro-confluent", schema_dir=schema_dir, schema_id=10))
    batch = pa.RecordBatch.from_pylist(all_types_rows(100_000, seed=11), schema=fmt.arrow_schema)
    payloads = fmt.encode(batch)
    assert all(p[:5] == b"\x00\x00\x00\x00\x0a" for p in payloads)
    decoded = fmt.decode(payloads)
    assert decoded.failures == []
    assert decoded.batch.equals(batch)


def test_registry_schemas_are_fetched_once_per_id(registry: FakeSchemaRegistry) -> None:
    fmt = make_format(FormatSpec("avro-confluent", registry_url=registry.url))
    payloads = [framed(1, USER_V1, {"id": n, "name": f"u{n}"}) for n in range(50)]
    first = fmt.decode(payloads)
    second = fmt.decode(payloads)
    assert first.batch.to_pylist()[3] == {"id": 3, "name": "u3"}
    assert second.batch.equals(first.batch)
    assert registry.requests.count("GET /schemas/ids/1") == 1


def test_reader_schema_defaults_to_the_first_id_seen(registry: FakeSchemaRegistry) -> None:
    fmt = make_format(FormatSpec("avro-confluent", registry_url=registry.url))
    assert fmt.arrow_schema is None
    fmt.decode([framed(2, USER_V2, {"id": 1, "name": "a", "email": "a@x"})])
    assert fmt.arrow_schema is not None and fmt.arrow_schema.names == ["id", "name", "email"]


def test_records_of_other_ids_are_resolved_into_the_one_reader_schema(registry: FakeSchemaRegistry) -> None:
    fmt = make_format(FormatSpec("avro-confluent", registry_url=registry.url, schema_id=2))
    decoded = fmt.decode([
        framed(1, USER_V1, {"id": 1, "name": "old"}),
        framed(2, USER_V2, {"id": 2, "name": "new", "email": "n@x"}),
    ])
    assert decoded.batch.to_pylist() == [
        {"id": 1, "name": "old", "email": None},
        {"id": 2, "name": "new", "email": "n@x"},
    ]


def test_reader_schema_file_takes_precedence_over_writer_ids(tmp_path: Path, schema_dir: Path) -> None:
    reader = tmp_path / "reader.avsc"
    reader.write_text(json.dumps(USER_V1))
    fmt = make_format(FormatSpec("avro-confluent", schema=reader, schema_dir=schema_dir))
    decoded = fmt.decode([framed(2, USER_V2, {"id": 5, "name": "v2", "email": "dropped"})])
    assert decoded.batch.to_pylist() == [{"id": 5, "name": "v2"}]


def test_unresolvable_writer_schema_fails_its_records_only(schema_dir: Path) -> None:
    fmt = make_format(FormatSpec("avro-confluent", schema_dir=schema_dir, schema_id=1))
    decoded = fmt.decode([framed(3, INCOMPATIBLE, {"id": "x"}), framed(1, USER_V1, {"id": 1, "name": "ok"})])
    assert decoded.indices == [1]
    assert "schema id 3 cannot be read into the reader schema" in decoded.failures[0].reason


def test_wrong_magic_byte_is_a_failure_naming_the_byte(schema_dir: Path) -> None:
    fmt = make_format(FormatSpec("avro-confluent", schema_dir=schema_dir, schema_id=1))
    decoded = fmt.decode([b'{"id": 1, "name": "json, not avro"}'])
    assert decoded.failures[0].reason == "wrong magic byte 0x7b (expected 0x00: not Confluent wire format)"


def test_unknown_schema_id_is_a_failure_naming_the_id(registry: FakeSchemaRegistry, schema_dir: Path) -> None:
    for spec in (FormatSpec("avro-confluent", registry_url=registry.url, schema_id=1),
                 FormatSpec("avro-confluent", schema_dir=schema_dir, schema_id=1)):
        decoded = make_format(spec).decode([framed(99, USER_V1, {"id": 1, "name": "x"})])
        assert "unknown schema id 99" in decoded.failures[0].reason


def test_an_unknown_schema_id_is_asked_for_once_per_batch(registry: FakeSchemaRegistry) -> None:
    fmt = make_format(FormatSpec("avro-confluent", registry_url=registry.url, schema_id=1))
    unknown = framed(99, USER_V1, {"id": 1, "name": "x"})

    decoded = fmt.decode([unknown, framed(1, USER_V1, {"id": 2, "name": "y"}), unknown])

    assert [f.index for f in decoded.failures] == [0, 2]
    assert registry.requests.count("GET /schemas/ids/99") == 1


def test_too_short_payload_is_a_failure(schema_dir: Path) -> None:
    fmt = make_format(FormatSpec("avro-confluent", schema_dir=schema_dir, schema_id=1))
    assert "too short for Confluent wire format: 3 byte(s)" in fmt.decode([b"\x00\x00\x00"]).failures[0].reason


def test_truncated_body_is_a_failure_saying_truncated(schema_dir: Path) -> None:
    fmt = make_format(FormatSpec("avro-confluent", schema_dir=schema_dir, schema_id=1))
    payload = framed(1, USER_V1, {"id": 1, "name": "a name"})
    assert "truncated" in fmt.decode([payload[:-3]]).failures[0].reason


def test_a_body_cut_inside_a_field_the_reader_skips_is_a_failure_saying_truncated(schema_dir: Path) -> None:
    fmt = make_format(FormatSpec("avro-confluent", schema_dir=schema_dir, schema_id=1))
    payload = framed(2, USER_V2, {"id": 1, "name": "a name", "email": "someone@example.com"})
    decoded = fmt.decode([payload, payload[:-3], payload[:-19]])
    assert decoded.indices == [0]
    assert [f.index for f in decoded.failures] == [1, 2]
    assert all("truncated" in f.reason for f in decoded.failures)


def test_null_payload_is_a_tombstone_failure(schema_dir: Path) -> None:
    fmt = make_format(FormatSpec("avro-confluent", schema_dir=schema_dir, schema_id=1))
    assert fmt.decode([None]).failures[0].reason == "null payload (tombstone)"


def test_good_rows_survive_beside_every_kind_of_bad_one(schema_dir: Path) -> None:
    fmt = make_format(FormatSpec("avro-confluent", schema_dir=schema_dir, schema_id=1))
    good = [framed(1, USER_V1, {"id": n, "name": f"u{n}"}) for n in range(3)]
    decoded = fmt.decode([good[0], b"\x01\x00\x00\x00\x01", good[1], framed(42, USER_V1, {"id": 9, "name": "x"}),
                          None, b"\x00", good[2]])
    assert decoded.indices == [0, 2, 6]
    assert decoded.batch.column("id").to_pylist() == [0, 1, 2]
    assert [f.index for f in decoded.failures] == [1, 3, 4, 5]


def test_a_batch_all_of_the_reader_schema_id_is_read_column_wise_and_any_other_id_sends_it_record_by_record(
        schema_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fmt = make_format(FormatSpec("avro-confluent", schema_dir=schema_dir, schema_id=1))
    v1 = [framed(1, USER_V1, {"id": n, "name": f"u{n}"}) for n in range(10)]
    reads = count_per_record_reads(monkeypatch)

    whole = fmt.decode(v1)
    assert (reads[0], whole.batch.column("id").to_pylist(), whole.failures) == (0, list(range(10)), [])
    mixed = fmt.decode([*v1[:9], framed(2, USER_V2, {"id": 9, "name": "u9", "email": None})])
    assert reads[0] == 10 and mixed.batch.equals(whole.batch) and mixed.failures == []


def test_encode_writes_magic_byte_and_schema_id_readable_by_fastavro(registry: FakeSchemaRegistry) -> None:
    fmt = make_format(FormatSpec("avro-confluent", registry_url=registry.url, schema_id=2))
    [payload] = fmt.encode(pa.RecordBatch.from_pydict({"id": [7], "name": ["n"], "email": [None]}))
    assert payload[:5] == b"\x00\x00\x00\x00\x02"
    body = fastavro.schemaless_reader(io.BytesIO(payload[5:]), fastavro.parse_schema(USER_V2), None)
    assert body == {"id": 7, "name": "n", "email": None}


def test_encode_without_schema_id_is_a_schema_error(schema_dir: Path) -> None:
    fmt: Format = make_format(FormatSpec("avro-confluent", schema_dir=schema_dir))
    with pytest.raises(SchemaError, match="needs schema_id"):
        fmt.encode(pa.RecordBatch.from_pydict({"id": [1], "name": ["a"]}))


def test_configured_schema_id_missing_from_the_registry_is_a_schema_error(registry: FakeSchemaRegistry) -> None:
    with pytest.raises(SchemaError, match="schema_id 77 is not in schema registry"):
        make_format(FormatSpec("avro-confluent", registry_url=registry.url, schema_id=77))


def test_unreachable_registry_raises_instead_of_failing_every_record(schema_registry: FakeSchemaRegistry) -> None:
    schema_registry.stop()
    fmt = make_format(FormatSpec("avro-confluent", registry_url=schema_registry.url))
    with pytest.raises(SchemaError, match="schema id 1"):
        fmt.decode([framed(1, USER_V1, {"id": 1, "name": "x"})])


def test_needs_exactly_one_of_registry_and_schema_dir(schema_dir: Path) -> None:
    with pytest.raises(SchemaError, match="exactly one of registry_url and schema_dir"):
        make_format(FormatSpec("avro-confluent"))
    with pytest.raises(SchemaError, match="exactly one of registry_url and schema_dir"):
        make_format(FormatSpec("avro-confluent", registry_url="http://127.0.0.1:1", schema_dir=schema_dir))


def test_schema_dir_must_exist(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="not a directory"):
        make_format(FormatSpec("avro-confluent", schema_dir=tmp_path / "missing"))


# -- encode: the schema file registered (or looked up) under its subject ---------------------------------------

NAMESPACED_USER = {"type": "record", "name": "User", "namespace": "epochline.test", "fields": USER_V1["fields"]}
USERS = pa.RecordBatch.from_pydict({"id": [1, 2], "name": ["ada", "grace"]})
STRATEGIES = [("topic", "TOPIC", "users-value"), ("record", "RECORD", "epochline.test.User"),
              ("topic-record", "TOPIC_RECORD", "users-epochline.test.User")]


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "user.avsc"
    path.write_text(json.dumps(NAMESPACED_USER, indent=2))
    return path


def sink_spec(registry: FakeSchemaRegistry, schema: Path, **options: object) -> FormatSpec:
    return FormatSpec("avro-confluent", schema=schema, registry_url=registry.url, topic="users",
                      **options)  # type: ignore[arg-type]


def confluent_avro_serializer(registry: FakeSchemaRegistry, strategy: str, auto_register: bool) -> AvroSerializer:
    return AvroSerializer(SchemaRegistryClient({"url": registry.url}), json.dumps(NAMESPACED_USER),
                          conf={"subject.name.strategy.type": strategy, "auto.register.schemas": auto_register})


@pytest.mark.parametrize(("strategy", "confluent_strategy", "subject"), STRATEGIES)
def test_encode_registers_the_schema_file_under_the_subject_confluents_serializer_would_use(
        schema_registry: FakeSchemaRegistry, user_file: Path, strategy: str, confluent_strategy: str,
        subject: str) -> None:
    payloads = make_format(sink_spec(schema_registry, user_file, subject_strategy=strategy)).encode(USERS)
    assert schema_registry.subjects() == [subject]
    serializer = confluent_avro_serializer(schema_registry, confluent_strategy, auto_register=False)
    theirs = serializer({"id": 1, "name": "ada"}, SerializationContext("users", MessageField.VALUE))
    assert theirs == payloads[0], "Confluent's serializer finds our registration and frames the same bytes"


def test_encode_looks_up_the_id_a_producer_registered_when_auto_register_is_off(
        schema_registry: FakeSchemaRegistry, user_file: Path) -> None:
    schema_registry.register("users-value", USER_V2)
    schema_id = schema_registry.register("users-value", NAMESPACED_USER)
    payloads = make_format(sink_spec(schema_registry, user_file, auto_register=False)).encode(USERS)
    assert {p[:5] for p in payloads} == {b"\x00" + schema_id.to_bytes(4, "big")}
    assert schema_registry.versions("users-value") == [1, 2], "a look-up registers nothing"


def test_encode_without_auto_register_names_the_subject_the_schema_is_missing_from(
        schema_registry: FakeSchemaRegistry, user_file: Path) -> None:
    schema_registry.register("users-value", USER_V2)
    fmt = make_format(sink_spec(schema_registry, user_file, auto_register=False))
    with pytest.raises(SchemaNotRegistered, match="not registered under subject 'users-value'.*auto_register is off"):
        fmt.encode(USERS)
    assert schema_registry.versions("users-value") == [1]


def test_records_we_encode_are_read_by_confluents_avro_deserializer(
        schema_registry: FakeSchemaRegistry, user_file: Path) -> None:
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": schema_registry.url}))
    context = SerializationContext("users", MessageField.VALUE)
    payloads = make_format(sink_spec(schema_registry, user_file)).encode(USERS)
    assert [deserializer(p, context) for p in payloads] == USERS.to_pylist()


def test_a_source_reading_with_the_sink_spec_registers_nothing(
        schema_registry: FakeSchemaRegistry, user_file: Path) -> None:
    schema_id = schema_registry.register("users-value", NAMESPACED_USER)
    payloads = [framed(schema_id, NAMESPACED_USER, row) for row in USERS.to_pylist()]
    assert make_format(sink_spec(schema_registry, user_file)).decode(payloads).batch.to_pylist() == USERS.to_pylist()
    assert [r for r in schema_registry.requests if r.startswith("POST")] == []


def test_encode_with_a_schema_directory_and_no_schema_id_still_needs_schema_id(
        schema_dir: Path, user_file: Path) -> None:
    fmt = make_format(FormatSpec("avro-confluent", schema=user_file, schema_dir=schema_dir, topic="users"))
    with pytest.raises(SchemaError, match="needs schema_id .* or registry_url and a schema file"):
        fmt.encode(USERS)
