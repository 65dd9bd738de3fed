"""``epochline validate`` offline (``engine.validation.checked_config``): the one check a config file and a
config sent to a worker go through, reporting every problem at once, each with its field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.cli import main
from engine.config import ConfigError
from engine.validation import checked_config
from tests.helpers import EXAMPLES

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
