"""epochline's pytest plugin (entry point ``pytest11``): a real Kafka for the tests that need one.

``kafka_bootstrap`` is session-scoped and serves one broker per session, chosen in this order:

1. ``KAFKA_BOOTSTRAP`` when set (a broker you already run);
2. a Kafka container started through testcontainers, when you asked for one (``--kafka-backend=container``,
   ``EPOCHLINE_KAFKA_BACKEND=container`` or the ini option ``kafka_backend = container``) and a Docker
   engine answers;
3. otherwise the embedded local broker (``engine.testing.local_broker``), started in a temporary directory on a
   free port and stopped (by its recorded PID) at the end of the session.

A test marked ``@pytest.mark.container`` always gets a container from ``kafka_bootstrap``, whatever the
session's broker is: the marker states that the test is about the container path. Without a reachable
Docker engine such tests are skipped, and the terminal summary says how many and why. The summary also
names every backend that served, with its address. The container image is ``--kafka-image``, else
``EPOCHLINE_KAFKA_IMAGE``, else the official ``apache/kafka``; containers use the host network and are
removed at the end of the session.

Tests share the broker, so each one creates topics with unique names (``unique_topic``, or
``engine.testing.create_unique_topic``).

Two more session fixtures cost extra JVMs, so they are opt-in: a test that uses one must carry its marker
(else it errors), and the project deselects those markers by default like ``slow`` and ``container``:

- ``kafka_cluster`` (``@pytest.mark.cluster``): a local 3-node KRaft cluster (``engine.testing.cluster``,
  replication 3, ``min.insync.replicas=2``) with ``.bootstrap``, ``.kill(node)``, ``.start(node)``,
  ``.leader_of(topic, partition)`` and ``.transaction_coordinator_of(transactional_id)``. Before each test
  that uses it, nodes an earlier test killed are restarted, so every test begins with all nodes running;
- ``kafka_scram`` (``@pytest.mark.auth``): a single broker with SASL/SCRAM-SHA-512 and enforced ACLs
  (``engine.testing.auth.ScramKafka``: ``.bootstrap``, ``.admin``, ``.create_principal(...)``).

Every process they start is stopped by its recorded PID at the end of the session.

``postgres_dsn`` (session-scoped) is a throwaway PostgreSQL cluster (``engine.testing.postgres``) with
prepared transactions enabled, for tests of the PostgreSQL sink and batch stores; skipped, saying how to
install the server, where there is none.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import pytest

from engine.ports import free_port
from engine.testing.auth import ScramKafka
from engine.testing.local_broker import LocalBroker
from engine.testing.postgres import DSN_VARIABLE, throwaway_postgres

if TYPE_CHECKING:
    from engine.testing.cluster import LocalCluster
    from engine.testing.containers import KafkaContainer

Backend = Literal["embedded", "container"]
BACKEND_ENV = "EPOCHLINE_KAFKA_BACKEND"
CONTAINER_MARK = "container"
CLUSTER_MARK = "cluster"
AUTH_MARK = "auth"
OPT_IN_FIXTURES = {"kafka_cluster": CLUSTER_MARK, "kafka_scram": AUTH_MARK}
"""Fixture -> the marker a test using it must carry: the markers are what deselects these JVMs by default."""


@dataclass
class _SessionReport:
    """What the terminal summary tells: which brokers served, and the marked tests skipped for no Docker."""

    served: dict[str, str] = field(default_factory=dict)  # description -> bootstrap
    notes: list[str] = field(default_factory=list)
    skipped_container_tests: int = 0
    docker_reason: str | None = None
    docker_checked: bool = False

    def docker_unavailable_reason(self) -> str | None:
        """Asked once per session: pinging the engine is cheap, but its answer must not change midway."""
        if not self.docker_checked:
            from engine.testing.containers import docker_unavailable_reason

            self.docker_reason = docker_unavailable_reason()
            self.docker_checked = True
        return self.docker_reason


_REPORT = pytest.StashKey[_SessionReport]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("epochline", "epochline's Kafka for tests")
    group.addoption("--kafka-backend", choices=("embedded", "container"), default=None,
                    help=f"broker for kafka_bootstrap when KAFKA_BOOTSTRAP is unset (default: ${BACKEND_ENV}, "
                         "else the kafka_backend ini option, else embedded)")
    group.addoption("--kafka-image", default=None,
                    help="image of Kafka containers (default: $EPOCHLINE_KAFKA_IMAGE, else apache/kafka)")
    parser.addini("kafka_backend", "embedded or container: broker for kafka_bootstrap", default="embedded")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{CONTAINER_MARK}: the test runs against a Kafka container (testcontainers)")
    config.addinivalue_line("markers", f"{CLUSTER_MARK}: the test uses kafka_cluster, a local 3-node Kafka cluster")
    config.addinivalue_line("markers", f"{AUTH_MARK}: the test uses kafka_scram, a local SASL/SCRAM broker with ACLs")
    config.stash[_REPORT] = _SessionReport()


def _requested_backend(config: pytest.Config) -> Backend:
    chosen = config.getoption("kafka_backend") or os.environ.get(BACKEND_ENV) or config.getini("kafka_backend")
    if chosen not in ("embedded", "container"):
        raise pytest.UsageError(f"kafka backend must be 'embedded' or 'container', got {chosen!r} "
                                f"(from --kafka-backend, ${BACKEND_ENV} or the kafka_backend ini option)")
    return "container" if chosen == "container" else "embedded"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Marked tests get ``kafka_bootstrap`` parametrized with the container (one broker for all of them)."""
    if metafunc.definition.get_closest_marker(CONTAINER_MARK) and "kafka_bootstrap" in metafunc.fixturenames:
        metafunc.parametrize("kafka_bootstrap", ["container"], indirect=True, scope="session")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _require_opt_in_marks(item)
    if item.get_closest_marker(CONTAINER_MARK) is None:
        return
    report = item.config.stash[_REPORT]
    reason = report.docker_unavailable_reason()
    if reason is not None:
        report.skipped_container_tests += 1
        pytest.skip(f"marked '{CONTAINER_MARK}' but {reason}")


