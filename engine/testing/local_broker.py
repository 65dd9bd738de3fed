"""A real, single-node Apache Kafka broker (KRaft) on 127.0.0.1, run from the official jars.

Why a real broker: every exactly-once claim of epochline depends on the broker filtering aborted
transactions for ``read_committed`` readers, fencing zombie producers and storing offset metadata. A
Kafka-compatible toy proves none of that, and no image registry is reachable here, so epochline fetches
``org.apache.kafka:kafka_2.13`` from Maven Central itself (``mvn dependency:copy-dependencies`` on the pom
shipped in ``engine/testing/kafka/pom.xml``), caches the jars, and runs the broker on the machine's Java 17.

The broker's PID is recorded in its data directory; ``stop`` signals exactly that process after checking
that the PID still belongs to this broker (a recycled PID is never signalled).

``start(auth="scram")`` runs it with SASL/SCRAM-SHA-512 and enforced ACLs (``engine.testing.auth``); a
multi-node cluster of these brokers is ``engine.testing.cluster.LocalCluster``.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import orjson

from engine.ports import free_port
from engine.testing.auth import (
    CREDENTIALS_FILE,
    AuthMode,
    ClientAuth,
    ScramSecrets,
    scram_broker_settings,
    scram_format_args,
)

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
DEFAULT_PORT = 9092
DEFAULT_DATA_DIR = Path(".epochline/broker")
MAIN_CLASS = "kafka.Kafka"
CLUSTER_FILE = "cluster.json"  # marks a LocalCluster's data dir (engine.testing.cluster)


class BrokerError(RuntimeError):
    """The local broker could not be set up, started, stopped or reached."""


class ToolMissing(BrokerError):
    """Java or Maven is not installed, so the broker can neither be fetched nor run."""


class PortInUse(BrokerError):
    """The requested listener port is taken by another process."""


class BrokerAlreadyRunning(BrokerError):
    """A broker recorded in this data directory is alive already."""


class BrokerStartFailed(BrokerError):
    """The broker process died or did not accept transactions within the timeout."""


class LayoutMismatch(BrokerError):
    """The data dir holds another kind of broker (single node vs cluster, SCRAM vs none) than was asked for."""


def cache_dir() -> Path:
    """Where fetched jars live: ``EPOCHLINE_CACHE`` or ``~/.cache/epochline``."""
    return Path(os.environ.get("EPOCHLINE_CACHE", Path.home() / ".cache" / "epochline"))


def require_tool(name: str, purpose: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ToolMissing(
            f"'{name}' was not found on PATH; it is needed to {purpose}. Install it "
            f"(Debian: apt-get install {'openjdk-17-jre-headless' if name == 'java' else 'maven'}) "
            "or set KAFKA_HOME to an unpacked Apache Kafka distribution."
        )
    return path


def kafka_classpath() -> str:
    """The broker's classpath: ``$KAFKA_HOME/libs/*`` when set, else the Maven-fetched cached jars.

    The cache is keyed by Kafka version, and filled atomically (download into a temp dir, then rename),
    so a download interrupted half-way is never mistaken for a complete one.
    """
    kafka_home = os.environ.get("KAFKA_HOME")
    if kafka_home:
        libs = Path(kafka_home) / "libs"
        if not any(libs.glob("kafka_2.13-*.jar")):
            raise BrokerError(f"KAFKA_HOME={kafka_home} has no libs/kafka_2.13-*.jar; is it an unpacked Kafka?")
        return f"{libs}/*"
    jars = fetch_kafka_jars()
    return f"{jars}/*"


MVN_TIMEOUT_S = 600.0
"""How long one Maven download of a pom's runtime jars may take (a first fetch on a slow network)."""


def copy_runtime_jars_command(mvn: str, pom: Path, into: Path) -> list[str]:
    """The Maven call that copies the runtime jars of ``pom`` (built on ``${kafka.version}``, set to the
    broker's version) into ``into``: the broker's jars here, Kafka Streams' in the benchmarks."""
    return [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", "-DincludeScope=runtime",
            f"-DoutputDirectory={into}", f"-Dkafka.version={KAFKA_VERSION}"]


