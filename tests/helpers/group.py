"""Running many instances of one connector as a consumer group against the real broker, for the group tests.

``Instances`` starts, kills and stops named ``epochline run`` processes of one config; ``MemberWatch`` samples
how many members held partitions at once; ``finish_at_end`` lets the group finish the input; the rest reads
what Kafka says (no open transaction, the group's committed offsets).
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from connectors.admin import GroupMissing, describe_group, watermark_offsets
from engine.testing.connectors import Connector, start_connector, write_config

PARTITIONS = 6
RECORDS = 200_000
SQL = {"sql": "SELECT id, amount * 2 AS amount2 FROM input WHERE amount >= 0"}
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "amount": {"type": "number"}},
          "required": ["id", "amount"]}


def order(i: int) -> bytes:
    return orjson.dumps({"id": i, "amount": -1.0 if i % 10 == 0 else float(i % 1000)})


GROUP_PROTOCOLS = pytest.mark.parametrize("protocol", ["classic", "consumer"])
"""Kafka's classic group protocol (epochline's default) and the consumer protocol (KIP-848), which a source
opts into with ``group.protocol: consumer``: the broker assigns partitions and fences by member epoch."""


def protocol_settings(protocol: str, classic: dict[str, str] | None = None) -> dict[str, str]:
    return {"group.protocol": "consumer"} if protocol == "consumer" else dict(classic or {})


def expected_ids(records: int) -> Counter:
    return Counter(i for i in range(records) if i % 10 != 0)


def group_config(tmp_path: Path, name: str, topics: dict[str, str], consumer: dict[str, str] | None = None,
                 transform: list[dict] | None = None, schema: dict | None = None, state_dir: Path | None = None,
                 event_time: dict[str, str] | None = None) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    schema_path = tmp_path / "order.schema.json"
    schema_path.write_bytes(orjson.dumps(schema or SCHEMA))
    return write_config(tmp_path, {
        "name": name,
        "source": {"topic": topics["source"], "format": "json", "schema": str(schema_path),
                   "max_batch_records": 2000, "consumer": consumer or {}, "event_time": event_time or {}},
        "transform": transform or [SQL],
        "sink": {"topic": topics["sink"], "format": "json", "delivery": "exactly-once"},
        "dead_letter": {"topic": topics["dlq"]},
        "checkpoint": {"interval": "500ms", "dir": str(state_dir or tmp_path / "state")},
    })


class Instances:
    """Named ``epochline run`` processes of one config; a restarted name is the same group member.
    ``configs`` may give an instance a config of its own (the same connector with a private state dir)."""

    def __init__(self, config: Path, bootstrap: str, configs: dict[str, Path] | None = None) -> None:
        self.config, self.bootstrap = config, bootstrap
        self.configs = configs or {}
        self.running: dict[str, Connector] = {}
        self.exited: list[Connector] = []

    def start(self, name: str, *, faults: str = "", stop_at_end: bool = False) -> Connector:
        connector = start_connector(self.configs.get(name, self.config), self.bootstrap, faults=faults,
                                    stop_at_end=stop_at_end, log_name=name, extra_args=["--instance", name])
        self.running[name] = connector
        return connector

    def kill(self, name: str) -> None:
        connector = self.running.pop(name)
        connector.kill()
        self.exited.append(connector)

    def stop(self, name: str) -> None:
        """SIGTERM: a final commit, then exit (or die at an injected fault in that commit)."""
        connector = self.running.pop(name)
        connector.process.send_signal(signal.SIGTERM)
        assert connector.wait(60) == 0 or connector.crashed_by_fault(), connector.log_tail()
        self.exited.append(connector)

    def close(self) -> None:
        for name in list(self.running):
            self.kill(name)


class MemberWatch(threading.Thread):
    """Samples the group: the largest number of members that held partitions at the same moment."""

    def __init__(self, bootstrap: str, group: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.group = bootstrap, group
        self.most_members_holding = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(0.5):
            try:
                described = describe_group(self.bootstrap, self.group, timeout=5)
            except GroupMissing:
                continue
            holding = sum(1 for member in described.members if member.partitions)
            self.most_members_holding = max(self.most_members_holding, holding)

    def stop(self) -> int:
        self._halt.set()
        self.join(10)
        return self.most_members_holding


def assert_no_open_transactions(bootstrap: str, topic: str, timeout: float = 30.0) -> None:
    """Every partition's last stable offset reaches its high watermark: no transaction hangs."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    deadline = time.monotonic() + timeout
    while True:
        stable = _offsets(admin, partitions, IsolationLevel.READ_COMMITTED)
        high = _offsets(admin, partitions, IsolationLevel.READ_UNCOMMITTED)
        if stable == high:
            return
        assert time.monotonic() < deadline, f"{topic}: last stable offsets {stable} behind high watermarks {high}"
        time.sleep(0.5)


def _offsets(admin: AdminClient, partitions: list[TopicPartition], isolation: IsolationLevel) -> dict[int, int]:
    futures = admin.list_offsets({tp: OffsetSpec.latest() for tp in partitions}, isolation_level=isolation)
    return {tp.partition: future.result(30).offset for tp, future in futures.items()}


def finish_at_end(instances: Instances, names: list[str]) -> None:
    """Restart every running instance with ``--stop-at-end``; each exits 0 once the group committed it all."""
    for name in list(instances.running):
        instances.stop(name)
    finals = [instances.start(name, stop_at_end=True) for name in names]
    for final in finals:
        assert final.wait(180) == 0, final.log_tail()


def wait_for_group_commit(bootstrap: str, group: str, topic: str, timeout: float) -> None:
    """Until the group's committed offsets reach the topic's ends (read without joining the group)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        ends = watermark_offsets(consumer, topic, list(range(PARTITIONS)), 30)
        deadline = time.monotonic() + timeout
        committed: list[TopicPartition] | str = "nothing yet"
        while True:
            try:
                committed = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
            except KafkaException as error:  # offsets unstable: a crashed member's transaction holds them
                if error.args[0].code() != KafkaError._TIMED_OUT:  # until the broker aborts it (its timeout)
                    raise
            else:
                if all(tp.offset >= ends[tp.partition][1] for tp in committed):
                    return
            assert time.monotonic() < deadline, f"group {group} committed {committed}, ends {ends}"
            time.sleep(0.5)
    finally:
        consumer.close()


def wait_for_log(connector: Connector, text: str, timeout: float = 60.0) -> None:
    """Until ``text`` is in the connector's log (which must not have exited meanwhile)."""
    deadline = time.monotonic() + timeout
    while text not in connector.log_path.read_text(errors="replace"):
        assert connector.process.poll() is None, connector.log_tail()
        assert time.monotonic() < deadline, f"no {text} in {connector.log_path.name}:\n{connector.log_tail()}"
        time.sleep(0.1)
