"""connectors.admin: topics made and removed against a real broker."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Producer

from connectors.admin import (
    StoredRecord,
    TopicAdminError,
    create_topic,
    create_topics,
    delete_topics,
    last_committed_records,
    matching_topics,
)
from tests.helpers.worker_process import wait_for


def test_many_topics_are_made_in_one_call_and_an_existing_one_is_left_as_it_is(kafka_bootstrap: str) -> None:
    prefix = f"admin-{uuid.uuid4().hex[:8]}"
    names = [f"{prefix}-a", f"{prefix}-b", f"{prefix}-c"]
    create_topic(kafka_bootstrap, names[0], partitions=2)

    create_topics(kafka_bootstrap, names, partitions=1)

    expected = {names[0]: [0, 1], names[1]: [0], names[2]: [0]}
    wait_for("three topics", lambda: matching_topics(kafka_bootstrap, prefix) == expected, timeout_s=30, every_s=0.2)
    delete_topics(kafka_bootstrap, names)


def test_a_topic_the_broker_refuses_is_named(kafka_bootstrap: str) -> None:
    with pytest.raises(TopicAdminError, match="creating topic 'not a topic!'"):
        create_topics(kafka_bootstrap, ["not a topic!"])


def transaction(bootstrap: str, topic: str, values: list[bytes], *, commit: bool) -> None:
    """``values`` round-robin over partitions 0 and 1 of ``topic`` in one transaction, committed or aborted."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"admin-test-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for index, value in enumerate(values):
        producer.produce(topic, value, partition=index % 2, headers=[("n", str(index).encode())])
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def test_the_last_committed_records_come_newest_first_without_those_of_aborted_transactions(
        kafka_bootstrap: str) -> None:
    topic = f"admin-last-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, partitions=2)
    transaction(kafka_bootstrap, topic, [b"old-%d" % n for n in range(6)], commit=True)
    time.sleep(0.01)  # the second transaction's records are younger by timestamp
    transaction(kafka_bootstrap, topic, [b"new-%d" % n for n in range(2)], commit=True)
    transaction(kafka_bootstrap, topic, [b"aborted"] * 4, commit=False)

    # markers and aborted records take the last offsets: reading further back still finds four records
    def four() -> list[StoredRecord] | None:
        records = last_committed_records(kafka_bootstrap, topic, 4)
        return records if len(records) == 4 else None  # the last markers may take a moment to be stable

    found = wait_for("four committed records", four, 30, 0.2)

    assert sorted(record.value or b"" for record in found[:2]) == [b"new-0", b"new-1"]
    assert all(record.value is not None and record.value.startswith(b"old-") for record in found[2:])
    assert found[0].headers and found[0].headers[0][0] == "n" and found[0].timestamp_ms
    everything = last_committed_records(kafka_bootstrap, topic, 100)
    assert sorted(record.value or b"" for record in everything) == sorted(
        [b"old-%d" % n for n in range(6)] + [b"new-0", b"new-1"])


def test_a_topic_that_does_not_exist_has_no_last_records(kafka_bootstrap: str) -> None:
    assert last_committed_records(kafka_bootstrap, f"admin-none-{uuid.uuid4().hex[:8]}", 5) == []
