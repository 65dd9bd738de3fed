"""The local broker is a real Kafka: it filters aborted transactions and is started/stopped by PID."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, Producer

from connectors.admin import create_topic, matching_topics
from engine.testing import read_values
from engine.testing.connectors import produce_values, start_connector
from engine.testing.local_broker import (
    BrokerAlreadyRunning,
    BrokerError,
    LocalBroker,
    PortInUse,
    ToolMissing,
    fetch_kafka_jars,
    free_port,
    kafka_classpath,
)
from tests.helpers import EXAMPLES, REPO_ROOT
from tests.helpers.worker_process import wait_for


def _read_all(bootstrap: str, topic: str, isolation: str, expected_at_least: int) -> list[bytes]:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"reader-{topic}-{isolation}",
        "auto.offset.reset": "earliest", "isolation.level": isolation, "enable.auto.commit": False,
    })
    consumer.subscribe([topic])
    values: list[bytes] = []
    idle_polls = 0
    try:
        while idle_polls < 10 or (len(values) < expected_at_least and idle_polls < 60):
            message = consumer.poll(0.5)
            if message is None or message.error():
                idle_polls += 1
                continue
            values.append(message.value())
    finally:
        consumer.close()
    return values


def test_read_committed_sees_only_committed_transactions(kafka_bootstrap: str, unique_topic: str) -> None:
    create_topic(kafka_bootstrap, unique_topic)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{unique_topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(unique_topic, b"committed")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(unique_topic, b"aborted")
    producer.flush(30)
    producer.abort_transaction(30)

    assert _read_all(kafka_bootstrap, unique_topic, "read_committed", 1) == [b"committed"]
    assert sorted(_read_all(kafka_bootstrap, unique_topic, "read_uncommitted", 2)) == [b"aborted", b"committed"]


def _process_exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_start_then_stop_leaves_no_process(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "broker")
    state = broker.start(port=free_port())
    try:
        assert _process_exists(state.pid)
        assert broker.state() == state
    finally:
        assert broker.stop()
    assert not _process_exists(state.pid)
    assert broker.state() is None


def test_second_start_on_same_data_dir_says_already_running(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "broker")
    broker.start(port=free_port())
    try:
        with pytest.raises(BrokerAlreadyRunning, match="already running"):
            broker.start(port=free_port())
    finally:
        broker.stop()


def test_start_on_a_taken_port_names_the_port(tmp_path: Path, kafka_bootstrap: str) -> None:
    taken = int(kafka_bootstrap.rsplit(":", 1)[1])
    with pytest.raises(PortInUse, match=f"port {taken}"):
        LocalBroker(tmp_path / "broker").start(port=taken)


def test_a_restart_asked_for_its_old_controller_port_as_client_port_takes_another_controller_port(
        tmp_path: Path) -> None:
    """A restarted broker keeps its controller port unless the client port asked for is that port: two
    listeners on one port and Kafka refuses to start."""
    broker = LocalBroker(tmp_path)
    old_controller = free_port()
    broker.config_file.write_text(f"controller.quorum.voters=1@127.0.0.1:{old_controller}\n")

    assert broker._previous_controller_port(besides={old_controller + 1}) == old_controller
    assert broker._previous_controller_port(besides={old_controller}) is None


def test_stop_without_a_broker_reports_nothing_running(tmp_path: Path) -> None:
    assert LocalBroker(tmp_path / "none").stop() is False
    assert os.path.exists(tmp_path)


def test_missing_java_is_named_with_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolMissing, match="'java' was not found.*apt-get install"):
        LocalBroker(tmp_path / "broker").start(port=free_port())


def test_missing_maven_is_named_when_the_jars_are_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("EPOCHLINE_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("KAFKA_HOME", raising=False)
    with pytest.raises(ToolMissing, match="'mvn' was not found"):
        fetch_kafka_jars()


def test_kafka_home_without_kafka_jars_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_HOME", str(tmp_path))
    with pytest.raises(BrokerError, match="KAFKA_HOME"):
        kafka_classpath()


def readme_first_connector() -> str:
    """The first YAML block of the README: the connector a reader tries first."""
    readme = (REPO_ROOT / "README.md").read_text()
    return readme.split("```yaml\n", 1)[1].split("```", 1)[0]


def epochline(*args: str) -> list[str]:
    return [sys.executable, "-m", "engine.cli", *args]


@pytest.mark.timeout(300)
def test_the_readme_s_first_connector_runs_as_written_on_the_broker_epochline_starts(tmp_path: Path) -> None:
    """Its steps: ``broker start``, ``validate``, ``run --create-topics`` (the broker creates no topic on demand,
    so the flag makes the source, sink and dead-letter topics), Ctrl-C, ``broker stop``. Only the metrics port
    is moved to a free one: 9108 may be taken on a shared machine."""
    config = tmp_path / "orders-windowed.yaml"
    config.write_text(readme_first_connector().replace("metrics_port: 9108", f"metrics_port: {free_port()}"))
    shutil.copy(EXAMPLES / "orders.schema.json", tmp_path)
    data_dir, port = tmp_path / "broker", free_port()
    bootstrap = f"127.0.0.1:{port}"
    started = subprocess.run(epochline("broker", "start", "--port", str(port), "--data-dir", str(data_dir)),
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        assert started.stdout.strip() == bootstrap
        validated = subprocess.run(epochline("validate", str(config)), cwd=REPO_ROOT, capture_output=True,
                                   text=True, timeout=60)
        assert validated.returncode == 0, validated.stderr
        run = start_connector(config, bootstrap, command=("--log-format", "text", "run"),
                              extra_args=("--create-topics",))
        try:
            wait_for("the source topic", lambda: "orders" in matching_topics(bootstrap, "orders"), timeout_s=60,
                     every_s=0.5)
            orders = [orjson.dumps({"id": i, "user": f"u{i % 3}", "amount": i - 5, "ts": f"2026-01-01T00:00:{i:02}Z"})
                      for i in range(40)]
            produce_values(bootstrap, "orders", [*orders, b"not an order"], 1)
            wait_for("the malformed record dead-lettered", lambda: len(read_values(bootstrap, "orders-dlq")) == 1,
                     timeout_s=60, every_s=1.0)
            time.sleep(2)  # a checkpoint interval (1 s) past the last record
            run.process.send_signal(signal.SIGINT)
            assert run.wait(60) == 0, run.log_tail()
        finally:
            run.kill()
        windows = read_values(bootstrap, "orders-clean")
    finally:
        stopped = subprocess.run(epochline("broker", "stop", "--data-dir", str(data_dir)), cwd=REPO_ROOT,
                                 capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stderr

    assert windows, "no window closed"  # 40 s of event time: the first windows of 10 s closed
    last = run.log_path.read_text().strip().splitlines()[-1]
    assert last.startswith(f"stopped: 41 records in, {len(windows)} out, 1 dead-lettered, "), last
