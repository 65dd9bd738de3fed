"""``epochline status CONFIG``: a connector's group, members, committed offsets, lag and changelogs, read from
the real broker while the "instances" are plain consumers in the group with the names epochline gives them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from connectors.admin import create_topic
from connectors.offset_metadata import encode
from engine.cli import main
from engine.group_status import instance_of
from engine.testing.connectors import produce_values, write_config
from engine.testing.topics import produce_transactions

pytestmark = pytest.mark.timeout(180)

SOURCE_PARTITIONS = 4
RECORDS_PER_PARTITION = 10
SESSION_TIMEOUT_MS = 6000  # the broker's minimum: static members of a finished test leave the group soon


def status_config(tmp_path: Path, name: str, connect_timeout: str = "10s") -> Path:
    return write_config(tmp_path, {
        "name": name,
        "source": {"topic": f"{name}-in", "format": "raw"},
        "sink": {"topic": f"{name}-out", "format": "raw"},
        "dead_letter": {"topic": f"{name}-dlq"},
        "kafka": {"connect_timeout": connect_timeout},
    })


def epochline_status(capsys: pytest.CaptureFixture[str], config: Path, bootstrap: str,
                     *extra: str) -> tuple[int, str, str]:
    """``epochline status CONFIG --bootstrap-servers B [extra]`` in this process: exit code, stdout, stderr."""
    code = main(["status", str(config), "--bootstrap-servers", bootstrap, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def status_json(capsys: pytest.CaptureFixture[str], config: Path, bootstrap: str) -> dict[str, Any]:
    code, out, err = epochline_status(capsys, config, bootstrap, "--json")
    assert code == 0, err
    report: dict[str, Any] = orjson.loads(out)
    return report


@contextmanager
def instances(bootstrap: str, name: str, topic: str, names: list[str]) -> Iterator[dict[str, Consumer]]:
    """One consumer per instance, subscribed to ``topic`` in the connector's group with epochline's client id
    and group instance id; yielded once every one of them holds partitions and all partitions are held."""
    consumers = {}
    try:
        for instance in names:
            client_id = f"{name}-{instance}-source"
            consumers[instance] = Consumer({
                "bootstrap.servers": bootstrap, "group.id": f"epochline-{name}", "client.id": client_id,
                "group.instance.id": client_id, "enable.auto.commit": False,
                "session.timeout.ms": SESSION_TIMEOUT_MS, "log_level": 0,
            })
            consumers[instance].subscribe([topic])
        wait_for_assignments(list(consumers.values()), SOURCE_PARTITIONS)
        yield consumers
    finally:
        for consumer in consumers.values():
            consumer.close()


def wait_for_assignments(consumers: list[Consumer], partitions: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for consumer in consumers:
            consumer.poll(0.2)
        held = [consumer.assignment() for consumer in consumers]
        if all(held) and sum(len(assigned) for assigned in held) == partitions:
            return
    raise AssertionError(f"the group did not settle within {timeout}s: {held}")


def commit(consumer: Consumer, offsets: dict[int, int], topic: str, metadata: str) -> None:
    consumer.commit(offsets=[TopicPartition(topic, partition, offset, metadata=metadata)
                             for partition, offset in offsets.items()], asynchronous=False)


def commit_in_transaction(bootstrap: str, consumer: Consumer, topic: str, offsets: dict[int, int],
                          metadata: str) -> None:
    """As an epoch commits: the offsets in a transaction carrying the member's group metadata; then wait
    until the group's committed offsets are stable (the commit markers are written after the call returns)."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-status-test",
                         "log_level": 0})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition(topic, p, o, metadata=metadata) for p, o in offsets.items()],
                                         consumer.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    consumer.committed([TopicPartition(topic, partition) for partition in offsets], timeout=30)


def produce_keyed(bootstrap: str, topic: str, per_partition: dict[int, int]) -> None:
    """State records as a changelog holds them: keyed (a compacted topic refuses records without a key)."""
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
    for partition, count in per_partition.items():
        for index in range(count):
            producer.produce(topic, key=b"state", value=b"snapshot-%d" % index, partition=partition)
    assert producer.flush(30) == 0


