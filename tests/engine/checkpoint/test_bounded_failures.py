"""Bad Kafka, bounded and clear: an unreachable broker, a missing topic, a stop signal while waiting, and a
broker started a moment ago. Each fails (or succeeds) in bounded time with one line that names the problem,
and no raw librdkafka line reaches stderr."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import yaml

from connectors.admin import create_topic
from engine.ports import free_port
from engine.testing import read_values
from engine.testing.accounting import assert_exactly_once
from engine.testing.connectors import produce_values, write_config
from engine.testing.local_broker import LocalBroker
from tests.helpers import REPO_ROOT


def connector(tmp_path: Path, topic: str, connect_timeout: str = "3s") -> Path:
    return write_config(tmp_path, {
        "name": topic,
        "source": {"topic": f"{topic}-in", "format": "json"},
        "sink": {"topic": f"{topic}-out", "format": "json"},
        "dead_letter": {"topic": f"{topic}-dlq"},
        "checkpoint": {"interval": "200ms", "dir": str(tmp_path / "state")},
        "kafka": {"connect_timeout": connect_timeout},
    })


def epochline(*args: str) -> list[str]:
    return [sys.executable, "-m", "engine.cli", *args]


def raw_librdkafka_lines(stderr: str) -> list[str]:
    """librdkafka's own format is ``%LEVEL|time|FAC|name| message``."""
    return [line for line in stderr.splitlines() if line.startswith("%")]


