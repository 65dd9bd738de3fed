"""engine.checkpoint.runner: what a run does before its pipeline starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from connectors.admin import KafkaUnreachable
from engine.checkpoint import ConnectorFailed, RunOptions, run_connector, runner
from engine.config import ConnectorConfig, load_config


def sql_connector(tmp_path: Path) -> ConnectorConfig:
    path = tmp_path / "connector.yaml"
    path.write_text(yaml.safe_dump({
        "name": "orders-clean", "source": {"topic": "orders", "format": "json"}, "sink": {"topic": "out"},
        "dead_letter": {"topic": "dlq"}, "transform": [{"sql": "SELECT * FROM input"}],
        "checkpoint": {"dir": str(tmp_path / "state")}}))
    return load_config(path)


def test_the_run_starts_opening_what_takes_long_before_it_waits_for_kafka(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The DuckDB database opens while the connection is checked and the fence runs, not after them."""
    calls: list[str] = []

    def check_connection(*args: object, **kwargs: object) -> None:
        calls.append("check connection")
        raise KafkaUnreachable("no broker here")

    monkeypatch.setattr(runner, "open_early", lambda config: calls.append("open early"))
    monkeypatch.setattr(runner, "check_connection", check_connection)

    with pytest.raises(ConnectorFailed, match="no broker here"):
        run_connector(sql_connector(tmp_path), RunOptions(bootstrap="127.0.0.1:9"))

    assert calls == ["open early", "check connection"]
