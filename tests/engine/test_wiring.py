"""engine.wiring: what every Kafka client of a connector is given."""

from __future__ import annotations

from pathlib import Path

import yaml

from engine.config import load_config
from engine.wiring import client_config, sink_settings, source_settings


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
    assert client_config(default) == {"reconnect.backoff.ms": "20", "client.id": "orders"}
    assert source_settings(default).consumer_config["reconnect.backoff.ms"] == "20"
    assert sink_settings(default, transactional_id="t", group_id="g").producer_config["reconnect.backoff.ms"] == "20"

    chosen = load_config(connector(tmp_path, {"reconnect.backoff.ms": "100"}))
    assert client_config(chosen)["reconnect.backoff.ms"] == "100"
