"""``epochline validate`` offline (``engine.validation.checked_config``): the one check a config file and a
config sent to a worker go through, reporting every problem at once, each with its field; it checks the sink
format against the columns it will be given too (the source's, or the transform's output), before a record
is read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.cli import main
from engine.config import ConfigError
from engine.testing.connectors import write_config
from engine.validation import checked_config
from tests.helpers import EXAMPLES, REPO_ROOT

SCHEMALESS: dict[str, Any] = {"name": "v", "source": {"topic": "in", "format": "json"}, "sink": {"topic": "out"},
                              "dead_letter": {"topic": "dlq"}}
WITH_SCHEMA: dict[str, Any] = {**SCHEMALESS, "source": {"topic": "in", "format": "json",
                                                        "schema": str(EXAMPLES / "orders.schema.json")}}


def write(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "connector.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def problems(tmp_path: Path, config: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ConfigError) as refused:
        checked_config(write(tmp_path, config))
    return dict(refused.value.problems)


@pytest.mark.parametrize(("sql", "words"), [
    ("SELEC 1", "syntax error"), ("SELECT id FROM input WHERE", "syntax error"),
    ("DELETE FROM input", "exactly one SELECT"), ("SELECT 1; SELECT 2", "exactly one SELECT"),
])
def test_sql_is_parsed_even_when_the_source_schema_is_inferred_from_the_records(tmp_path: Path, sql: str,
                                                                                 words: str) -> None:
    found = problems(tmp_path, {**SCHEMALESS, "transform": {"sql": sql}})
    assert list(found) == ["transform.0.sql"] and words in found["transform.0.sql"]


def test_a_schemaless_config_whose_sql_parses_is_valid(tmp_path: Path) -> None:
    config = checked_config(write(tmp_path, {**SCHEMALESS, "transform": {"sql": "SELECT anything FROM input"}}))
    assert config.name == "v"


def test_a_python_step_that_cannot_be_imported_is_found_without_a_source_schema(tmp_path: Path) -> None:
    found = problems(tmp_path, {**SCHEMALESS, "transform": {"python": "no_such_module:f"}})
    assert list(found) == ["transform.0.python"] and "no_such_module" in found["transform.0.python"]


def test_unknown_keys_bad_values_and_bad_sql_are_reported_together(tmp_path: Path) -> None:
    config = {**WITH_SCHEMA, "chekpoint": {}, "sink": {"topic": "out", "delivery": "twice", "bogus": 1},
              "transform": [{"sql": "SELECT id FROM input"}, {"sql": "SELECT no_such_column FROM input"}]}
    found = problems(tmp_path, config)
    assert set(found) == {"chekpoint", "sink.delivery", "sink.bogus", "transform.1.sql"}
    assert "no_such_column" in found["transform.1.sql"]


def test_a_config_that_is_no_mapping_is_one_problem_at_the_top_level(tmp_path: Path) -> None:
    path = tmp_path / "connector.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="must be a mapping") as refused:
        checked_config(path)
    assert [field for field, _ in refused.value.problems] == ["(top level)"]


def test_the_validate_command_prints_every_problem_with_its_field(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, {**SCHEMALESS, "bogus": 1, "transform": {"sql": "SELEC 1"}})
    assert main(["validate", str(path)]) == 2
    error = capsys.readouterr().err
    assert "bogus: unknown key" in error and "transform.0.sql:" in error and str(path) in error


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


def listed_problems(path: Path) -> list[tuple[str, str]]:
    """The problems ``checked_config`` lists for the config file at ``path`` (none: it is valid)."""
    try:
        checked_config(path)
    except ConfigError as error:
        return error.problems
    return []


def test_a_protobuf_topic_with_maps_nested_messages_and_lists_can_be_written_as_json(tmp_path: Path) -> None:
    assert listed_problems(connector(tmp_path, PROTOBUF_SOURCE, {"format": "json"})) == []


def test_raw_needs_a_value_column_of_bytes_or_text_and_says_which_columns_there_are(tmp_path: Path) -> None:
    [(field, message)] = listed_problems(connector(tmp_path, PROTOBUF_SOURCE, {"format": "raw"},
                                            transform=[{"sql": "SELECT i32, text FROM input"}]))
    assert field == "sink"
    assert message == ("sink format raw cannot write the output to topic 'out': column value: the raw format "
                       "writes the 'value' column, and the output has none (it has i32, text)")


def test_a_column_the_sink_schema_cannot_convert_is_named_down_to_its_field(tmp_path: Path) -> None:
    sink = {"format": "avro", "schema": avro_schema(
        tmp_path, {"name": "address", "type": ["null", {"type": "record", "name": "Address", "fields": [
            {"name": "street", "type": "string"}, {"name": "zip", "type": {"type": "array", "items": "long"}}]}]},
        {"name": "tags", "type": "string"})}
    [(field, message)] = listed_problems(connector(tmp_path, PROTOBUF_SOURCE, sink))
    assert field == "sink"
    assert "column address.zip: uint32 cannot be written as the avro schema's list<item: int64 not null>" in message
    assert "column tags: list<item: string not null> cannot be written as the avro schema's string" in message


def test_the_transforms_output_is_what_is_checked(tmp_path: Path) -> None:
    sink = {"format": "avro", "schema": avro_schema(tmp_path, {"name": "total", "type": "long"})}
    assert listed_problems(connector(tmp_path, PROTOBUF_SOURCE, sink,
                              transform=[{"sql": "SELECT i64 AS total FROM input"}])) == []
    [(_, message)] = listed_problems(connector(tmp_path, PROTOBUF_SOURCE, sink,
                                        transform=[{"sql": "SELECT counts AS total FROM input"}]))
    assert "column total: map<string, int64> cannot be written as the avro schema's int64" in message


def test_a_column_the_sink_schema_requires_and_the_output_lacks_is_named(tmp_path: Path) -> None:
    sink = {"format": "avro", "schema": avro_schema(tmp_path, {"name": "missing", "type": "long"})}
    [(_, message)] = listed_problems(connector(tmp_path, PROTOBUF_SOURCE, sink))
    assert "column missing: the avro schema requires it and the output has no such column" in message


def test_kafka_columns_count_only_when_the_sink_keeps_them(tmp_path: Path) -> None:
    sink = {"format": "raw", "include_metadata": ["__kafka_key"]}
    transform = [{"sql": "SELECT __kafka_key, text AS value FROM input"}]
    assert listed_problems(connector(tmp_path, PROTOBUF_SOURCE, sink, transform=transform)) == []


def test_validate_refuses_the_pairing_in_one_line_with_exit_code_2(tmp_path: Path) -> None:
    path = connector(tmp_path, PROTOBUF_SOURCE, {"format": "raw"})
    done = subprocess.run([sys.executable, "-m", "engine.cli", "validate", str(path)], capture_output=True,
                          text=True, timeout=60, cwd=REPO_ROOT, check=False)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"epochline: invalid connector config {path}: sink: sink format raw cannot write the "
                           "output to topic 'out': column value:")
