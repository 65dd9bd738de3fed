"""A connector on an authenticated Kafka (SASL/SCRAM, ACLs enforced): it runs exactly once with exactly the
permissions it needs, and without one of them, or with a wrong password, it fails at once and clearly,
commits nothing, and never prints the password. Opt-in: ``pytest -m auth`` (a SCRAM broker is a JVM)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from connectors.admin import create_topic
from engine.testing import produce_transactions, read_values
from engine.testing.accounting import assert_exactly_once
from engine.testing.auth import ClientAuth, ScramKafka
from engine.testing.connectors import write_config
from tests.helpers import REPO_ROOT

pytestmark = [pytest.mark.auth, pytest.mark.timeout(300)]

RECORDS = 5_000
PASSWORD_VARIABLE = "EPOCHLINE_TEST_SASL_PASSWORD"


def topics_with_input(kafka_scram: ScramKafka) -> str:
    name = f"auth-{uuid.uuid4().hex[:8]}"
    admin = kafka_scram.admin.settings
    for topic in (f"{name}-in", f"{name}-out", f"{name}-dlq"):
        create_topic(kafka_scram.bootstrap, topic, 2, client_config=admin)
    values = [orjson.dumps({"id": i, "amount": float(i % 50) - 5}) for i in range(RECORDS)]
    produce_transactions(kafka_scram.bootstrap, f"{name}-in", [(values, True)], partitions=2, client_config=admin)
    return name


INSTANCE = "host-1"
"""The instance the tests run: its transactional id is ``epochline-<name>-host-1``, the one granted."""


def principal(kafka_scram: ScramKafka, name: str, *, write_sink: bool = True) -> ClientAuth:
    """Exactly what connector ``name`` needs (or all of it but WRITE on its sink topic)."""
    return kafka_scram.create_principal(
        f"{name}-user", read_topics=[f"{name}-in"],
        write_topics=[f"{name}-out", f"{name}-dlq"] if write_sink else [f"{name}-dlq"],
        groups=[f"epochline-{name}"], transactional_ids=[f"epochline-{name}-{INSTANCE}"])


def connector_config(tmp_path: Path, name: str, user: ClientAuth) -> Path:
    return write_config(tmp_path, {
        "name": name,
        "source": {"topic": f"{name}-in", "format": "json"},
        "transform": {"sql": "SELECT id, amount FROM input WHERE amount >= 0"},
        "sink": {"topic": f"{name}-out", "format": "json"},
        "dead_letter": {"topic": f"{name}-dlq"},
        "checkpoint": {"interval": "300ms", "dir": str(tmp_path / "state")},
        "kafka": {"connect_timeout": "10s", "client": {
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": user.mechanism,
            "sasl.username": user.username, "sasl.password": f"${{env:{PASSWORD_VARIABLE}}}"}},
    })


def run(config: Path, bootstrap: str, password: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "engine.cli", "run", str(config), "--bootstrap-servers", bootstrap,
               "--stop-at-end", "--instance", INSTANCE]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, cwd=REPO_ROOT, check=False,
                          env={**os.environ, PASSWORD_VARIABLE: password})


def committed_offsets(kafka_scram: ScramKafka, name: str) -> list[int]:
    consumer = Consumer({**kafka_scram.admin_config, "group.id": f"epochline-{name}"})
    try:
        answered = consumer.committed([TopicPartition(f"{name}-in", p) for p in range(2)], timeout=30)
    finally:
        consumer.close()
    return [tp.offset for tp in answered if tp.offset >= 0]


def test_a_least_privilege_principal_runs_the_connector_exactly_once(kafka_scram: ScramKafka,
                                                                      tmp_path: Path) -> None:
    name = topics_with_input(kafka_scram)
    user = principal(kafka_scram, name)

    done = run(connector_config(tmp_path, name, user), kafka_scram.bootstrap, user.password)

    assert done.returncode == 0, done.stderr[-3000:]
    assert_exactly_once(kafka_scram.bootstrap, f"{name}-out", f"{name}-dlq",
                        (i for i in range(RECORDS) if float(i % 50) - 5 >= 0), client_config=kafka_scram.admin.settings)
    assert user.password not in done.stdout + done.stderr


def test_without_write_on_the_sink_topic_it_fails_at_once_naming_topic_and_operation(
        kafka_scram: ScramKafka, tmp_path: Path) -> None:
    name = topics_with_input(kafka_scram)
    user = principal(kafka_scram, name, write_sink=False)
    started = time.monotonic()

    done = run(connector_config(tmp_path, name, user), kafka_scram.bootstrap, user.password)

    assert done.returncode == 2
    assert time.monotonic() - started < 60
    [line] = [line for line in done.stderr.splitlines() if line.startswith("epochline:")]
    assert f"topic '{name}-out'" in line and "not authorized" in line and "WRITE" in line, line
    assert "restarting connector" not in done.stderr
    assert read_values(kafka_scram.bootstrap, f"{name}-out", client_config=kafka_scram.admin.settings) == []
    assert committed_offsets(kafka_scram, name) == []
    assert user.password not in done.stdout + done.stderr


def test_a_wrong_password_fails_at_once_naming_authentication(kafka_scram: ScramKafka, tmp_path: Path) -> None:
    name = topics_with_input(kafka_scram)
    user = principal(kafka_scram, name)
    wrong = f"not-{user.password}"
    started = time.monotonic()

    done = run(connector_config(tmp_path, name, user), kafka_scram.bootstrap, wrong)

    assert done.returncode == 2
    assert time.monotonic() - started < 30
    [line] = [line for line in done.stderr.splitlines() if line.startswith("epochline:")]
    assert f"Kafka at {kafka_scram.bootstrap}: authentication failed" in line, line
    assert wrong not in done.stdout + done.stderr and user.password not in done.stdout + done.stderr