def test_an_unreachable_broker_fails_within_the_connect_timeout_naming_the_address(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    done = subprocess.run(epochline("run", str(connector(tmp_path, "nowhere")), "--bootstrap-servers", address),
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, check=False)
    elapsed = time.monotonic() - started

    assert done.returncode == 2
    assert elapsed < 3 + 5
    [line] = [line for line in done.stderr.splitlines() if line.startswith("epochline:")]
    assert f"cannot reach Kafka at {address} within 3s: connection refused" in line
    assert raw_librdkafka_lines(done.stderr) == []
    events = [orjson.loads(text) for text in done.stderr.splitlines() if text.startswith("{")]
    client_lines = [event for event in events if event["logger"] == "librdkafka"]
    assert client_lines, "librdkafka's lines should reach the structured log"
    assert all(event["connector"] == "nowhere" for event in client_lines)
    assert len(client_lines) <= 3, "a refused connection repeated within 10 s is held back"


def test_sigterm_while_waiting_for_kafka_exits_within_seconds(tmp_path: Path) -> None:
    config = connector(tmp_path, "waiting", connect_timeout="60s")
    process = subprocess.Popen(epochline("run", str(config), "--bootstrap-servers", f"127.0.0.1:{free_port()}"),
                               stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        time.sleep(4)  # imports done, signal handlers installed, waiting for the broker
        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        _, stderr = process.communicate(timeout=10)
        assert time.monotonic() - started < 5
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    assert process.returncode == 0
    assert "connector stopped while waiting for Kafka" in stderr
    assert raw_librdkafka_lines(stderr) == []


def test_a_missing_source_topic_fails_at_once_without_restarting(kafka_bootstrap: str, unique_topic: str,
                                                                  tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(epochline("run", str(connector(tmp_path, unique_topic)), "--bootstrap-servers",
                                    kafka_bootstrap), capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                          check=False)

    assert done.returncode == 2
    assert time.monotonic() - started < 20
    [line] = [line for line in done.stderr.splitlines() if line.startswith("epochline:")]
    assert f"topic '{unique_topic}-in'" in line and "does not exist" in line
    assert "restarting connector" not in done.stderr
    assert raw_librdkafka_lines(done.stderr) == []


@pytest.mark.parametrize("command, missing", [(("run", "{config}"), "out"), (("run", "{config}"), "dlq"),
                                              (("batch", "run", "{config}", "--batch-id", "first"), "out")])
def test_a_missing_sink_or_dead_letter_topic_fails_at_once_naming_it(command: tuple[str, ...], missing: str,
                                                                      kafka_bootstrap: str, unique_topic: str,
                                                                      tmp_path: Path) -> None:
    """The broker does not create topics on demand: without the check at start, every epoch's records would
    time out and the connector restart in vain."""
    for suffix in {"in", "out", "dlq"} - {missing}:
        create_topic(kafka_bootstrap, f"{unique_topic}-{suffix}", 1)
    produce_values(kafka_bootstrap, f"{unique_topic}-in", [orjson.dumps({"id": i}) for i in range(10)], 1)
    config = connector(tmp_path, unique_topic)
    started = time.monotonic()
    done = subprocess.run(epochline(*(word.format(config=config) for word in command), "--bootstrap-servers",
                                    kafka_bootstrap), capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                          check=False)

    assert done.returncode == 2, done.stderr[-2000:]
    assert time.monotonic() - started < 20
    [line] = [line for line in done.stderr.splitlines() if line.startswith("epochline:")]
    assert f"topic '{unique_topic}-{missing}' does not exist on {kafka_bootstrap}: create it" in line, line
    assert "restarting connector" not in done.stderr


@pytest.mark.parametrize("command", [("run", "{config}"), ("batch", "run", "{config}", "--batch-id", "first")])
def test_sql_that_does_not_parse_stops_a_schemaless_connector_at_start_naming_the_step(
        command: tuple[str, ...], kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    """The source infers its schema from the records, so the query cannot be bound before they come; it is
    still parsed at start, instead of failing on the first records until the run gives up on a "poison
    input"."""
    for suffix in ("in", "out", "dlq"):
        create_topic(kafka_bootstrap, f"{unique_topic}-{suffix}", 1)
    produce_values(kafka_bootstrap, f"{unique_topic}-in", [orjson.dumps({"id": i}) for i in range(10)], 1)
    config = write_config(tmp_path, {**yaml.safe_load(connector(tmp_path, unique_topic).read_text()),
                                     "transform": {"sql": "SELEC 1"}})
    done = subprocess.run(epochline(*(word.format(config=config) for word in command), "--bootstrap-servers",
                                    kafka_bootstrap), capture_output=True, text=True, timeout=60, cwd=REPO_ROOT,
                          check=False)

    assert done.returncode == 2, done.stderr[-2000:]
    [line] = [line for line in done.stderr.splitlines() if line.startswith("epochline:")]
    assert "operator 'step0-sql': query 'SELEC 1' is invalid: Parser Error" in line, line
    assert "cycle failed" not in done.stderr and "poison input" not in done.stderr  # no record was read
    assert read_values(kafka_bootstrap, f"{unique_topic}-out") == []
    assert read_values(kafka_bootstrap, f"{unique_topic}-dlq") == []


def test_a_run_and_a_batch_job_succeed_on_a_broker_started_a_moment_ago(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "fresh-broker")
    state = broker.start(port=free_port())
    try:
        bootstrap = state.bootstrap
        for name in ("fresh-stream", "fresh-batch"):
            for topic in (f"{name}-in", f"{name}-out", f"{name}-dlq"):
                create_topic(bootstrap, topic, 2)
            produce_values(bootstrap, f"{name}-in", [orjson.dumps({"id": i}) for i in range(1_000)], 2)
        stream = subprocess.run(epochline("run", str(connector(tmp_path / "s", "fresh-stream")), "--bootstrap-servers",
                                          bootstrap, "--stop-at-end"), capture_output=True, text=True, timeout=120,
                                cwd=REPO_ROOT, check=False)
        batch = subprocess.run(epochline("batch", "run", str(connector(tmp_path / "b", "fresh-batch")), "--batch-id",
                                         "first", "--bootstrap-servers", bootstrap), capture_output=True, text=True,
                               timeout=120, cwd=REPO_ROOT, check=False)

        assert stream.returncode == 0, stream.stderr[-2000:]
        assert batch.returncode == 0, batch.stderr[-2000:]
        for name in ("fresh-stream", "fresh-batch"):
            assert_exactly_once(bootstrap, f"{name}-out", f"{name}-dlq", range(1_000))
    finally:
        broker.stop()


def test_validate_online_checks_kafka_and_names_what_is_missing_without_touching_data(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    config = connector(tmp_path, unique_topic)
    validate = epochline("validate", str(config), "--online", "--bootstrap-servers", kafka_bootstrap)
    missing = subprocess.run(validate, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, check=False)
    for topic in (f"{unique_topic}-in", f"{unique_topic}-out", f"{unique_topic}-dlq"):
        create_topic(kafka_bootstrap, topic, 1)

    complete = subprocess.run(validate, capture_output=True, text=True, timeout=60, cwd=REPO_ROOT, check=False)

    assert missing.returncode == 2
    assert f"topic '{unique_topic}-in': the topic does not exist" in missing.stderr
    assert f"topic '{unique_topic}-out': the topic does not exist" in missing.stderr
    assert complete.returncode == 0, complete.stderr
    assert "ok (config and Kafka;" in complete.stdout
    assert read_values(kafka_bootstrap, f"{unique_topic}-out") == []