def fetch_kafka_jars() -> Path:
    """Download the pinned Kafka jars with Maven once; later calls return the cached directory."""
    target = cache_dir() / f"kafka-{KAFKA_VERSION}" / "libs"
    if (target / f"kafka_2.13-{KAFKA_VERSION}.jar").exists():
        return target
    mvn = require_tool("mvn", "download the Apache Kafka jars from Maven Central")
    partial = target.with_name(f"libs.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    pom = resources.files("engine.testing") / "kafka" / "pom.xml"
    with resources.as_file(pom) as pom_path:
        log.info("fetching kafka jars", extra={"version": KAFKA_VERSION, "into": str(target)})
        try:
            done = subprocess.run(copy_runtime_jars_command(mvn, pom_path, partial), capture_output=True, text=True,
                                  timeout=MVN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BrokerError(f"mvn did not fetch Kafka {KAFKA_VERSION} within {MVN_TIMEOUT_S:.0f}s "
                              "(is Maven Central reachable?)") from None
    if done.returncode != 0:
        raise BrokerError(f"mvn could not fetch Kafka {KAFKA_VERSION}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        partial.rename(target)
    except OSError:  # another process finished first; its copy is complete
        shutil.rmtree(partial, ignore_errors=True)
    return target


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class BrokerState:
    """What ``start`` records so that ``stop`` and ``status`` can find exactly this broker."""

    pid: int
    port: int
    controller_port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def server_settings(data_dir: Path, port: int, controller_port: int, *, node_id: int = 1,
                    voters: str | None = None, replicas: int = 1) -> dict[str, str]:
    """One combined broker+controller node. Alone (``replicas=1``) it replicates nothing, so transactions work
    on one node; in a cluster the internal topics and new topics get ``replicas`` copies and need two in sync,
    so a write survives one node's loss."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters or f"{node_id}@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data_dir / "kraft"),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "10",
        "min.insync.replicas": "1",
        "group.initial.rebalance.delay.ms": "0",
        # consumer-protocol (KIP-848) groups get the session and heartbeat epochline's sources ask for in
        # classic groups (10 s, 1 s) instead of the broker's 45 s and 5 s: a joining member gets its
        # partitions about a second after their owner let go, a crashed one's move after 10 s
        "group.consumer.min.session.timeout.ms": "6000",
        "group.consumer.session.timeout.ms": "10000",
        "group.consumer.min.heartbeat.interval.ms": "1000",
        "group.consumer.heartbeat.interval.ms": "1000",
        "auto.create.topics.enable": "false",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
    }
    if replicas > 1:
        settings.update(_replicated_settings(replicas))
    return settings


def _replicated_settings(replicas: int) -> dict[str, str]:
    """With 3 copies a write needs 2 in sync: it survives the loss of one node, and one node down still
    accepts writes. With 2 copies that would stop all writes while a node is down, so 1 suffices there."""
    min_isr = "2" if replicas >= 3 else "1"
    return {
        "default.replication.factor": str(replicas),
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": min_isr,
        "min.insync.replicas": min_isr,
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": min_isr,
    }


def render_properties(settings: Mapping[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def server_properties(data_dir: Path, port: int, controller_port: int) -> str:
    """Single-node combined broker+controller settings; replication 1 so transactions work alone."""
    return render_properties(server_settings(data_dir, port, controller_port))


_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
"""


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (what ``random-uuid`` prints)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def resolve_scram(home: Path, auth: AuthMode | None, formatted: bool) -> ScramSecrets | None:
    """The SCRAM secrets a start in ``home`` uses: ``auth=None`` keeps what the data dir was made with, and
    asking for the other mode on formatted storage is refused (its users and ACLs would silently vanish, or
    it would have no admin at all)."""
    path = home / CREDENTIALS_FILE
    recorded = ScramSecrets.load(path)
    mode = auth or ("scram" if recorded else "none")
    if mode == "none":
        if recorded is not None and formatted:
            raise LayoutMismatch(f"{home} was formatted with SCRAM authentication; start it with --auth scram "
                                 "(or without --auth), or use another --data-dir")
        path.unlink(missing_ok=True)  # left by a start that failed before formatting
        return None
    if recorded is not None:
        return recorded
    if formatted:
        raise LayoutMismatch(f"{home} was formatted without authentication; SCRAM needs a new --data-dir")
    home.mkdir(parents=True, exist_ok=True)
    created = ScramSecrets.generate()
    created.save(path)
    return created


def write_private(path: Path, text: str) -> None:
    """Write ``text`` readable by its owner only: broker configs may carry the SCRAM passwords."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(descriptor, 0o600)
        os.write(descriptor, text.encode())
    finally:
        os.close(descriptor)


class LocalBroker:
    """One local Kafka broker whose files (config, KRaft logs, PID, broker log, SCRAM secrets) live in
    ``data_dir``. Each node of a ``LocalCluster`` is one of these, in its own sub-directory."""

    def __init__(self, data_dir: Path | str = DEFAULT_DATA_DIR) -> None:
        self.data_dir = Path(data_dir).resolve()  # one spelling per dir, so the PID check never misses

    @property
    def _state_file(self) -> Path:
        return self.data_dir / "broker.json"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def config_file(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def credentials_file(self) -> Path:
        """The SCRAM admin's and the controllers' passwords (mode 0600); absent without authentication."""
        return self.data_dir / CREDENTIALS_FILE

    @property
    def is_formatted(self) -> bool:
        return (self.data_dir / "kraft" / "meta.properties").exists()

    @property
    def admin(self) -> ClientAuth | None:
        """The SCRAM super user of this broker, or None when it runs without authentication."""
        scram = ScramSecrets.load(self.credentials_file)
        return scram.admin if scram is not None else None

    def client_settings(self) -> dict[str, str]:
        """What a client adds to ``bootstrap.servers`` to reach this broker as its admin (empty: PLAINTEXT)."""
        admin = self.admin
        return admin.settings if admin is not None else {}

    def state(self) -> BrokerState | None:
        """The recorded broker if its process is still alive and still this broker, else None."""
        try:
            recorded = BrokerState(**orjson.loads(self._state_file.read_bytes()))
        except FileNotFoundError:
            return None
        return recorded if self._is_our_process(recorded.pid) else None

    def _is_our_process(self, pid: int) -> bool:
        """True when ``pid`` runs kafka.Kafka on this data dir's config, so a reused PID is never signalled."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return MAIN_CLASS.encode() in cmdline and str(self.config_file).encode() in cmdline

    def refuse_if_running(self) -> None:
        running = self.state()
        if running is not None:
            raise BrokerAlreadyRunning(
                f"a broker is already running from {self.data_dir} (pid {running.pid}, {running.bootstrap}); "
                "use 'epochline broker stop' first"
            )

    def start(self, port: int = DEFAULT_PORT, timeout: float = 90.0, *, auth: AuthMode | None = None) -> BrokerState:
        """Start the broker and return once a transactional producer can ``init_transactions`` on it.

        ``auth="scram"`` starts it with SASL/SCRAM-SHA-512 and enforced ACLs (a new data dir only); ``None``
        keeps what the data dir was made with, so a restart needs no flag."""
        self.refuse_if_running()
        if (self.data_dir / CLUSTER_FILE).exists():
            raise LayoutMismatch(f"{self.data_dir} holds a local cluster; start it without --nodes 1, "
                                 "or use another --data-dir")
        java = require_tool("java", "run the Kafka broker")
        if not port_is_free(port):
            raise PortInUse(
                f"port {port} on 127.0.0.1 is in use; stop what listens there or pass --port with a free port"
            )
        classpath = kafka_classpath()
        controller_port = self._previous_controller_port(besides={port}) or free_port(besides={port})
        scram = resolve_scram(self.data_dir, auth, self.is_formatted)
        settings = server_settings(self.data_dir, port, controller_port)
        if scram is not None:
            settings.update(scram_broker_settings(port, controller_port, scram))
        self.write_config(settings)
        self.format_storage(java, classpath, new_cluster_id(), scram_format_args(scram) if scram else ())
        process = self.launch(java, classpath, port, controller_port)
        state = BrokerState(pid=process.pid, port=port, controller_port=controller_port)
        try:
            wait_until_transactions_work(state.bootstrap, timeout, lambda: process.poll() is None,
                                         self.client_settings())
        except BrokerStartFailed as failure:
            self.stop()
            raise BrokerStartFailed(f"{failure}\nlast broker output:\n{self.output_tail()}") from None
        log.info("broker started", extra={"pid": state.pid, "bootstrap": state.bootstrap})
        return state

    def write_config(self, settings: Mapping[str, str]) -> None:
        """Write server.properties (owner-only: it may hold passwords) and the log4j2 config next to it."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        write_private(self.config_file, render_properties(settings))
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2.format(log_file=self.log_file))

    def launch(self, java: str, classpath: str, port: int, controller_port: int) -> subprocess.Popen[bytes]:
        """Spawn ``kafka.Kafka`` on the written config in its own session and record its PID at once, so
        ``stop`` finds it even when the caller dies while waiting for readiness."""
        process = subprocess.Popen(
            [java, "-Xms256m", "-Xmx1g", f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
             "-cp", classpath, MAIN_CLASS, str(self.config_file)],
            stdout=open(self.data_dir / "broker.out", "ab"),  # noqa: SIM115 - the broker process keeps it
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        state = BrokerState(pid=process.pid, port=port, controller_port=controller_port)
        self._state_file.write_bytes(orjson.dumps(state.__dict__))
        return process

    def _previous_controller_port(self, besides: Collection[int]) -> int | None:
        """A restarted broker keeps its controller port, so its KRaft quorum config stays the same, unless
        that port is taken now or is one of ``besides`` (the client port asked for this time)."""
        try:
            recorded = self.config_file.read_text()
        except FileNotFoundError:
            return None
        for line in recorded.splitlines():
            if line.startswith("controller.quorum.voters="):
                port = int(line.rsplit(":", 1)[1])
                return port if port not in besides and port_is_free(port) else None
        return None

    def format_storage(self, java: str, classpath: str, cluster_id: str, extra_args: Sequence[str] = ()) -> None:
        """Format KRaft storage once per data dir; a formatted dir keeps its cluster id, topics and users.
        ``extra_args`` carries ``--add-scram``: the admin user must exist before any client can log in."""
        if self.is_formatted:
            return
        done = subprocess.run(
            [java, "-cp", classpath, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
             "-c", str(self.config_file), *extra_args],
            capture_output=True, text=True,
        )
        if done.returncode != 0:
            raise BrokerError(f"formatting KRaft storage in {self.data_dir} failed:\n{done.stdout}{done.stderr}")

    def output_tail(self) -> str:
        lines: list[str] = []
        for path in (self.data_dir / "broker.out", self.log_file):
            if path.exists():
                lines += path.read_text(errors="replace").splitlines()[-15:]
        return "\n".join(lines)

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM the recorded broker, SIGKILL it after ``timeout``; False when none was running."""
        pid = self.terminate()
        if pid is None:
            return False
        if not wait_for_exit(pid, timeout):
            log.warning("broker ignored SIGTERM, killing", extra={"pid": pid})
            os.kill(pid, signal.SIGKILL)
            wait_for_exit(pid, 10.0)
        return True

    def terminate(self) -> int | None:
        """SIGTERM the recorded broker without waiting (a cluster stops all nodes at once); its PID, or None
        when none was running."""
        state = self.state()
        self._state_file.unlink(missing_ok=True)
        if state is None:
            return None
        os.kill(state.pid, signal.SIGTERM)
        return state.pid

    def kill(self) -> bool:
        """SIGKILL the broker at once (for crash tests); its data dir stays, so it can start again.
        False when none was running."""
        state = self.state()
        if state is not None:
            os.kill(state.pid, signal.SIGKILL)
            wait_for_exit(state.pid, 10.0)
        self._state_file.unlink(missing_ok=True)
        return state is not None


def wait_for_exit(pid: int, timeout: float) -> bool:
    """True once ``pid`` has exited, False when it still runs after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if has_exited(pid):
            return True
        time.sleep(0.1)
    return False


def has_exited(pid: int) -> bool:
    """Reap ``pid`` when it is our child; otherwise judge by /proc (gone or a zombie)."""
    try:
        finished, _ = os.waitpid(pid, os.WNOHANG)
        return finished == pid
    except ChildProcessError:
        return not Path(f"/proc/{pid}").exists() or _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def wait_until_transactions_work(bootstrap: str, timeout: float, alive: Callable[[], bool] = lambda: True,
                                 client_settings: Mapping[str, str] | None = None) -> None:
    """Block until ``init_transactions`` succeeds: the broker, its controller and the transaction
    coordinator are all up. A plain metadata request would answer before transactions can be used.
    ``client_settings`` are the SASL settings of an authenticated broker's admin."""
    from confluent_kafka import KafkaException, Producer

    deadline = time.monotonic() + timeout
    last_error = "no answer"
    while time.monotonic() < deadline:
        if not alive():
            raise BrokerStartFailed(f"the broker process exited while starting ({bootstrap})")
        producer = Producer({
            "bootstrap.servers": bootstrap,
            "transactional.id": f"epochline-readiness-{uuid.uuid4().hex}",
            "log_level": 0,
            **(client_settings or {}),
        })
        try:
            producer.init_transactions(min(10.0, max(1.0, deadline - time.monotonic())))
            return
        except KafkaException as error:
            last_error = str(error)
        finally:
            del producer
        time.sleep(0.5)
    raise BrokerStartFailed(
        f"the broker at {bootstrap} did not accept transactions within {timeout:.0f}s: {last_error}")
