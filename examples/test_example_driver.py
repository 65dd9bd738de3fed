"""How to unit-test a connector's transform without Kafka: copy this file next to your connector.

    pytest examples/test_example_driver.py

``TransformTestDriver`` runs the connector's own pipeline (decode, late rows, SQL/Python/window steps,
encode, checkpoints) over an in-memory topic and sink, so each test takes milliseconds. What it checks
holds on a broker too; keep one broker test (see test_example_pipeline.py) for the wiring.
"""

from __future__ import annotations

from pathlib import Path

from engine.testing import TransformTestDriver

CONNECTOR = Path(__file__).parent / "orders-clean.yaml"


def test_valid_orders_are_doubled_and_negative_ones_dropped() -> None:
    with TransformTestDriver(CONNECTOR) as driver:
        driver.send([{"id": 1, "user": "ada", "amount": 10.0, "ts": "2026-01-01T00:00:00Z"},
                     {"id": 2, "user": "bob", "amount": -3.0, "ts": "2026-01-01T00:00:01Z"}])

        assert driver.output_rows() == [{"id": 1, "amount2": 20.0}]


def test_a_malformed_order_lands_in_the_dead_letter_topic_with_the_reason() -> None:
    with TransformTestDriver(CONNECTOR) as driver:
        driver.send_raw([b'{"id": 3, "user": "cyd"}'])

        [letter] = driver.dead_letters()
        reason = dict(letter.headers)["epochline.reason"]
        assert letter.value == b'{"id": 3, "user": "cyd"}' and b"amount" in reason
        assert driver.output() == []
