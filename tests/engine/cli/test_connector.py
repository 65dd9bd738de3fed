"""``epochline run``: its last line sums up what the run committed, however it ended; ``--create-topics``
creates the topics a connector names that do not exist yet."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from connectors.admin import create_topic, partitions_of
from engine.testing import read_values
from engine.testing.connectors import produce_values, start_connector, write_config
from tests.helpers import REPO_ROOT
from tests.helpers.worker_process import wait_for

pytestmark = pytest.mark.timeout(240)

RECORDS = 1_000
MALFORMED = 3
KEPT = sum(1 for i in range(RECORDS) if i % 7 != 0)
"""The transform drops every seventh id."""
TEXT_LOGS = ("--log-format", "text", "run")


def connector(tmp_path: Path, name: str) -> Path:
    return write_config(tmp_path, {
        "name": name,
        "source": {"topic": f"{name}-in", "format": "json"},
        "transform": {"sql": "SELECT * FROM input WHERE id % 7 <> 0"},
        "sink": {"topic": f"{name}-out", "format": "json"},
        "dead_letter": {"topic": f"{name}-dlq"},
        "checkpoint": {"interval": "300ms", "dir": str(tmp_path / "state")},
    })


def with_input(bootstrap: str, name: str, topics: tuple[str, ...] = ("in", "out", "dlq")) -> None:
    for suffix in topics:
        create_topic(bootstrap, f"{name}-{suffix}", 2)
    produce_values(bootstrap, f"{name}-in", [orjson.dumps({"id": i}) for i in range(RECORDS)] + [b"{"] * MALFORMED, 2)


def lines_of(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines() if line.strip()]


def test_a_run_stopped_by_sigint_ends_with_a_line_summing_what_it_committed(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    with_input(kafka_bootstrap, unique_topic)
    run = start_connector(connector(tmp_path, unique_topic), kafka_bootstrap, command=TEXT_LOGS)
    try:
        wait_for("every kept record in the output",
                 lambda: len(read_values(kafka_bootstrap, f"{unique_topic}-out", timeout=10)) == KEPT,
                 timeout_s=120, every_s=1.0)
        time.sleep(1.0)  # an epoch boundary past the last record: the run has nothing open when it stops
        run.process.send_signal(signal.SIGINT)
        assert run.wait(60) == 0, run.log_tail()
    finally:
        run.kill()

    output = run.log_path.read_text()
    epochs = output.count("checkpoint committed")
    assert epochs >= 1
    assert lines_of(output)[-1] == (f"stopped: {RECORDS + MALFORMED:,} records in, {KEPT:,} out, {MALFORMED} "
                                    f"dead-lettered, {epochs} epoch{'' if epochs == 1 else 's'} committed")


def test_a_run_to_the_end_of_its_input_ends_with_the_sum_as_a_json_event(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    with_input(kafka_bootstrap, unique_topic)
    done = subprocess.run([sys.executable, "-m", "engine.cli", "--log-format", "json", "run",
                           str(connector(tmp_path, unique_topic)), "--bootstrap-servers", kafka_bootstrap,
                           "--stop-at-end"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)

    assert done.returncode == 0, done.stderr[-3000:]
    events = [orjson.loads(line) for line in lines_of(done.stderr)]
    committed = [event for event in events if event["event"] == "checkpoint committed"]
    summary = events[-1]
    assert summary["event"] == "run summary"
    assert {key: summary[key] for key in ("outcome", "records_in", "records_out", "dead_lettered",
                                          "epochs_committed")} == {
        "outcome": "finished", "records_in": RECORDS + MALFORMED,
        "records_out": len(read_values(kafka_bootstrap, f"{unique_topic}-out")),
        "dead_lettered": len(read_values(kafka_bootstrap, f"{unique_topic}-dlq")),
        "epochs_committed": len(committed)}
    assert summary["records_out"] == KEPT and summary["dead_lettered"] == MALFORMED


def test_a_run_that_fails_after_it_started_says_why_then_what_it_committed(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    with_input(kafka_bootstrap, unique_topic, topics=("in", "dlq"))  # no output topic

    done = subprocess.run([sys.executable, "-m", "engine.cli", *TEXT_LOGS, str(connector(tmp_path, unique_topic)),
                           "--bootstrap-servers", kafka_bootstrap], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)

    assert done.returncode == 2
    *_, error, summary = lines_of(done.stderr)
    assert error.startswith(f"epochline: {unique_topic}: sink: topic '{unique_topic}-out' does not exist on ")
    assert summary == "failed: 0 records in, 0 out, 0 dead-lettered, 0 epochs committed"


def test_create_topics_creates_the_missing_source_sink_and_dead_letter_topics_and_runs(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    create_topic(kafka_bootstrap, f"{unique_topic}-out", 3)  # an existing topic is left as it is

    done = subprocess.run([sys.executable, "-m", "engine.cli", *TEXT_LOGS, str(connector(tmp_path, unique_topic)),
                           "--bootstrap-servers", kafka_bootstrap, "--create-topics", "--stop-at-end"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr[-3000:]
    assert lines_of(done.stderr)[-1].startswith("finished: 0 records in, 0 out, 0 dead-lettered, ")
    assert len(partitions_of(kafka_bootstrap, f"{unique_topic}-out")) == 3
    for suffix in ("in", "dlq"):
        assert partitions_of(kafka_bootstrap, f"{unique_topic}-{suffix}")  # the broker's num.partitions