def _require_opt_in_marks(item: pytest.Item) -> None:
    """A test using a costly fixture without its marker would start JVMs in a default run: refuse it."""
    used = getattr(item, "fixturenames", ())
    for fixture, mark in OPT_IN_FIXTURES.items():
        if fixture in used and item.get_closest_marker(mark) is None:
            pytest.fail(f"{item.nodeid} uses {fixture} but is not marked @pytest.mark.{mark}; mark it, so that "
                        f"default runs (-m 'not {mark}') skip the JVMs it starts", pytrace=False)


class _SessionBrokers:
    """Starts each kind of broker at most once per session, on first use, and stops them at the end."""

    def __init__(self, config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._config = config
        self._tmp_path_factory = tmp_path_factory
        self._report = config.stash[_REPORT]
        self._embedded: LocalBroker | None = None
        self._embedded_bootstrap: str | None = None
        self._container: KafkaContainer | None = None
        self._container_failure: Exception | None = None
        self._cluster: LocalCluster | None = None
        self._scram_broker: LocalBroker | None = None
        self._scram: ScramKafka | None = None
        self._failures: dict[str, Exception] = {}  # a failed start is not retried by every later test

    def session_default(self) -> str:
        configured = os.environ.get("KAFKA_BOOTSTRAP")
        if configured:
            self._report.served["KAFKA_BOOTSTRAP"] = configured
            return configured
        if _requested_backend(self._config) == "container":
            reason = self._report.docker_unavailable_reason()
            if reason is None:
                return self.container()
            note = f"a Kafka container was requested, but {reason}: the embedded broker served instead"
            if note not in self._report.notes:
                self._report.notes.append(note)
        return self.embedded()

    def embedded(self) -> str:
        if self._embedded_bootstrap is None:
            broker = LocalBroker(self._tmp_path_factory.mktemp("kafka"))
            self._embedded_bootstrap = broker.start(port=free_port()).bootstrap
            self._embedded = broker
            self._report.served["embedded local broker"] = self._embedded_bootstrap
        return self._embedded_bootstrap

    def container(self) -> str:
        """The session's container; a failed start is remembered, so later tests fail fast with its error."""
        from engine.testing.containers import KafkaContainer, kafka_image

        if self._container_failure is not None:
            raise self._container_failure
        if self._container is None:
            container = KafkaContainer(image=self._config.getoption("kafka_image") or kafka_image())
            try:
                bootstrap = container.start()
            except Exception as failure:
                self._container_failure = failure
                raise
            self._container = container
            self._report.served[f"container {container.image} (testcontainers, host network)"] = bootstrap
        assert self._container.bootstrap is not None
        return self._container.bootstrap

    def cluster(self) -> LocalCluster:
        """The session's 3-node cluster, started on first use; recorded before it starts, so ``close``
        stops whatever part of it came up."""
        from engine.testing.cluster import LocalCluster

        if CLUSTER_MARK in self._failures:
            raise self._failures[CLUSTER_MARK]
        if self._cluster is None:
            cluster = LocalCluster(self._tmp_path_factory.mktemp("kafka-cluster"))
            self._cluster = cluster
            try:
                cluster.start(nodes=3)
            except Exception as failure:
                self._failures[CLUSTER_MARK] = failure
                raise
            self._report.served["local 3-node cluster"] = cluster.bootstrap
        return self._cluster

    def scram(self) -> ScramKafka:
        """The session's SASL/SCRAM broker, started on first use."""
        if AUTH_MARK in self._failures:
            raise self._failures[AUTH_MARK]
        if self._scram is None:
            broker = LocalBroker(self._tmp_path_factory.mktemp("kafka-scram"))
            self._scram_broker = broker
            try:
                state = broker.start(port=free_port(), auth="scram")
            except Exception as failure:
                self._failures[AUTH_MARK] = failure
                raise
            assert broker.admin is not None, "a SCRAM broker records its admin"
            self._scram = ScramKafka(bootstrap=state.bootstrap, admin=broker.admin, data_dir=broker.data_dir)
            self._report.served["local SASL/SCRAM broker"] = state.bootstrap
        return self._scram

    def close(self) -> None:
        if self._container is not None:
            self._container.stop()
        if self._embedded is not None:
            self._embedded.stop()
        if self._cluster is not None:
            self._cluster.stop()
        if self._scram_broker is not None:
            self._scram_broker.stop()


@pytest.fixture(scope="session")
def _epochline_brokers(request: pytest.FixtureRequest,
                       tmp_path_factory: pytest.TempPathFactory) -> Iterator[_SessionBrokers]:
    brokers = _SessionBrokers(request.config, tmp_path_factory)
    try:
        yield brokers
    finally:
        brokers.close()


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest, _epochline_brokers: _SessionBrokers) -> str:
    """``host:port`` of a real Kafka broker, shared by the session (see the module docstring for which)."""
    if getattr(request, "param", None) == "container":
        return _epochline_brokers.container()
    return _epochline_brokers.session_default()


