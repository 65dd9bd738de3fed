"""Reading a topic in a test: every committed record, even one committed a moment ago; never an open one."""

from __future__ import annotations

import time

from confluent_kafka import Producer

from connectors.admin import create_topic
from engine.testing import read_values
from engine.testing.topics import MARKER_GRACE_S


def transactional_producer(bootstrap: str, topic: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}", "linger.ms": 0})
    producer.init_transactions(30)
    return producer


def commit(producer: Producer, topic: str, values: list[bytes]) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value)
    producer.commit_transaction(30)


def test_a_read_right_after_a_commit_returns_the_records_it_committed(kafka_bootstrap: str, unique_topic: str) -> None:
    """The commit's markers are written after ``commit_transaction`` returns; the read waits for them."""
    create_topic(kafka_bootstrap, unique_topic, 3)
    producer = transactional_producer(kafka_bootstrap, unique_topic)
    expected: list[bytes] = []
    for epoch in range(15):
        values = [f"{epoch}-{n}".encode() for n in range(3)]
        commit(producer, unique_topic, values)
        expected += values

        assert sorted(v for v in read_values(kafka_bootstrap, unique_topic) if v is not None) == sorted(expected)


def test_an_open_transaction_is_not_waited_for_beyond_the_grace(kafka_bootstrap: str, unique_topic: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, 1)
    producer = transactional_producer(kafka_bootstrap, unique_topic)
    commit(producer, unique_topic, [b"committed"])
    producer.begin_transaction()
    producer.produce(unique_topic, b"open")
    producer.flush(30)

    started = time.monotonic()
    read = read_values(kafka_bootstrap, unique_topic)
    waited = time.monotonic() - started
    producer.abort_transaction(30)

    assert read == [b"committed"]
    assert MARKER_GRACE_S <= waited < MARKER_GRACE_S + 5
