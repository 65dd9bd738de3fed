"""How to test an epochline pipeline: copy this file next to your connector and change the rows, the
SQL and the expected output.

    pytest examples/

``kafka_bootstrap`` comes with epochline's pytest plugin (installed with the package): the broker in
``KAFKA_BOOTSTRAP`` if set, else a Kafka container with ``--kafka-backend=container`` and Docker, else the
embedded local broker. The pipeline runs as ``epochline run CONFIG --stop-at-end``, exactly as in
production, and the output is read with ``read_committed``: what a downstream consumer would see.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from engine.testing import create_unique_topic, produce_rows, read_topic, read_values, run_pipeline
from schemas import FormatSpec

ORDER_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {"id": {"type": "integer"}, "user": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["id", "user", "amount"],
}


def test_orders_pipeline_keeps_valid_orders_and_doubles_their_amount(kafka_bootstrap: str, tmp_path: Path) -> None:
    orders = create_unique_topic(kafka_bootstrap, "orders")
    cleaned = create_unique_topic(kafka_bootstrap, "orders-clean")
    rejected = create_unique_topic(kafka_bootstrap, "orders-dlq")
    schema = tmp_path / "orders.schema.json"
    schema.write_text(json.dumps(ORDER_SCHEMA))
    config = tmp_path / "orders-clean.yaml"
    config.write_text(yaml.safe_dump({
        "name": orders,  # the connector's name is also its consumer group: unique per test run
        "source": {"topic": orders, "format": "json", "schema": schema.name},
        "transform": {"sql": "SELECT id, amount * 2 AS amount2 FROM input WHERE amount >= 0"},
        "sink": {"topic": cleaned, "format": "json", "delivery": "exactly-once"},
        "dead_letter": {"topic": rejected},
        "checkpoint": {"interval": "1s", "dir": "state"},
    }))
    produce_rows(kafka_bootstrap, orders, [
        {"id": 1, "user": "ada", "amount": 10.0},
        {"id": 2, "user": "bob", "amount": -3.0},
        {"id": 3, "user": "cyd", "amount": 0.5},
    ], FormatSpec(format="json", schema=schema))

    run_pipeline(config, kafka_bootstrap)

    output = read_topic(kafka_bootstrap, cleaned, FormatSpec(format="json"))
    assert sorted(output.to_pylist(), key=lambda row: row["id"]) == [
        {"id": 1, "amount2": 20.0},
        {"id": 3, "amount2": 1.0},
    ]
    assert read_values(kafka_bootstrap, rejected) == []  # every order accounted for: kept, or filtered by the SQL
