"""Offline validation checks the sink format against the columns it will be given: the source's, or the
transform's output, before a record is read (``epochline validate``, the REST API's validate, and start)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from engine.config import load_config
from engine.validation import offline_problems
from tests.helpers import REPO_ROOT
from tests.helpers.connector_process import write_config

PROTOS = REPO_ROOT / "tests" / "schemas" / "protos"
PROTOBUF_SOURCE = {"topic": "in", "format": "protobuf-confluent", "schema": str(PROTOS / "all_types.proto"),
                   "message": "epochline.test.Everything", "schema_id": 1}
"""A Protobuf topic with every type protobuf-confluent reads: maps (string, int32 and bool keys), nested
messages, repeated fields, bytes, enums, oneofs, Timestamps and wrappers."""


def connector(tmp_path: Path, source: dict[str, Any], sink: dict[str, Any], **more: Any) -> Path:
    return write_config(tmp_path, {"name": "types", "source": source, "sink": {"topic": "out", **sink},
                                   "dead_letter": {"topic": "dlq"}, **more})


def avro_schema(tmp_path: Path, *fields: dict[str, Any]) -> str:
    path = tmp_path / "sink.avsc"
    path.write_text(json.dumps({"type": "record", "name": "Out", "fields": list(fields)}))
    return str(path)


def problems(path: Path) -> list[tuple[str, str]]:
    return offline_problems(load_config(path))


def test_a_protobuf_topic_with_maps_nested_messages_and_lists_can_be_written_as_json(tmp_path: Path) -> None:
    assert problems(connector(tmp_path, PROTOBUF_SOURCE, {"format": "json"})) == []


def test_raw_needs_a_value_column_of_bytes_or_text_and_says_which_columns_there_are(tmp_path: Path) -> None:
    [(field, message)] = problems(connector(tmp_path, PROTOBUF_SOURCE, {"format": "raw"},
                                            transform=[{"sql": "SELECT i32, text FROM input"}]))
    assert field == "sink"
    assert message == ("sink format raw cannot write the output to topic 'out': column value: the raw format "
                       "writes the 'value' column, and the output has none (it has i32, text)")


def test_a_column_the_sink_schema_cannot_convert_is_named_down_to_its_field(tmp_path: Path) -> None:
    sink = {"format": "avro", "schema": avro_schema(
        tmp_path, {"name": "address", "type": ["null", {"type": "record", "name": "Address", "fields": [
            {"name": "street", "type": "string"}, {"name": "zip", "type": {"type": "array", "items": "long"}}]}]},
        {"name": "tags", "type": "string"})}
    [(field, message)] = problems(connector(tmp_path, PROTOBUF_SOURCE, sink))
    assert field == "sink"
    assert "column address.zip: uint32 cannot be written as the avro schema's list<item: int64 not null>" in message
    assert "column tags: list<item: string not null> cannot be written as the avro schema's string" in message


def test_the_transforms_output_is_what_is_checked(tmp_path: Path) -> None:
    sink = {"format": "avro", "schema": avro_schema(tmp_path, {"name": "total", "type": "long"})}
    assert problems(connector(tmp_path, PROTOBUF_SOURCE, sink,
                              transform=[{"sql": "SELECT i64 AS total FROM input"}])) == []
    [(_, message)] = problems(connector(tmp_path, PROTOBUF_SOURCE, sink,
                                        transform=[{"sql": "SELECT counts AS total FROM input"}]))
    assert "column total: map<string, int64> cannot be written as the avro schema's int64" in message


def test_a_column_the_sink_schema_requires_and_the_output_lacks_is_named(tmp_path: Path) -> None:
    sink = {"format": "avro", "schema": avro_schema(tmp_path, {"name": "missing", "type": "long"})}
    [(_, message)] = problems(connector(tmp_path, PROTOBUF_SOURCE, sink))
    assert "column missing: the avro schema requires it and the output has no such column" in message


def test_kafka_columns_count_only_when_the_sink_keeps_them(tmp_path: Path) -> None:
    sink = {"format": "raw", "include_metadata": ["__kafka_key"]}
    transform = [{"sql": "SELECT __kafka_key, text AS value FROM input"}]
    assert problems(connector(tmp_path, PROTOBUF_SOURCE, sink, transform=transform)) == []


def test_validate_refuses_the_pairing_in_one_line_with_exit_code_2(tmp_path: Path) -> None:
    path = connector(tmp_path, PROTOBUF_SOURCE, {"format": "raw"})
    done = subprocess.run([sys.executable, "-m", "engine.cli", "validate", str(path)], capture_output=True,
                          text=True, timeout=60, cwd=REPO_ROOT, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(
        "epochline: sink format raw cannot write the output to topic 'out': column value:")
    assert "Traceback" not in done.stderr
