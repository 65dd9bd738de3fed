"""Connector configs: every mistake is an error that names the key, before anything touches Kafka."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from engine.config import ConfigError, duration_ms, load_config
from engine.instance import InstanceNameError, resolve_instance
from engine.wiring import build_chain
from tests.helpers import EXAMPLES


def write(tmp_path: Path, **overrides: object) -> Path:
    config = {"name": "orders-clean", "source": {"topic": "orders", "format": "json"},
              "transform": {"sql": "SELECT id FROM input"}, "sink": {"topic": "out"},
              "dead_letter": {"topic": "dlq"}, **overrides}
    path = tmp_path / "connector.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_example_config_loads_with_paths_relative_to_its_file() -> None:
    config = load_config(EXAMPLES / "orders-clean.yaml")
    assert config.source.format_spec(config.base_dir).schema == EXAMPLES / "orders.schema.json"
    assert config.checkpoint.interval == 1000
    assert config.group_id == "epochline-orders-clean"
    assert config.sink.transaction_timeout == 10_000  # short, so a new owner of a partition waits seconds


def test_an_instance_name_is_kept_and_names_the_transactional_id_and_members(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EPOCHLINE_INSTANCE", raising=False)
    config = load_config(write(tmp_path))
    generated = resolve_instance(config)
    assert resolve_instance(config) == generated  # kept in the state directory, stable across restarts
    assert generated.transactional_id == f"epochline-{config.name}-{generated.name}"
    named = resolve_instance(config, "host-2")
    assert (named.transactional_id, named.member("source")) == (f"epochline-{config.name}-host-2",
                                                                f"{config.name}-host-2-source")
    assert named.state_dir != generated.state_dir
    with pytest.raises(InstanceNameError, match="instance name"):
        resolve_instance(config, "no;semicolons")


def test_an_unknown_key_is_named_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sink\.delivry: unknown key"):
        load_config(write(tmp_path, sink={"topic": "out", "delivry": "exactly-once"}))


@pytest.mark.parametrize("name", ["n" * 201, "with space", "..", "ünïcode"])
def test_a_name_that_breaks_the_name_rule_is_refused_stating_the_rule(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match=r"name: .*connector name .*A-Za-z0-9\._-"):
        load_config(write(tmp_path, name=name))


def test_a_yaml_alias_bomb_in_a_config_file_is_refused_within_a_second(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    levels = [f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]" for level in range(1, 12)]
    path.write_text("\n".join(['l0: &l0 ["lol", "lol", "lol"]', *levels]))
    began = time.monotonic()
    with pytest.raises(ConfigError, match=f"connector config {path}: .*aliases"):
        load_config(path)
    assert time.monotonic() - began < 1.0


def test_a_transaction_timeout_below_the_checkpoint_budget_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="transaction_timeout"):
        load_config(write(tmp_path, sink={"topic": "out", "transaction_timeout": "10s"},
                          checkpoint={"interval": "5s", "timeout": "30s"}))


@pytest.mark.parametrize("key", ["transactional.id", "transaction.timeout.ms", "enable.idempotence"])
def test_a_producer_setting_epochline_makes_is_refused_naming_it(tmp_path: Path, key: str) -> None:
    with pytest.raises(ConfigError, match=rf"sink.producer may not set \['{key}'\]"):
        load_config(write(tmp_path, sink={"topic": "out", "producer": {key: "1", "linger.ms": "5"}}))


def test_dead_lettering_without_a_dead_letter_topic_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path)
    raw = yaml.safe_load(path.read_text())
    del raw["dead_letter"]
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="dead_letter.topic is required"):
        load_config(path)


def test_a_transform_step_needs_exactly_one_kind(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exactly one of sql, python, window"):
        load_config(write(tmp_path, transform={"sql": "SELECT 1", "python": "m:f"}))


WINDOW = {"kind": "tumbling", "size": "10s", "key": ["user"], "aggregates": {"n": "count(*)"}}


def test_a_window_judged_by_another_time_than_the_sources_event_time_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"transform step 0: window time_column 'ts' is not the source's event "
                                          r"time \(source.event_time.column: the Kafka timestamp\)"):
        load_config(write(tmp_path, transform={"window": {**WINDOW, "time_column": "ts"}}))


def test_a_window_places_rows_by_the_sources_event_time_unless_it_names_the_same_column(tmp_path: Path) -> None:
    source = {"topic": "orders", "format": "json", "event_time": {"column": "ts"}}
    for window in (WINDOW, {**WINDOW, "time_column": "ts"}):
        chain = build_chain(load_config(write(tmp_path, source=source, transform={"window": window})))
        assert chain.steps[0].spec.event_time_column == "ts"  # type: ignore[attr-defined]


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read connector config"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize("text, ms", [("500ms", 500), ("1s", 1000), ("2m", 120_000), ("1h", 3_600_000),
                                      ("1d", 86_400_000), ("1.5s", 1500), (250, 250)])
def test_durations_accept_units(text: str | int, ms: int) -> None:
    assert duration_ms(text) == ms


@pytest.mark.parametrize("problem, expected", [
    ({"sink": {"topic": "out", "delivery": "twice"}}, "sink.delivery"),
    ({"chekpoint": {"interval": "1s"}}, "chekpoint: unknown key"),
    ({"transform": {"sql": "SELEC nonsense"}}, "step0-sql"),
])
def test_validate_command_names_what_is_wrong(tmp_path: Path, problem: dict, expected: str) -> None:
    path = write(tmp_path, source={"topic": "in", "format": "json", "schema": str(EXAMPLES / "orders.schema.json")},
                 **problem)
    done = subprocess.run([sys.executable, "-m", "engine.cli", "validate", str(path)], capture_output=True, text=True)
    assert done.returncode == 2
    assert expected in done.stderr


def test_validate_command_accepts_the_example() -> None:
    done = subprocess.run([sys.executable, "-m", "engine.cli", "validate", str(EXAMPLES / "orders-clean.yaml")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout


def test_a_sink_without_a_type_is_kafka_and_type_kafka_says_the_same(tmp_path: Path) -> None:
    implicit = load_config(write(tmp_path))
    explicit = load_config(write(tmp_path, sink={"type": "kafka", "topic": "out"}))
    assert implicit.kafka_sink is not None and implicit.kafka_sink == explicit.kafka_sink
    assert implicit.sink_target == "out"


def test_a_postgres_sink_is_checked_by_its_plugin_and_keeps_secret_references(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, sink={"type": "postgres", "dsn": "postgresql://u@h/db?password=${env:PW}",
                                               "table": "orders", "mode": "upsert", "key": ["id"]}))
    assert config.kafka_sink is None and config.sink_target == "postgres sink"
    assert config.sink.delivery == "exactly-once"
    assert config.sink.settings["dsn"] == "postgresql://u@h/db?password=${env:PW}"  # resolved only at run time


@pytest.mark.parametrize(("sink", "expected"), [
    ({"type": "postgres", "table": "t"}, "sink: .*dsn: a postgresql:// connection string is required"),
    ({"type": "postgres", "dsn": "postgresql://h/db", "table": "t", "mode": "upsert"}, "sink: .*key: mode upsert"),
    ({"type": "mongo", "uri": "x"}, "sink: .*unknown sink type 'mongo' .*epochline.sinks"),
    ({"type": "my_sinks.warehouse:PLUGIN"}, "sink: .*cannot import module 'my_sinks.warehouse'.*PYTHONPATH"),
    ({"type": "examples.jsonl_sink:NOTHING"}, "sink: .*module 'examples.jsonl_sink' has no attribute 'NOTHING'"),
    ({"type": "examples.jsonl_sink:PLUGIN"}, "sink: directory: the directory to write to is required"),
    ({"type": "kafka", "topic": "out", "table": "t"}, "sink.table: unknown key"),
])
def test_a_sink_config_mistake_names_the_sink_setting(tmp_path: Path, sink: dict, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(write(tmp_path, sink=sink))


def test_a_module_attribute_type_names_a_sink_plugin_in_the_users_own_code(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, sink={"type": "examples.jsonl_sink:PLUGIN", "directory": "out"}))
    assert config.kafka_sink is None and config.sink.settings == {"directory": "out"}


def test_the_postgres_example_validates_offline() -> None:
    result = subprocess.run([sys.executable, "-m", "engine.cli", "validate", str(EXAMPLES / "orders-to-postgres.yaml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "orders -> postgres sink, exactly-once" in result.stdout


def test_a_batch_job_refuses_an_external_sink(tmp_path: Path) -> None:
    path = write(tmp_path, sink={"type": "postgres", "dsn": "postgresql://h/db", "table": "t"})
    with pytest.raises(ConfigError, match="sink.type: a batch job commits its items to Kafka"):
        load_config(path, batch=True)
