"""Exactly once while brokers of a replicated cluster are SIGKILLed and restarted under the connector, as
Kafka's own transactions_test.py bounces them: the broker leading the output partitions in one run, the
transaction coordinator of the connector's transactional.id in another, and the connector itself SIGKILLed
between bounces. Opt-in: ``pytest -m cluster`` (three JVMs, a few minutes)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import orjson
import pytest

from connectors.admin import create_topic
from engine.testing import read_values
from engine.testing.accounting import assert_exactly_once
from engine.testing.cluster import LocalCluster
from engine.testing.connectors import Connector, LiveInput, start_connector, write_config

INSTANCE = ["--instance", "solo"]
"""The connector's instance name, so the test knows its transactional id (and its coordinator)."""

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

RECORDS = 200_000
PARTITIONS = 3
BOUNCES = 3


def order(i: int) -> bytes:
    return orjson.dumps({"id": i, "amount": float(i % 100) - 10})


def victim_of(cluster: LocalCluster, kind: str, sink: str, transactional_id: str) -> int:
    if kind == "output-leader":
        return cluster.leader_of(sink, 0)
    return cluster.transaction_coordinator_of(transactional_id)


def wait_for_partitions(connector: Connector, timeout: float = 60.0) -> None:
    """Until the restarted connector holds partitions again, so the next kill lands while it works."""
    deadline = time.monotonic() + timeout
    while '"partitions assigned"' not in connector.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, connector.log_tail()
        time.sleep(0.2)


@pytest.mark.parametrize("kind", ["output-leader", "transaction-coordinator"])
def test_output_stays_exact_while_brokers_and_the_connector_are_killed(kafka_cluster: LocalCluster, tmp_path: Path,
                                                                       kind: str) -> None:
    name = f"bounce-{kind}-{random.randrange(1 << 30):x}"
    source, sink, dlq = f"{name}-in", f"{name}-out", f"{name}-dlq"
    for topic in (source, sink, dlq):
        create_topic(kafka_cluster.bootstrap, topic, PARTITIONS)
    config = write_config(tmp_path, {
        "name": name,
        "source": {"topic": source, "format": "json"},
        "transform": {"sql": "SELECT id, amount FROM input WHERE amount >= 0"},
        "sink": {"topic": sink, "format": "json"},
        "dead_letter": {"topic": dlq},
        "checkpoint": {"interval": "500ms", "dir": str(tmp_path / "state")},
    })
    stream = LiveInput(kafka_cluster.bootstrap, source, [order(i) for i in range(RECORDS)], PARTITIONS, 60)
    rng = random.Random(kind)
    connector = start_connector(config, kafka_cluster.bootstrap, log_name="run0", extra_args=INSTANCE)
    bounced = []
    for bounce in range(BOUNCES):
        time.sleep(rng.uniform(5, 9))
        node = victim_of(kafka_cluster, kind, sink, f"epochline-{name}-{INSTANCE[1]}")
        assert kafka_cluster.kill(node)
        bounced.append(node)
        time.sleep(rng.uniform(2, 5))
        connector.kill()  # the connector dies too, while the node is down
        connector = start_connector(config, kafka_cluster.bootstrap, log_name=f"run{bounce + 1}",
                                    extra_args=INSTANCE)
        kafka_cluster.start(node)
        wait_for_partitions(connector)  # the group waits out the killed member's session first
    stream.join(180)
    connector.kill()
    final = start_connector(config, kafka_cluster.bootstrap, stop_at_end=True, log_name="final",
                            extra_args=INSTANCE)
    assert final.wait(300) == 0, final.log_tail()

    committed = assert_exactly_once(kafka_cluster.bootstrap, sink, dlq,
                                    (i for i in range(RECORDS) if float(i % 100) - 10 >= 0), timeout=120).output
    uncommitted = read_values(kafka_cluster.bootstrap, sink, isolation="read_uncommitted", timeout=120)
    assert len(uncommitted) > sum(committed.values()), "no aborted epoch was observed: the kills proved nothing"
    assert len(bounced) == BOUNCES
