"""engine.wiring: what every Kafka client of a connector is given."""

from __future__ import annotations

from pathlib import Path

import yaml

from connectors.source import KafkaSource
from engine.config import load_config
from engine.wiring import client_config, sink_settings, source_settings
from tests.helpers.processes import WATCH_CONNECT, run_python


def connector(tmp_path: Path, client: dict[str, str]) -> Path:
    path = tmp_path / "connector.yaml"
    path.write_text(yaml.safe_dump({
        "name": "orders-clean", "source": {"topic": "orders", "format": "json"}, "sink": {"topic": "out"},
        "dead_letter": {"topic": "dlq"}, "kafka": {"client": client}}))
    return path


def test_every_client_reconnects_after_20_ms_at_first_unless_kafka_client_says_otherwise(tmp_path: Path) -> None:
    """librdkafka holds a new client's second connection back for half of reconnect.backoff.ms (100 by
    default), and a transactional producer's first call and a consumer's group join wait for it."""
    default = load_config(connector(tmp_path, {"client.id": "orders"}))
    assert client_config(default) == {"client.id": "orders"}
    assert source_settings(default).consumer_config["client.id"] == "orders"
    assert sink_settings(default, transactional_id="t", group_id="g").producer_config["client.id"] == "orders"
    with KafkaSource(source_settings(default), "127.0.0.1:1", "g") as source:
        assert source.consumer_config()["reconnect.backoff.ms"] == "20"

    chosen = load_config(connector(tmp_path, {"reconnect.backoff.ms": "100"}))
    with KafkaSource(source_settings(chosen), "127.0.0.1:1", "g") as source:
        assert source.consumer_config()["reconnect.backoff.ms"] == "100"


def test_a_config_with_a_sql_step_starts_opening_duckdb_before_any_step_is_made(tmp_path: Path) -> None:
    """``open_early`` (the runner's first call) overlaps the database's opening with the connection check and
    the fence; a config without SQL opens none."""
    with_sql = connector(tmp_path, {})
    config = yaml.safe_load(with_sql.read_text())
    without_sql = tmp_path / "no-sql.yaml"
    without_sql.write_text(yaml.safe_dump(config))
    with_sql.write_text(yaml.safe_dump({**config, "transform": [{"sql": "SELECT * FROM input"}]}))
    watch = WATCH_CONNECT + """
import sys
from engine.config import load_config
from engine.wiring import open_early
open_early(load_config(sys.argv[1]))
deadline = time.monotonic() + float(sys.argv[2])
while not opened_on and time.monotonic() < deadline:
    time.sleep(0.005)
print(opened_on)
"""
    assert run_python(watch, str(with_sql), "10") == "['duckdb-open']"
    assert run_python(watch, str(without_sql), "0.5") == "[]"
