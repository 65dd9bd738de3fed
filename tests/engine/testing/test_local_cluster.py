"""The local 3-node cluster: real replication, one node killed and restarted by its recorded PID.

Tests marked ``cluster`` start JVMs (``pytest -m cluster``); the unmarked ones check layouts, settings and
the CLI's refusals without starting anything."""

from __future__ import annotations

import logging
import re
import socket
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from engine import ports
from engine.cli import main
from engine.testing.cluster import (
    ClusterLayout,
    ClusterNotFound,
    LocalCluster,
    NodePorts,
    UnknownNode,
    _fresh_ports,
    cluster_settings,
    coordinator_partition,
    java_string_hash,
)
from engine.testing.local_broker import LayoutMismatch, PortInUse, server_settings
from tests.helpers.processes import kernel_offering

COMMIT_TIMEOUT = 60.0


def _create_topic(config: dict[str, str], prefix: str, partitions: int = 1) -> str:
    """A topic with the cluster's default replication (3), so the test sees what a new topic gets."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(config)
    admin.create_topics([NewTopic(topic, partitions)], operation_timeout=30)[topic].result(30)
    return topic


def _commit(producer: Producer, topic: str, values: list[bytes]) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value)
    producer.commit_transaction(COMMIT_TIMEOUT)


def _read_committed(config: dict[str, str], topic: str, expected: int) -> list[bytes]:
    consumer = Consumer({**config, "group.id": f"reader-{uuid.uuid4().hex}", "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                values.append(message.value())
        idle_until = time.monotonic() + 3  # anything beyond the expected count shows up here
        while time.monotonic() < idle_until:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                values.append(message.value())
    finally:
        consumer.close()
    return values


def _wait_until_down(cluster: LocalCluster, topic: str, node: int) -> None:
    """The controller fences a killed node after its session timeout; until then it is still listed."""
    deadline = time.monotonic() + 60
    while node in cluster.in_sync_replicas(topic) and time.monotonic() < deadline:
        time.sleep(0.5)


@pytest.mark.cluster
def test_the_cluster_starts_three_running_nodes_and_status_lists_each(kafka_cluster: LocalCluster,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    statuses = kafka_cluster.status()
    assert [status.node_id for status in statuses] == [1, 2, 3]
    assert all(status.running and Path(f"/proc/{status.pid}").exists() for status in statuses)
    assert len({status.pid for status in statuses}) == 3

    assert main(["broker", "status", "--data-dir", str(kafka_cluster.data_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"node {s.node_id}: running pid={s.pid} port={s.port}" for s in statuses] + [
        f"bootstrap={kafka_cluster.bootstrap}"]

    brokers = AdminClient(kafka_cluster.client_config()).list_topics(timeout=10).brokers
    assert sorted(brokers) == [1, 2, 3]


@pytest.mark.cluster
def test_new_and_internal_topics_get_three_replicas(kafka_cluster: LocalCluster) -> None:
    topic = _create_topic(kafka_cluster.client_config(), "replicated")
    admin = AdminClient(kafka_cluster.client_config())
    metadata = admin.list_topics(timeout=10)

    assert sorted(metadata.topics[topic].partitions[0].replicas) == [1, 2, 3]
    assert all(len(partition.replicas) == 3
               for partition in metadata.topics["__transaction_state"].partitions.values())


@pytest.mark.cluster
def test_a_replicated_topic_keeps_taking_transactions_while_its_leader_is_down_and_the_node_rejoins(
        kafka_cluster: LocalCluster) -> None:
    config = kafka_cluster.client_config()
    topic = _create_topic(config, "survives")
    producer = Producer({**config, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(COMMIT_TIMEOUT)
    _commit(producer, topic, [b"before"])
    victim = kafka_cluster.leader_of(topic)

    assert kafka_cluster.kill(victim)
    for round_ in range(3):
        _commit(producer, topic, [f"down-{round_}".encode()])
    _wait_until_down(kafka_cluster, topic, victim)
    assert kafka_cluster.in_sync_replicas(topic) == sorted({1, 2, 3} - {victim})  # 2 >= min.insync.replicas
    assert kafka_cluster.leader_of(topic) != victim
    assert not next(status for status in kafka_cluster.status() if status.node_id == victim).running
    _commit(producer, topic, [b"still-down"])

    kafka_cluster.start(victim)
    assert kafka_cluster.wait_until_in_sync(topic) == [1, 2, 3]
    _commit(producer, topic, [b"after"])

    expected = [b"before", b"down-0", b"down-1", b"down-2", b"still-down", b"after"]
    assert _read_committed(config, topic, len(expected)) == expected


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _coordinator_librdkafka_found(config: dict[str, str], transactional_id: str) -> tuple[Producer, int]:
    """A transactional producer and the coordinator its FindCoordinator answer named (librdkafka's debug
    log is the only place the client tells it)."""
    handler = _Lines()
    logger = logging.getLogger(f"librdkafka-eos-{transactional_id}")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    producer = Producer({**config, "transactional.id": transactional_id, "debug": "eos", "logger": logger})
    producer.init_transactions(COMMIT_TIMEOUT)
    producer.poll(0)
    found = [int(match.group(1)) for line in handler.lines
             if (match := re.search(r"Transaction coordinator is broker (\d+)", line))]
    assert found, handler.lines
    return producer, found[-1]


@pytest.mark.cluster
def test_the_transaction_coordinator_is_found_and_a_transaction_survives_its_loss(
        kafka_cluster: LocalCluster) -> None:
    config = kafka_cluster.client_config()
    topic = _create_topic(config, "coordinator")
    transactional_id = f"tx-{topic}"
    producer, coordinator = _coordinator_librdkafka_found(config, transactional_id)
    assert kafka_cluster.transaction_coordinator_of(transactional_id) == coordinator

    producer.begin_transaction()
    producer.produce(topic, b"open-when-the-coordinator-died")
    producer.flush(30)
    kafka_cluster.kill(coordinator)
    producer.commit_transaction(COMMIT_TIMEOUT)

    assert kafka_cluster.transaction_coordinator_of(transactional_id) != coordinator
    assert _read_committed(config, topic, 1) == [b"open-when-the-coordinator-died"]


@pytest.mark.cluster
def test_the_cli_kills_one_node_by_its_pid_and_restarts_it_with_its_data(kafka_cluster: LocalCluster,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = str(kafka_cluster.data_dir)
    pid = next(status.pid for status in kafka_cluster.status() if status.node_id == 2)
    config = kafka_cluster.client_config()
    topic = _create_topic(config, "cli-restart")

    assert main(["broker", "kill", "2", "--data-dir", data_dir]) == 0
    assert f"killed node 2 (pid {pid})" in capsys.readouterr().out
    assert not Path(f"/proc/{pid}").exists()
    assert main(["broker", "status", "--data-dir", data_dir]) == 1
    assert "node 2: not running pid=-" in capsys.readouterr().out

    assert main(["broker", "start", "--node", "2", "--data-dir", data_dir]) == 0
    port = next(status.port for status in kafka_cluster.status() if status.node_id == 2)
    assert capsys.readouterr().out.strip() == f"127.0.0.1:{port}"
    assert main(["broker", "status", "--data-dir", data_dir]) == 0
    assert kafka_cluster.wait_until_in_sync(topic) == [1, 2, 3]  # its replica of the new topic caught up


@pytest.mark.cluster
def test_the_cli_starts_a_three_node_cluster_and_stop_leaves_no_process(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = str(tmp_path / "cluster")
    pids: list[int | None] = []
    try:
        assert main(["broker", "start", "--nodes", "3", "--data-dir", data_dir]) == 0
        cluster = LocalCluster(data_dir)
        assert capsys.readouterr().out.strip() == cluster.bootstrap
        pids = [status.pid for status in cluster.status()]
        assert all(pid is not None and Path(f"/proc/{pid}").exists() for pid in pids)
    finally:
        assert main(["broker", "stop", "--data-dir", data_dir]) == 0
    assert capsys.readouterr().out.strip() == "stopped nodes 1, 2, 3"
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert main(["broker", "status", "--data-dir", data_dir]) == 3


def _layout(nodes: int = 3) -> ClusterLayout:
    return ClusterLayout("id", {node: NodePorts(9000 + node, 9100 + node) for node in range(1, nodes + 1)})


def test_cluster_nodes_replicate_internal_and_new_topics_three_times_with_two_in_sync(tmp_path: Path) -> None:
    settings = cluster_settings(tmp_path / "node-2", 2, _layout(), None)

    assert settings["node.id"] == "2"
    assert settings["controller.quorum.voters"] == "1@127.0.0.1:9101,2@127.0.0.1:9102,3@127.0.0.1:9103"
    assert settings["listeners"] == "PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9102"
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor"):
        assert settings[key] == "3", key
    assert settings["min.insync.replicas"] == settings["transaction.state.log.min.isr"] == "2"


def test_a_cluster_given_a_port_numbers_its_nodes_from_it() -> None:
    pairs = _fresh_ports(3, 29092)

    assert [pair.port for pair in pairs] == [29092, 29093, 29094]
    assert len({pair.controller_port for pair in pairs} | {29092, 29093, 29094}) == 6


def test_no_controller_gets_the_client_port_of_a_later_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """Free now is not enough: 29093 is free until node 2 binds it."""
    monkeypatch.setattr(ports, "socket", kernel_offering(iter([29093, 40001, 29094, 40002, 40003])))

    pairs = _fresh_ports(3, 29092)

    assert [(pair.port, pair.controller_port) for pair in pairs] == [(29092, 40001), (29093, 40002), (29094, 40003)]


def test_a_single_broker_keeps_its_replication_of_one(tmp_path: Path) -> None:
    settings = server_settings(tmp_path, 9092, 9093)

    assert "default.replication.factor" not in settings
    assert settings["transaction.state.log.replication.factor"] == settings["min.insync.replicas"] == "1"
    assert settings["controller.quorum.voters"] == "1@127.0.0.1:9093"


def test_coordinator_placement_follows_javas_string_hash() -> None:
    assert [java_string_hash(text) for text in ("", "a", "hello", "é", "😀")] == [0, 97, 99162322, 233, 1772899]
    assert java_string_hash("polygenelubricants") == -(1 << 31)  # Utils.abs maps it to partition 0
    assert coordinator_partition("polygenelubricants", 10) == 0
    assert coordinator_partition("hello", 10) == 99162322 % 10


def test_a_cluster_is_refused_on_a_single_broker_data_dir(tmp_path: Path) -> None:
    (tmp_path / "server.properties").write_text("node.id=1\n")
    with pytest.raises(LayoutMismatch, match="single-node broker"):
        LocalCluster(tmp_path).start(nodes=3)


def test_a_recorded_cluster_keeps_its_size(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_bytes(_layout(3).to_json())
    with pytest.raises(LayoutMismatch, match="3-node cluster, not 5 nodes"):
        LocalCluster(tmp_path).start(nodes=5)


def test_an_unknown_node_is_named_with_the_nodes_there_are(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_bytes(_layout(3).to_json())
    with pytest.raises(UnknownNode, match="has nodes 1, 2, 3, not 7"):
        LocalCluster(tmp_path).kill(7)
    with pytest.raises(ClusterNotFound, match="no cluster is recorded"):
        LocalCluster(tmp_path / "empty").start(2)


def test_killing_a_node_without_a_cluster_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["broker", "kill", "2", "--data-dir", str(tmp_path)]) == 2
    assert "holds no cluster, so there is no node to kill" in capsys.readouterr().err


def test_restarting_a_node_takes_no_cluster_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["broker", "start", "--node", "2", "--nodes", "3", "--data-dir", str(tmp_path)]) == 2
    assert "--nodes, --port and --auth do not apply" in capsys.readouterr().err


def test_status_of_a_stopped_cluster_lists_every_node_as_not_running(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cluster.json").write_bytes(_layout(3).to_json())

    assert main(["broker", "status", "--data-dir", str(tmp_path)]) == 3
    assert capsys.readouterr().out.splitlines() == [
        "node 1: not running pid=- port=9001", "node 2: not running pid=- port=9002",
        "node 3: not running pid=- port=9003", "bootstrap=127.0.0.1:9001,127.0.0.1:9002,127.0.0.1:9003"]


def test_a_taken_port_refuses_a_new_cluster_before_recording_it(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        with pytest.raises(PortInUse, match=f"port {taken} on 127.0.0.1 is in use"):
            LocalCluster(tmp_path).start(nodes=3, port=taken)
    assert not LocalCluster.recorded_in(tmp_path)
