"""Dev tooling: what tests, demos and benchmarks use to get a real Kafka and drive pipelines on it.

Nothing in the runtime (``engine.checkpoint``, ``engine.state``, ``engine.transforms``, ``engine.batch``)
imports this package; the CLI loads its parts only for ``epochline broker`` and for crash tests.

- ``local_broker``: the embedded single-node KRaft broker from the official Apache Kafka jars (its
  Maven pom is ``kafka/pom.xml``), started on 127.0.0.1 and stopped by its recorded PID;
- ``cluster``: three such nodes as one replicated cluster, whose nodes tests kill and restart;
- ``auth``: SASL/SCRAM with enforced ACLs, and principals granted exactly what a connector needs;
- ``containers``: the same broker in a Docker container through testcontainers (``epochline[testing]``);
- ``topics``: create topics, write rows, read them back with ``read_committed``;
- ``pipelines``: run ``epochline run --stop-at-end`` as a user would;
- ``connectors``: ``epochline run`` as its own process (SIGKILLed by crash tests), input written as it streams;
- ``accounting``: every input id accounted for, once, in the output or among the dead letters;
- ``driver``: ``TransformTestDriver``, a connector's transform tested without Kafka, in milliseconds;
- ``faults``: crash the process at a named moment of the protocol;
- ``conformance``: ``check_sink``, an external sink SIGKILLed at each moment of the two-phase commit, and its
  report: each input id published once (or dead-lettered), or what was lost or doubled where;
- ``pytest_plugin``: the ``kafka_bootstrap`` and ``postgres_dsn`` fixtures (entry point ``pytest11``);
- ``postgres``: a throwaway PostgreSQL cluster from Debian's server binaries, prepared transactions enabled;
- ``browser``: a page rendered by headless Chromium (Debian's), or driven in it by Playwright (clicks, dialogs,
  screenshots), for the worker's status page;
- ``worker``: in-memory stand-ins for the worker cluster's topics and Kafka calls, for the API's specifications;
- ``local_worker``: ``epochline worker`` as a real process on a test's broker, to deploy connectors to over REST.

A test in a few lines::

    topic = create_unique_topic(kafka_bootstrap, "orders")
    produce_rows(kafka_bootstrap, topic, [{"id": 1, "amount": 2.5}], FormatSpec(format="json"))
    run_pipeline(config_path, kafka_bootstrap)
    table = read_topic(kafka_bootstrap, "orders-clean", FormatSpec(format="json"))
"""

from engine.ports import free_port
from engine.testing.auth import ClientAuth, ScramKafka, create_principal
from engine.testing.cluster import LocalCluster
from engine.testing.conformance import CRASH_POINTS, ConformanceReport, ConformanceRunFailed, CrashFinding, check_sink
from engine.testing.containers import KafkaContainer, docker_unavailable_reason
from engine.testing.driver import DriverRecord, DriverSnapshot, TransformTestDriver
from engine.testing.errors import (
    ContainerStartFailed,
    KafkaTestError,
    ProduceFailed,
    ReadFailed,
    WorkerProcessFailed,
)
from engine.testing.local_broker import LocalBroker
from engine.testing.local_worker import LocalWorker, start_local_worker
from engine.testing.pipelines import run_pipeline
from engine.testing.topics import create_unique_topic, produce_rows, produce_transactions, read_topic, read_values

__all__ = [
    "CRASH_POINTS",
    "ClientAuth",
    "ConformanceReport",
    "ConformanceRunFailed",
    "ContainerStartFailed",
    "CrashFinding",
    "DriverRecord",
    "DriverSnapshot",
    "KafkaContainer",
    "KafkaTestError",
    "LocalBroker",
    "LocalCluster",
    "LocalWorker",
    "ProduceFailed",
    "ReadFailed",
    "ScramKafka",
    "TransformTestDriver",
    "WorkerProcessFailed",
    "check_sink",
    "create_principal",
    "create_unique_topic",
    "docker_unavailable_reason",
    "free_port",
    "produce_rows",
    "produce_transactions",
    "read_topic",
    "read_values",
    "run_pipeline",
    "start_local_worker",
]
