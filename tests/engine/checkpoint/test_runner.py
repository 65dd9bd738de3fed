"""engine.checkpoint.runner: what a run does before its pipeline starts."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from connectors.admin import KafkaUnreachable
from engine.checkpoint import ConnectorFailed, RunOptions, run_connector, runner
from engine.config import ConnectorConfig, load_config
from sinks import SinkError


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


def test_restarts_are_counted_in_a_row_and_start_over_once_a_checkpoint_commits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Each run below fails with a recoverable error after committing this many checkpoints: the budget of 2
    restarts in a row is spent only by the last three runs, which commit nothing between them."""
    commits_before_failing = iter([1, 0, 3, 0, 0])
    runs: list[int] = []

    class FailingCoordinator:
        def __init__(self, pipeline: object, settings: object, stop: object) -> None:
            self.checkpoints_committed = 0

        def run(self) -> None:
            self.checkpoints_committed = next(commits_before_failing)
            runs.append(self.checkpoints_committed)
            raise SinkError("the broker went away")

    monkeypatch.setattr(runner, "open_early", lambda config: None)
    monkeypatch.setattr(runner, "check_connection", lambda *args, **kwargs: None)
    monkeypatch.setattr(runner, "KafkaPipeline", lambda *args, **kwargs: None)
    monkeypatch.setattr(runner, "EpochLoop", FailingCoordinator)
    caplog.set_level(logging.WARNING, logger=runner.__name__)

    with pytest.raises(ConnectorFailed, match="giving up after 2 restarts in a row without a committed checkpoint"):
        run_connector(sql_connector(tmp_path), RunOptions(bootstrap="127.0.0.1:9", max_restarts=2,
                                                          restart_backoff_s=0.001))

    assert runs == [1, 0, 3, 0, 0]
    restarts = [(record.restart, record.in_a_row, record.backoff_s)  # type: ignore[attr-defined]
                for record in caplog.records if record.name == runner.__name__]
    assert restarts == [(1, 1, 0.001), (2, 2, 0.002), (3, 1, 0.001), (4, 2, 0.002)]
