"""Kafka through testcontainers: the marked tests run against a broker container (`pytest -m container`,
run by .ci/containers.sh), the unmarked ones check how the pytest plugin chooses and reports its broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from engine.testing import create_unique_topic, produce_rows, read_topic, run_pipeline
from schemas import FormatSpec

JSON = FormatSpec(format="json")


@pytest.mark.container
def test_marked_test_is_served_by_a_kafka_container_on_the_host_network(kafka_bootstrap: str) -> None:
    import docker

    client = docker.from_env()
    try:
        brokers = client.containers.list(filters={"label": "org.epochline.role=kafka-test-broker"})
        advertised = {
            variable.split("=", 1)[1]
            for container in brokers
            for variable in container.attrs["Config"]["Env"]
            if variable.startswith("KAFKA_ADVERTISED_LISTENERS=")
        }
        network_modes = {container.attrs["HostConfig"]["NetworkMode"] for container in brokers}
    finally:
        client.close()
    assert f"PLAINTEXT://{kafka_bootstrap}" in advertised
    assert network_modes == {"host"}


@pytest.mark.container
def test_read_committed_sees_committed_transactions_and_never_aborted_ones(kafka_bootstrap: str) -> None:
    topic = create_unique_topic(kafka_bootstrap, "txn-round-trip")
    produce_rows(kafka_bootstrap, topic, [{"id": 1}, {"id": 2}], JSON, transactional=True)
    produce_rows(kafka_bootstrap, topic, [{"id": 3}], JSON, transactional=True, abort=True)
    produce_rows(kafka_bootstrap, topic, [{"id": 4}], JSON, transactional=True)

    committed = read_topic(kafka_bootstrap, topic, JSON)
    everything = read_topic(kafka_bootstrap, topic, JSON, isolation="read_uncommitted")

    assert committed.column("id").to_pylist() == [1, 2, 4]
    assert everything.column("id").to_pylist() == [1, 2, 3, 4]  # the aborted row was written, then filtered


ORDER_SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "amount": {"type": "number"}},
    "required": ["id", "amount"],
}


def write_connector_config(directory: Path, source: str, sink: str, dead_letter: str) -> Path:
    """A connector config in the documented layout, with its schema next to it."""
    (directory / "order.schema.json").write_text(json.dumps(ORDER_SCHEMA))
    config = {
        "name": f"{source}-job",
        "source": {"topic": source, "format": "json", "schema": "order.schema.json"},
        "transform": {"sql": "SELECT id, amount * 2 AS doubled FROM input WHERE amount >= 0"},
        "sink": {"topic": sink, "format": "json", "delivery": "exactly-once"},
        "dead_letter": {"topic": dead_letter},
        "checkpoint": {"interval": "1s", "dir": "state"},
    }
    path = directory / "connector.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.container
def test_epochline_run_through_the_container_commits_each_output_row_once(kafka_bootstrap: str,
                                                                          tmp_path: Path) -> None:
    source = create_unique_topic(kafka_bootstrap, "orders", partitions=2)
    sink = create_unique_topic(kafka_bootstrap, "orders-doubled")
    dead_letter = create_unique_topic(kafka_bootstrap, "orders-dlq")
    orders = [{"id": i, "amount": float(i % 7 - 2)} for i in range(200)]
    produce_rows(kafka_bootstrap, source, orders, JSON)
    produce_rows(kafka_bootstrap, source, [{"id": 999}], JSON)  # no amount: violates the schema

    run_pipeline(write_connector_config(tmp_path, source, sink, dead_letter), kafka_bootstrap)

    output = read_topic(kafka_bootstrap, sink, JSON)
    assert sorted(output.to_pylist(), key=lambda row: row["id"]) == [
        {"id": order["id"], "doubled": order["amount"] * 2} for order in orders if order["amount"] >= 0
    ]
    assert read_topic(kafka_bootstrap, dead_letter, FormatSpec(format="raw")).num_rows == 1


def run_inner_session(directory: Path, test_source: str, **environment: str) -> subprocess.CompletedProcess[str]:
    """Run pytest on one test file in its own directory, so only the plugin (no project config) applies."""
    (directory / "test_inner.py").write_text(textwrap.dedent(test_source))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "test_inner.py", "-p", "no:cacheprovider", "-q"],
        cwd=directory, env={**os.environ, **environment}, capture_output=True, text=True, timeout=120,
    )


MARKED_TEST = """
    import pytest

    @pytest.mark.container
    def test_needs_a_container(kafka_bootstrap):
        raise AssertionError("must not run without a Docker engine")
"""


def test_marked_tests_are_skipped_with_the_reason_when_no_docker_engine_answers(tmp_path: Path) -> None:
    done = run_inner_session(tmp_path, MARKED_TEST, DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")

    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout
    assert "kafka backend: 1 tests marked 'container' SKIPPED: no Docker engine is reachable" in done.stdout


def test_summary_names_the_broker_that_served_the_session(tmp_path: Path) -> None:
    done = run_inner_session(tmp_path, """
        def test_uses_kafka(kafka_bootstrap):
            assert kafka_bootstrap == "127.0.0.1:1"
    """, KAFKA_BOOTSTRAP="127.0.0.1:1")

    assert done.returncode == 0, done.stdout + done.stderr
    assert "kafka backend: KAFKA_BOOTSTRAP at 127.0.0.1:1" in done.stdout
