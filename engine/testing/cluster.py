"""A local multi-node Kafka cluster: N combined broker+controller KRaft nodes on 127.0.0.1, one quorum of all.

Why: a single broker proves that transactions commit and abort; only replicas prove that they survive the loss
of a node (a partition leader, a transaction coordinator). The cluster replicates the internal topics
(offsets, transaction state) and new topics 3 times with ``min.insync.replicas=2``, so a write is refused only
when two of three copies are gone.

Each node is a ``LocalBroker`` in ``<data dir>/node-<id>`` with its own config, KRaft storage, log and
recorded PID, so a node is killed, restarted and checked (``/proc`` cmdline) exactly like the single broker.
``cluster.json`` in the data dir records the cluster id and every node's ports: the static quorum
(``controller.quorum.voters``) names them, so a node restarts on the same ports with its existing data.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from engine.ports import free_port
from engine.testing.auth import (
    CREDENTIALS_FILE,
    AuthMode,
    ClientAuth,
    ScramSecrets,
    scram_broker_settings,
    scram_format_args,
)
from engine.testing.local_broker import (
    CLUSTER_FILE,
    DEFAULT_DATA_DIR,
    BrokerAlreadyRunning,
    BrokerError,
    BrokerStartFailed,
    LayoutMismatch,
    LocalBroker,
    PortInUse,
    has_exited,
    kafka_classpath,
    new_cluster_id,
    port_is_free,
    require_tool,
    resolve_scram,
    server_settings,
    wait_for_exit,
    wait_until_transactions_work,
)

DEFAULT_NODES = 3
QUORUM_LOSS_GRACE = 10.0
log = logging.getLogger(__name__)
TRANSACTION_STATE_TOPIC = "__transaction_state"


class UnknownNode(BrokerError):
    """A node id that the recorded cluster does not have."""


class ClusterNotFound(BrokerError):
    """The data dir records no cluster (``cluster.json``), so there is no node to start, kill or show."""


class ClusterQueryFailed(BrokerError):
    """A partition leader or coordinator could not be read from the cluster's metadata."""


@dataclass(frozen=True)
class NodePorts:
    port: int
    controller_port: int


@dataclass(frozen=True)
class ClusterLayout:
    """What never changes for a cluster once formatted: its id and where each node listens."""

    cluster_id: str
    nodes: dict[int, NodePorts]

    @property
    def voters(self) -> str:
        return ",".join(f"{node}@127.0.0.1:{ports.controller_port}" for node, ports in self.nodes.items())

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{ports.port}" for ports in self.nodes.values())

    @property
    def replicas(self) -> int:
        return min(len(self.nodes), 3)

    def to_json(self) -> bytes:
        nodes = {str(node): ports.__dict__ for node, ports in self.nodes.items()}
        return orjson.dumps({"cluster_id": self.cluster_id, "nodes": nodes}, option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, payload: bytes) -> ClusterLayout:
        recorded = orjson.loads(payload)
        nodes = {int(node): NodePorts(**ports) for node, ports in recorded["nodes"].items()}
        return cls(cluster_id=recorded["cluster_id"], nodes=dict(sorted(nodes.items())))


@dataclass(frozen=True)
class NodeStatus:
    """One node as ``status`` shows it: its id, its listener port, and its PID while it runs."""

    node_id: int
    port: int
    pid: int | None

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def cluster_settings(node_dir: Path, node_id: int, layout: ClusterLayout,
                     scram: ScramSecrets | None) -> dict[str, str]:
    """server.properties of one node: the shared quorum and replication, its own ports and storage."""
    ports = layout.nodes[node_id]
    settings = server_settings(node_dir, ports.port, ports.controller_port, node_id=node_id, voters=layout.voters,
                               replicas=layout.replicas)
    if scram is not None:
        settings.update(scram_broker_settings(ports.port, ports.controller_port, scram))
    return settings