@pytest.fixture(scope="session")
def kafka_cluster(_epochline_brokers: _SessionBrokers) -> LocalCluster:
    """A local 3-node KRaft cluster shared by the session (tests using it must be marked ``cluster``)."""
    return _epochline_brokers.cluster()


@pytest.fixture(autouse=True)
def _epochline_cluster_whole(request: pytest.FixtureRequest) -> None:
    """Restart the nodes an earlier test killed, before a test that uses ``kafka_cluster`` runs."""
    if "kafka_cluster" in request.fixturenames:
        cluster: LocalCluster = request.getfixturevalue("kafka_cluster")
        cluster.start_stopped()


@pytest.fixture(scope="session")
def kafka_scram(_epochline_brokers: _SessionBrokers) -> ScramKafka:
    """A local SASL/SCRAM-SHA-512 broker with enforced ACLs (tests using it must be marked ``auth``)."""
    return _epochline_brokers.scram()


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """``EPOCHLINE_TEST_POSTGRES_DSN``, else a throwaway cluster for the session (``engine.testing.postgres``)."""
    configured = os.environ.get(DSN_VARIABLE)
    if configured:
        yield configured
        return
    with throwaway_postgres() as server:
        yield server.dsn


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses: the test's name plus a random suffix."""
    base = "".join(c if c.isalnum() or c in "-_" else "-" for c in request.node.name)[:80]
    return f"{base}-{uuid.uuid4().hex[:8]}"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    report = terminalreporter.config.stash[_REPORT]
    lines = [f"kafka backend: {description} at {bootstrap}" for description, bootstrap in report.served.items()]
    lines += [f"kafka backend: {note}" for note in report.notes]
    if report.skipped_container_tests:
        lines.append(f"kafka backend: {report.skipped_container_tests} tests marked '{CONTAINER_MARK}' SKIPPED: "
                     f"{report.docker_reason}")
    if lines:
        terminalreporter.write_sep("-", "epochline")
        for line in lines:
            terminalreporter.write_line(line)
