"""Specification of the Confluent wire format (magic byte + schema id + Avro), by registry or directory."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self
from urllib.parse import urlparse

import fastavro
import pyarrow as pa
import pytest

from schemas import FormatSpec, SchemaError, make_format
from schemas.base import Format
from tests.helpers.schema_samples import ALL_TYPES_AVSC, all_types_rows

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


class FakeSchemaRegistry:
    """A unit-level stand-in for the registry's HTTP API: ``GET /schemas/ids/{id}`` as the real one answers."""

    def __init__(self, schemas: dict[int, dict]) -> None:
        self.requests: list[str] = []
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                registry.requests.append(self.path)
                parts = urlparse(self.path).path.strip("/").split("/")
                schema_id = int(parts[2]) if parts[:2] == ["schemas", "ids"] and parts[2].isdigit() else None
                if schema_id in schemas:
                    self.answer(200, {"schema": json.dumps(schemas[schema_id])})
                else:
                    self.answer(404, {"error_code": 40403, "message": "Schema not found"})

            def answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def registry() -> Iterator[FakeSchemaRegistry]:
    with FakeSchemaRegistry({1: USER_V1, 2: USER_V2, 3: INCOMPATIBLE}) as fake:
        yield fake


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
    assert len([r for r in registry.requests if "/schemas/ids/1" in r]) == 1


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


def test_too_short_payload_is_a_failure(schema_dir: Path) -> None:
    fmt = make_format(FormatSpec("avro-confluent", schema_dir=schema_dir, schema_id=1))
    assert "too short for Confluent wire format: 3 byte(s)" in fmt.decode([b"\x00\x00\x00"]).failures[0].reason


def test_truncated_body_is_a_failure_saying_truncated(schema_dir: Path) -> None:
    fmt = make_format(FormatSpec("avro-confluent", schema_dir=schema_dir, schema_id=1))
    payload = framed(1, USER_V1, {"id": 1, "name": "a name"})
    assert "truncated" in fmt.decode([payload[:-3]]).failures[0].reason


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


def test_unreachable_registry_raises_instead_of_failing_every_record() -> None:
    with FakeSchemaRegistry({}) as stopped:
        url = stopped.url
    fmt = make_format(FormatSpec("avro-confluent", registry_url=url))
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