def java_string_hash(value: str) -> int:
    """Java's ``String.hashCode`` (32-bit, over UTF-16 code units), which Kafka uses to place coordinators."""
    encoded = value.encode("utf-16-be")
    result = 0
    for index in range(0, len(encoded), 2):
        result = (31 * result + int.from_bytes(encoded[index:index + 2], "big")) & 0xFFFFFFFF
    return result - (1 << 32) if result >= 1 << 31 else result


def coordinator_partition(key: str, partitions: int) -> int:
    """The internal-topic partition whose leader coordinates ``key`` (Kafka's ``Utils.abs(hash) % n``)."""
    hashed = java_string_hash(key)
    return (0 if hashed == -(1 << 31) else abs(hashed)) % partitions


def _fresh_ports(count: int, first_port: int | None) -> list[NodePorts]:
    """``count`` distinct pairs of free ports; client ports ``first_port, first_port+1, ...`` when given."""
    taken = set(range(first_port, first_port + count)) if first_port is not None else set()
    pairs = []
    for index in range(count):
        port = first_port + index if first_port is not None else free_port(besides=taken)
        taken.add(port)
        pairs.append(NodePorts(port=port, controller_port=free_port(besides=taken)))
        taken.add(pairs[-1].controller_port)
    return pairs


class LocalCluster:
    """N local Kafka nodes whose files live under ``data_dir`` (one ``node-<id>`` directory each)."""

    def __init__(self, data_dir: Path | str = DEFAULT_DATA_DIR) -> None:
        self.data_dir = Path(data_dir).resolve()

    @staticmethod
    def recorded_in(data_dir: Path | str) -> bool:
        """True when ``data_dir`` holds a cluster (rather than a single broker or nothing)."""
        return (Path(data_dir) / CLUSTER_FILE).exists()

    @property
    def _layout_file(self) -> Path:
        return self.data_dir / CLUSTER_FILE

    def layout(self) -> ClusterLayout:
        try:
            return ClusterLayout.from_json(self._layout_file.read_bytes())
        except FileNotFoundError:
            raise ClusterNotFound(f"no cluster is recorded in {self.data_dir}; start one with "
                                  "'epochline broker start --nodes 3'") from None

    def node(self, node_id: int) -> LocalBroker:
        """The node's own broker handle (its directory, recorded PID, config)."""
        layout = self.layout()
        if node_id not in layout.nodes:
            raise UnknownNode(f"the cluster in {self.data_dir} has nodes {', '.join(map(str, layout.nodes))}, "
                              f"not {node_id}")
        return LocalBroker(self.data_dir / f"node-{node_id}")

    @property
    def bootstrap(self) -> str:
        """Every node's address, comma-separated: a client reaches the cluster while any one is up."""
        return self.layout().bootstrap

    @property
    def admin(self) -> ClientAuth | None:
        """The SCRAM super user, or None when the cluster runs without authentication."""
        scram = ScramSecrets.load(self.data_dir / CREDENTIALS_FILE)
        return scram.admin if scram is not None else None

    def client_config(self) -> dict[str, str]:
        """``bootstrap.servers`` plus, with SCRAM, the admin's settings: a client config for any tool."""
        admin = self.admin
        return admin.config(self.bootstrap) if admin is not None else {"bootstrap.servers": self.bootstrap}

    def status(self) -> list[NodeStatus]:
        statuses = []
        for node_id, ports in self.layout().nodes.items():
            state = self.node(node_id).state()
            statuses.append(NodeStatus(node_id, ports.port, state.pid if state is not None else None))
        return statuses

    def start(self, node: int | None = None, *, nodes: int | None = None, port: int | None = None,
              auth: AuthMode | None = None, timeout: float = 180.0) -> list[NodeStatus]:
        """Start every node (``node=None``: a new cluster of ``nodes``, default 3, or the recorded one) and
        return once a transactional producer works on the cluster; or restart one recorded node with its
        data and return once the cluster lists it again. ``port`` is the first node's client port (the
        others follow), default free ports; ``auth="scram"`` as for ``LocalBroker.start``."""
        if node is not None:
            self._start_node(node, timeout)
            return self.status()
        layout = self._layout_for(nodes, port)
        running = [status.node_id for status in self.status() if status.running]
        if running:
            raise BrokerAlreadyRunning(
                f"nodes {', '.join(map(str, running))} of the cluster in {self.data_dir} are running; stop the "
                "cluster first, or restart one stopped node with --node N")
        scram = resolve_scram(self.data_dir, auth, any(self.node(n).is_formatted for n in layout.nodes))
        self._launch(layout, list(layout.nodes), scram, timeout)
        return self.status()

    def _layout_for(self, nodes: int | None, port: int | None) -> ClusterLayout:
        """The recorded layout (which must match ``nodes``), or a new one recorded before any node starts,
        so that ``stop`` finds every node even if this process dies while they start."""
        if self._layout_file.exists():
            layout = self.layout()
            if nodes is not None and nodes != len(layout.nodes):
                raise LayoutMismatch(f"{self.data_dir} holds a {len(layout.nodes)}-node cluster, not {nodes} nodes; "
                                     "use another --data-dir for a different size")
            if port is not None and port != next(iter(layout.nodes.values())).port:
                raise LayoutMismatch(f"the cluster in {self.data_dir} listens on {layout.bootstrap}; "
                                     "its ports are fixed by its quorum, so omit --port")
            return layout
        if (self.data_dir / "server.properties").exists() or (self.data_dir / "kraft").exists():
            raise LayoutMismatch(f"{self.data_dir} holds a single-node broker; use another --data-dir for a cluster")
        count = DEFAULT_NODES if nodes is None else nodes
        if count < 1:
            raise BrokerError(f"a cluster needs at least one node, not {count}")
        pairs = _fresh_ports(count, port)
        taken = [pair.port for pair in pairs if not port_is_free(pair.port)]
        if taken:
            raise PortInUse(f"port {taken[0]} on 127.0.0.1 is in use; pass --port with {count} free consecutive "
                            "ports, or omit it for free ones")
        layout = ClusterLayout(cluster_id=new_cluster_id(), nodes={i + 1: ports for i, ports in enumerate(pairs)})
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._layout_file.write_bytes(layout.to_json())
        return layout

    def _launch(self, layout: ClusterLayout, node_ids: list[int], scram: ScramSecrets | None,
                timeout: float) -> None:
        """Spawn the nodes and wait until they serve; a failed start stops what it spawned."""
        for node_id in node_ids:
            self._refuse_taken_ports(node_id, layout.nodes[node_id])
        java = require_tool("java", "run the Kafka broker")
        classpath = kafka_classpath()
        brokers = {node_id: self.node(node_id) for node_id in node_ids}
        self._prepare(brokers, layout, scram, java, classpath)
        processes = [broker.launch(java, classpath, layout.nodes[node_id].port, layout.nodes[node_id].controller_port)
                     for node_id, broker in brokers.items()]

        def alive() -> bool:
            return all(process.poll() is None for process in processes)

        try:
            self._wait_until_ready(node_ids, len(node_ids) == len(layout.nodes), alive, timeout)
        except BrokerStartFailed as failure:
            tails = "\n".join(f"node {node_id}:\n{broker.output_tail()}" for node_id, broker in brokers.items())
            for broker in brokers.values():
                broker.stop()
            raise BrokerStartFailed(f"{failure}\nlast output:\n{tails}") from None

    @staticmethod
    def _prepare(brokers: dict[int, LocalBroker], layout: ClusterLayout, scram: ScramSecrets | None, java: str,
                 classpath: str) -> None:
        """Write every node's config, and format the new ones in parallel (each StorageTool run is a JVM
        start); formatted nodes keep their data."""
        for node_id, broker in brokers.items():
            broker.write_config(cluster_settings(broker.data_dir, node_id, layout, scram))
        format_args = scram_format_args(scram) if scram is not None else []
        with ThreadPoolExecutor(max_workers=len(brokers)) as pool:
            list(pool.map(lambda broker: broker.format_storage(java, classpath, layout.cluster_id, format_args),
                          brokers.values()))

    def _refuse_taken_ports(self, node_id: int, ports: NodePorts) -> None:
        for port in (ports.port, ports.controller_port):
            if not port_is_free(port):
                raise PortInUse(f"port {port} on 127.0.0.1 (node {node_id}) is in use; the node's ports are fixed "
                                "by the cluster's quorum, so stop what listens there")

    def _wait_until_ready(self, node_ids: list[int], whole: bool, alive: Callable[[], bool], timeout: float) -> None:
        """Every started node serves and is unfenced; for a whole start, transactions work too."""
        deadline = time.monotonic() + timeout
        settings = self.admin.settings if self.admin is not None else {}
        if whole:
            wait_until_transactions_work(self.bootstrap, timeout, alive, settings)
        layout = self.layout()
        for node_id in node_ids:
            self._wait_until_serving(node_id, layout.nodes[node_id].port, settings, alive, deadline)

    def _wait_until_serving(self, node_id: int, port: int, settings: dict[str, str], alive: Callable[[], bool],
                            deadline: float) -> None:
        """Ask the node itself (a fresh client knows only its address, so the node answers) until it lists
        itself among the brokers: it has caught up on metadata and the controller has unfenced it. Asking any
        node would not do: right after a kill the others still list the dead incarnation."""
        listed: set[int] = set()
        while time.monotonic() < deadline:
            if not alive():
                raise BrokerStartFailed(f"node {node_id} of the cluster in {self.data_dir} exited while starting")
            client = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0, **settings})
            try:
                listed = set(client.list_topics(timeout=5.0).brokers)
            except KafkaException:
                listed = set()
            if node_id in listed:
                return
            time.sleep(0.5)
        raise BrokerStartFailed(f"node {node_id} did not rejoin the cluster in time (it lists brokers "
                                f"{sorted(listed)})")

    def _start_node(self, node_id: int, timeout: float) -> None:
        """Restart one node with its existing data (same ports, config and KRaft storage)."""
        state = self.node(node_id).state()  # an unknown id is refused here
        if state is not None:
            raise BrokerAlreadyRunning(f"node {node_id} of the cluster in {self.data_dir} is already running "
                                       f"(pid {state.pid}, {state.bootstrap})")
        self._launch(self.layout(), [node_id], ScramSecrets.load(self.data_dir / CREDENTIALS_FILE), timeout)

    def start_stopped(self, timeout: float = 180.0) -> list[int]:
        """Restart every recorded node that is not running (after ``kill``); the ids it restarted."""
        stopped = [status.node_id for status in self.status() if not status.running]
        if stopped:
            self._launch(self.layout(), stopped, ScramSecrets.load(self.data_dir / CREDENTIALS_FILE), timeout)
        return stopped

    def stop(self, timeout: float = 30.0) -> list[int]:
        """SIGTERM every running node at once, SIGKILL what still runs after ``timeout``; the ids that were
        running. At once, because a node's controlled shutdown needs an active controller: stopped one by one,
        the last node would wait for a quorum that is gone."""
        if not self._layout_file.exists():
            return []
        layout = self.layout()
        pids = {node_id: pid for node_id in layout.nodes if (pid := self.node(node_id).terminate()) is not None}
        left = self._await_exits(pids, len(layout.nodes) // 2 + 1, timeout)
        for node_id, pid in left.items():
            log.warning("cluster node still running, killing", extra={"node": node_id, "pid": pid})
            os.kill(pid, signal.SIGKILL)
            wait_for_exit(pid, 10.0)
        return sorted(pids)

    @staticmethod
    def _await_exits(pids: dict[int, int], majority: int, timeout: float) -> dict[int, int]:
        """Wait for the signalled nodes to exit; the ones left. Once fewer than a majority run, the rest
        cannot finish a controlled shutdown (no controller can be elected) and would wait minutes for it, so
        they get ``QUORUM_LOSS_GRACE`` seconds (a normal last node exits within ~6 s here), not ``timeout``."""
        deadline = time.monotonic() + timeout
        quorum_lost_at: float | None = None
        left = dict(pids)
        while left and time.monotonic() < deadline:
            left = {node_id: pid for node_id, pid in left.items() if not has_exited(pid)}
            if len(left) < majority:
                quorum_lost_at = quorum_lost_at or time.monotonic()
                if time.monotonic() - quorum_lost_at > QUORUM_LOSS_GRACE:
                    break
            time.sleep(0.1)
        return left

    def kill(self, node: int) -> bool:
        """SIGKILL one node (by its recorded PID, after the ``/proc`` check); False when it was not running."""
        return self.node(node).kill()

    def _admin_client(self) -> AdminClient:
        config: dict[str, Any] = {**self.client_config(), "log_level": 0}
        return AdminClient(config)

    def _partition(self, topic: str, partition: int) -> Any:
        try:
            metadata = self._admin_client().list_topics(topic, timeout=10.0)
        except KafkaException as error:
            raise ClusterQueryFailed(f"metadata of {topic!r} unavailable from {self.bootstrap}: {error}") from error
        described = metadata.topics.get(topic)
        if described is None or described.error is not None or partition not in described.partitions:
            reason = described.error if described is not None else "not in metadata"
            raise ClusterQueryFailed(f"{topic!r} partition {partition} is not available: {reason}")
        return described.partitions[partition]

    def leader_of(self, topic: str, partition: int = 0) -> int:
        """The node id leading ``topic``/``partition`` now (-1 is an error: no leader during an election)."""
        leader = int(self._partition(topic, partition).leader)
        if leader < 0:
            raise ClusterQueryFailed(f"{topic!r} partition {partition} has no leader at the moment")
        return leader

    def in_sync_replicas(self, topic: str, partition: int = 0) -> list[int]:
        return sorted(int(replica) for replica in self._partition(topic, partition).isrs)

    def wait_until_in_sync(self, topic: str, partition: int = 0, timeout: float = 60.0) -> list[int]:
        """Block until every replica of the partition is in sync again (a restarted node has caught up)."""
        deadline = time.monotonic() + timeout
        while True:
            described = self._partition(topic, partition)
            in_sync = sorted(int(replica) for replica in described.isrs)
            if in_sync == sorted(int(replica) for replica in described.replicas):
                return in_sync
            if time.monotonic() > deadline:
                raise ClusterQueryFailed(f"{topic!r} partition {partition} has in-sync replicas {in_sync} of "
                                         f"{sorted(described.replicas)} after {timeout:.0f}s")
            time.sleep(0.5)

    def transaction_coordinator_of(self, transactional_id: str) -> int:
        """The node coordinating ``transactional_id``: the leader of its ``__transaction_state`` partition.
        confluent-kafka has neither FindCoordinator nor DescribeTransactions, so this applies the broker's own
        placement rule (Java ``hashCode`` modulo the partition count) to the topic's metadata."""
        try:
            metadata = self._admin_client().list_topics(TRANSACTION_STATE_TOPIC, timeout=10.0)
        except KafkaException as error:
            raise ClusterQueryFailed(f"metadata of {TRANSACTION_STATE_TOPIC} unavailable: {error}") from error
        described = metadata.topics.get(TRANSACTION_STATE_TOPIC)
        if described is None or not described.partitions:
            raise ClusterQueryFailed(f"{TRANSACTION_STATE_TOPIC} does not exist yet on {self.bootstrap}")
        return self.leader_of(TRANSACTION_STATE_TOPIC, coordinator_partition(transactional_id,
                                                                            len(described.partitions)))
