"""How to test a connector the way it is deployed: on a worker, created over the REST API. Copy this file and
change the config, the rows and the expected output.

    pytest examples/

``start_local_worker`` starts ``epochline worker`` as a process of its own on the test's broker (the one
``kafka_bootstrap`` gives) and returns once its API answers; ``stop`` sends it SIGTERM by its PID, and every
task commits its epoch before the worker exits. The output is read with ``read_committed``, as a downstream
consumer would read it.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from engine.testing import create_unique_topic, produce_rows, read_topic, read_values, start_local_worker
from schemas import FormatSpec

ORDER_SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "user": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["id", "user", "amount"],
}


def test_orders_connector_deployed_on_a_worker_writes_each_valid_order_once(kafka_bootstrap: str,
                                                                           tmp_path: Path) -> None:
    orders = create_unique_topic(kafka_bootstrap, "orders")
    cleaned = create_unique_topic(kafka_bootstrap, "orders-clean")
    rejected = create_unique_topic(kafka_bootstrap, "orders-dlq")
    produce_rows(kafka_bootstrap, orders, [
        {"id": 1, "user": "ada", "amount": 10.0},
        {"id": 2, "user": "bob", "amount": -3.0},
        {"id": 3, "user": "cyd", "amount": 0.5},
    ], FormatSpec(format="json"))
    worker = start_local_worker(tmp_path, kafka_bootstrap, cluster=f"orders-{uuid.uuid4().hex[:8]}", name="w1")
    try:
        with worker.client() as api:
            api.create(orders, {  # the connector's name is also its consumer group: unique per test run
                "source": {"topic": orders, "format": "json", "schema": ORDER_SCHEMA},
                "transform": {"sql": "SELECT id, amount * 2 AS amount2 FROM input WHERE amount >= 0"},
                "sink": {"topic": cleaned, "format": "json", "delivery": "exactly-once"},
                "dead_letter": {"topic": rejected},
            })
            output = wait_for_rows(kafka_bootstrap, cleaned, 2)
            assert api.status(orders)["tasks"][0]["state"] == "RUNNING"
    finally:
        exit_code = worker.stop()  # SIGTERM: each task commits its epoch, then the worker exits
    assert exit_code == 0, worker.log_tail()
    assert sorted(output, key=lambda row: row["id"]) == [{"id": 1, "amount2": 20.0}, {"id": 3, "amount2": 1.0}]
    assert read_values(kafka_bootstrap, rejected) == []  # every order accounted for: kept, or filtered by the SQL


def wait_for_rows(bootstrap: str, topic: str, count: int, timeout_s: float = 60.0) -> list[dict[str, object]]:
    """The topic's committed rows once there are ``count`` of them (a worker's connector runs until stopped)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = read_topic(bootstrap, topic, FormatSpec(format="json")).to_pylist()
        if len(rows) >= count:
            return rows
        assert time.monotonic() < deadline, f"{topic} holds {len(rows)} of {count} rows after {timeout_s:g}s"
        time.sleep(0.5)