def held_by(consumers: dict[str, Consumer]) -> dict[int, str]:
    return {tp.partition: instance for instance, consumer in consumers.items() for tp in consumer.assignment()}


def test_status_shows_members_committed_offsets_lag_checkpoints_and_changelogs(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = unique_topic
    source, repartition = f"{name}-in", f"{name}-repartition"
    changelog = f"{name}-step0-window-changelog"
    create_topic(kafka_bootstrap, source, SOURCE_PARTITIONS)
    produce_values(kafka_bootstrap, source, [b"%d" % i for i in range(SOURCE_PARTITIONS * RECORDS_PER_PARTITION)],
                   SOURCE_PARTITIONS)
    create_topic(kafka_bootstrap, repartition, 2)
    produce_transactions(kafka_bootstrap, repartition, [([b"r0", b"r1", b"r2", b"r3"], True)], partitions=2)
    create_topic(kafka_bootstrap, changelog, 2, config={"cleanup.policy": "compact"})
    produce_keyed(kafka_bootstrap, changelog, {0: 3, 1: 2})
    create_topic(kafka_bootstrap, f"{name}-x-step0-window-changelog", 1)  # connector "<name>-x"'s, not ours
    config = status_config(tmp_path, name)
    a_metadata = encode({"checkpoint": 7, "instance": "a", "event_time": 1_700_000_000_000, "dead_letters": 2})

    with instances(kafka_bootstrap, name, source, ["a", "b"]) as consumers:
        owners = held_by(consumers)
        a_parts = sorted(p for p, owner in owners.items() if owner == "a")
        b_parts = sorted(p for p, owner in owners.items() if owner == "b")
        commit(consumers["a"], {p: 3 + p for p in a_parts}, source, a_metadata)
        commit(consumers["b"], {b_parts[0]: 5}, source, "epochline:checkpoint=6")  # an older commit: no instance
        commit_in_transaction(kafka_bootstrap, consumers["b"], repartition, {0: 2},
                              encode({"checkpoint": 8, "instance": "b"}))
        report = status_json(capsys, config, kafka_bootstrap)
        code, human, _ = epochline_status(capsys, config, kafka_bootstrap)

    assert (report["group_id"], report["state"], report["exists"]) == (f"epochline-{name}", "STABLE", True)
    assert (report["source_topic"], report["repartition_topic"]) == (source, repartition)
    members = {member["instance"]: member for member in report["members"]}
    assert set(members) == {"a", "b"}
    for instance, parts in (("a", a_parts), ("b", b_parts)):
        member = members[instance]
        assert member["source"] == "source"
        assert member["client_id"] == member["group_instance_id"] == f"{name}-{instance}-source"
        assert member["host"] and member["member_id"]
        assert member["partitions"] == [{"topic": source, "partition": p} for p in parts]

    rows = {(row["topic"], row["partition"]): row for row in report["partitions"]}
    assert set(rows) == {(source, p) for p in range(SOURCE_PARTITIONS)} | {(repartition, 0), (repartition, 1)}
    for p in a_parts:
        assert rows[source, p] == {
            "topic": source, "role": "source", "partition": p, "committed": 3 + p, "end": RECORDS_PER_PARTITION,
            "lag": RECORDS_PER_PARTITION - 3 - p, "checkpoint": 7, "instance": "a", "event_time": 1_700_000_000_000,
            "committed_at": None, "metadata": a_metadata, "held_by": "a", "dead_letters": 2}
    old = rows[source, b_parts[0]]
    assert (old["committed"], old["lag"], old["checkpoint"], old["instance"], old["event_time"], old["held_by"]) \
        == (5, RECORDS_PER_PARTITION - 5, 6, None, None, "b")
    never = rows[source, b_parts[1]]
    assert (never["committed"], never["lag"], never["checkpoint"], never["instance"], never["held_by"]) \
        == (None, None, None, None, "b")
    # Two records and a commit marker on each repartition partition: the marker counts towards the lag.
    assert (rows[repartition, 0]["committed"], rows[repartition, 0]["end"], rows[repartition, 0]["lag"]) == (2, 3, 1)
    assert (rows[repartition, 0]["checkpoint"], rows[repartition, 0]["instance"]) == (8, "b")
    assert rows[repartition, 0]["role"] == "repartition" and rows[repartition, 0]["held_by"] is None
    assert (rows[repartition, 1]["committed"], rows[repartition, 1]["end"]) == (None, 3)

    assert report["changelogs"] == [{"topic": changelog, "operator": "step0-window", "partitions": 2, "records": 5}]
    assert code == 0
    assert "STABLE" in human and "members" in human and "input partitions" in human and "keyed state" in human


def test_a_group_nobody_joined_has_no_members_and_no_committed_offsets(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = unique_topic
    create_topic(kafka_bootstrap, f"{name}-in", 2)
    produce_values(kafka_bootstrap, f"{name}-in", [b"1", b"2", b"3"], 2)
    report = status_json(capsys, status_config(tmp_path, name), kafka_bootstrap)

    assert (report["exists"], report["state"], report["members"]) == (False, "DEAD", [])
    assert report["repartition_topic"] is None and report["changelogs"] == []
    assert [(row["partition"], row["committed"], row["end"], row["lag"], row["checkpoint"])
            for row in report["partitions"]] == [(0, None, 2, None, None), (1, None, 1, None, None)]
    code, human, _ = epochline_status(capsys, status_config(tmp_path, name), kafka_bootstrap)
    assert code == 0 and "does not exist yet" in human


def test_an_unreachable_broker_exits_2_within_the_connect_timeout_naming_the_address(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = status_config(tmp_path, "status-unreachable", connect_timeout="2s")
    started = time.monotonic()
    code, out, err = epochline_status(capsys, config, "127.0.0.1:1", "--json")
    assert code == 2 and out == ""
    assert time.monotonic() - started < 10
    [line] = [line for line in err.splitlines() if line.startswith("epochline: ")]  # librdkafka's log lines aside
    assert "cannot reach Kafka at 127.0.0.1:1" in line


def test_a_missing_config_exits_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = epochline_status(capsys, tmp_path / "nowhere.yaml", "127.0.0.1:1")
    assert code == 2 and out == ""
    [line] = err.strip().splitlines()
    assert "nowhere.yaml" in line


def test_the_instance_and_input_come_from_the_client_id() -> None:
    assert instance_of("orders", "orders-host-1-source") == ("host-1", "source")
    assert instance_of("orders", "orders-b-repartition") == ("b", "repartition")
    assert instance_of("orders", "orders-source") == (None, None)
    assert instance_of("orders", "console-consumer-1") == (None, None)


def test_piped_the_tables_print_every_name_in_full_whatever_their_width(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A script reading ``epochline status | grep`` must find the topic it greps for, not ``paymen…``."""
    name = f"{unique_topic}-{'long-name-' * 8}"
    create_topic(kafka_bootstrap, f"{name}-in", 1)
    config = status_config(tmp_path, name)

    code, out, _ = epochline_status(capsys, config, kafka_bootstrap)

    assert code == 0
    assert "…" not in out
    [row] = [line for line in out.splitlines() if f"{name}-in" in line]
    assert len(row.rstrip()) > len(name) + 20 > 100  # the row is as wide as it needs, past 80 columns


def test_a_missing_source_topic_is_one_sentence_naming_it_the_broker_and_what_to_do(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = epochline_status(capsys, status_config(tmp_path, unique_topic), kafka_bootstrap)

    assert code == 2 and out == ""
    assert "KafkaError{" not in err
    assert err.strip() == (f"epochline: {tmp_path / unique_topic}.yaml: topic '{unique_topic}-in' does not exist on "
                           f"{kafka_bootstrap}: create it (kafka-topics.sh --create, or epochline run "
                           "--create-topics), or correct the topic name")
