"""``epochline broker start|stop|status|kill|add-user``: a local Kafka broker or multi-node cluster (dev tooling,
loaded lazily).

One data dir holds either a single broker (the default, ``--nodes 1``) or a cluster (``--nodes 3``, recorded in
``cluster.json``); ``stop``, ``status``, ``kill`` and a restart find out which from the data dir itself, so
only the first ``start`` says what to build.
"""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from engine.cli.common import CommandFailed

if TYPE_CHECKING:
    from engine.testing.auth import ClientAuth
    from engine.testing.cluster import LocalCluster
    from engine.testing.local_broker import LocalBroker

DEFAULT_DATA_DIR = Path(".epochline/broker")
STATUS_NOT_RUNNING = 3
STATUS_DEGRADED = 1


def _reported(action: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Broker failures (missing java, a taken port, ...) become the CLI's one-line failure."""

    def run(args: argparse.Namespace) -> int:
        from engine.testing.errors import KafkaTestError
        from engine.testing.local_broker import BrokerError

        try:
            return action(args)
        except (BrokerError, KafkaTestError) as error:
            raise CommandFailed(str(error)) from error

    return run


def _broker(args: argparse.Namespace) -> LocalBroker:
    from engine.testing.local_broker import LocalBroker

    return LocalBroker(args.data_dir) if args.data_dir is not None else LocalBroker()


def _cluster(args: argparse.Namespace) -> LocalCluster | None:
    """The cluster recorded in the data dir, or None when it holds a single broker (or nothing yet)."""
    from engine.testing.cluster import LocalCluster

    data_dir = args.data_dir if args.data_dir is not None else DEFAULT_DATA_DIR
    return LocalCluster(data_dir) if LocalCluster.recorded_in(data_dir) else None


def _required_cluster(args: argparse.Namespace, action: str) -> LocalCluster:
    from engine.testing.cluster import ClusterNotFound

    cluster = _cluster(args)
    if cluster is None:
        raise ClusterNotFound(f"{_broker(args).data_dir} holds no cluster, so there is no node to {action}; "
                              "'epochline broker start|stop' run the single broker")
    return cluster


@_reported
def _start(args: argparse.Namespace) -> int:
    if args.node is not None:
        return _start_node(args)
    if args.nodes is not None and args.nodes < 1:
        raise CommandFailed(f"--nodes must be at least 1, not {args.nodes}")
    if args.nodes == 1 or (args.nodes is None and _cluster(args) is None):
        return _start_single(args)
    from engine.testing.cluster import LocalCluster

    cluster = LocalCluster(args.data_dir if args.data_dir is not None else DEFAULT_DATA_DIR)
    cluster.start(nodes=args.nodes, port=args.port, auth=args.auth, timeout=args.timeout)
    print(cluster.bootstrap)
    if cluster.admin is not None:
        print(_auth_instructions(cluster.bootstrap, cluster.admin, cluster.data_dir))
    return 0


def _start_single(args: argparse.Namespace) -> int:
    broker = _broker(args)
    if args.port:
        state = broker.start(port=args.port, timeout=args.timeout, auth=args.auth)
    else:
        state = broker.start(timeout=args.timeout, auth=args.auth)
    print(state.bootstrap)
    if broker.admin is not None:
        print(_auth_instructions(state.bootstrap, broker.admin, broker.data_dir))
    return 0


def _start_node(args: argparse.Namespace) -> int:
    if args.nodes is not None or args.port is not None or args.auth is not None:
        raise CommandFailed("--node restarts a recorded node with its own ports and settings; "
                            "--nodes, --port and --auth do not apply to it")
    cluster = _required_cluster(args, "start")
    cluster.start(args.node, timeout=args.timeout)
    print(next(status.bootstrap for status in cluster.status() if status.node_id == args.node))
    return 0


def _auth_instructions(bootstrap: str, admin: ClientAuth, data_dir: Path) -> str:
    """What a user needs to talk to the authenticated broker: the admin's client settings, where the password
    is kept, and how to add a least-privilege user."""
    from engine.testing.auth import CREDENTIALS_FILE

    settings = "\n".join(f"  {key}={value}" for key, value in admin.config(bootstrap).items())
    upsert = ("from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, "
              f"UserScramCredentialUpsertion as U; admin = AdminClient({json.dumps(admin.config(bootstrap))}); "
              'admin.alter_user_scram_credentials([U("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, '
              '8192), b"alice-secret")])["alice"].result()')
    return "\n".join([
        f"auth: SASL/{admin.mechanism} over SASL_PLAINTEXT, ACLs enforced (StandardAuthorizer, "
        "allow.everyone.if.no.acl.found=false)",
        f"admin (super user) password: {data_dir / CREDENTIALS_FILE} (mode 0600)",
        "client settings (librdkafka / confluent-kafka; kafka.client in a connector config):",
        settings,
        "add a user with only what a connector needs (prints its client settings):",
        f"  epochline broker add-user alice --read-topic orders --write-topic orders-clean --group orders-clean "
        f"--transactional-id orders-clean --data-dir {shlex.quote(str(data_dir))}",
        "or only its SCRAM credential, like kafka-configs --alter --add-config 'SCRAM-SHA-512=[...]':",
        f"  python -c {shlex.quote(upsert)}",
    ])


@_reported
def _stop(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    if cluster is not None:
        stopped = cluster.stop(timeout=args.timeout)
        print(f"stopped nodes {', '.join(map(str, stopped))}" if stopped
              else f"no broker is running from {cluster.data_dir}")
        return 0
    broker = _broker(args)
    was_running = broker.stop(timeout=args.timeout)
    print("stopped" if was_running else f"no broker is running from {broker.data_dir.absolute()}")
    return 0


@_reported
def _status(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    if cluster is not None:
        return _cluster_status(cluster)
    broker = _broker(args)
    state = broker.state()
    if state is None:
        print("not running")
        return STATUS_NOT_RUNNING
    auth = f" auth={broker.admin.mechanism}" if broker.admin is not None else ""
    print(f"running pid={state.pid} bootstrap={state.bootstrap}{auth}")
    return 0


def _cluster_status(cluster: LocalCluster) -> int:
    """One line per node (id, whether it runs, pid, port), then the bootstrap; exit 0 when every node runs,
    1 when some do, 3 when none does."""
    statuses = cluster.status()
    for status in statuses:
        pid = status.pid if status.pid is not None else "-"
        print(f"node {status.node_id}: {'running' if status.running else 'not running'} pid={pid} "
              f"port={status.port}")
    auth = f" auth={cluster.admin.mechanism}" if cluster.admin is not None else ""
    print(f"bootstrap={cluster.bootstrap}{auth}")
    running = sum(status.running for status in statuses)
    if running == len(statuses):
        return 0
    return STATUS_DEGRADED if running else STATUS_NOT_RUNNING


@_reported
def _kill(args: argparse.Namespace) -> int:
    cluster = _required_cluster(args, "kill")
    state = cluster.node(args.node).state()
    if state is None or not cluster.kill(args.node):
        print(f"node {args.node} was not running")
        return 0
    print(f"killed node {args.node} (pid {state.pid}); 'epochline broker start --node {args.node}' restarts it")
    return 0


@_reported
def _add_user(args: argparse.Namespace) -> int:
    from engine.testing.auth import create_principal

    cluster = _cluster(args)
    broker = _broker(args)
    admin = cluster.admin if cluster is not None else broker.admin
    if admin is None:
        raise CommandFailed(f"the broker in {broker.data_dir} runs without authentication; "
                            "start a new one with --auth scram")
    if cluster is not None:
        bootstrap = cluster.bootstrap
    else:
        state = broker.state()
        if state is None:
            raise CommandFailed(f"no broker is running from {broker.data_dir}; start it first")
        bootstrap = state.bootstrap
    user = create_principal(admin.config(bootstrap), args.name, password=args.password,
                            read_topics=args.read_topic, write_topics=args.write_topic, groups=args.group,
                            transactional_ids=args.transactional_id, idempotent_write=args.idempotent_write)
    for key, value in user.config(bootstrap).items():
        print(f"{key}={value}")
    return 0


def _add_start_arguments(action: argparse.ArgumentParser) -> None:
    action.add_argument("--port", type=int, help="default: 9092 (single broker); a cluster's first node, the "
                                                 "others follow (default: free ports)")
    action.add_argument("--timeout", default=120.0, type=float, help="seconds to wait for readiness")
    action.add_argument("--nodes", type=int, help="1 (default): a single broker; N: an N-node KRaft cluster "
                                                  "(replication 3, min.insync.replicas 2)")
    action.add_argument("--node", type=int, help="restart this node of the recorded cluster with its data")
    action.add_argument("--auth", choices=("none", "scram"),
                        help="scram: SASL/SCRAM-SHA-512 with enforced ACLs and a generated admin "
                             "(new data dirs only; default: as the data dir was made, else none)")


def _add_user_arguments(action: argparse.ArgumentParser) -> None:
    action.add_argument("name", help="the SCRAM-SHA-512 user to create (or whose password to reset)")
    action.add_argument("--password", help="default: a generated one (printed)")
    for flag, what in (("--read-topic", "READ+DESCRIBE on a source topic"),
                       ("--write-topic", "WRITE+DESCRIBE on a sink or dead-letter topic"),
                       ("--group", "READ on a consumer group"),
                       ("--transactional-id", "WRITE+DESCRIBE on a transactional id")):
        action.add_argument(flag, action="append", default=[], help=f"{what} (repeatable)")
    action.add_argument("--idempotent-write", action="store_true",
                        help="IDEMPOTENT_WRITE on the cluster (only an idempotent producer without topic WRITE)")


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    broker = commands.add_parser("broker", help="run a local Apache Kafka broker or cluster (KRaft)")
    actions = broker.add_subparsers(dest="action", required=True)
    for name, handler, help_text in (
        ("start", _start, "fetch Kafka if needed, start it on 127.0.0.1 and wait for transactions"),
        ("stop", _stop, "stop the broker (or every node) recorded in the data dir (SIGTERM, then SIGKILL)"),
        ("status", _status, "say whether the recorded broker (or each node) runs"),
        ("kill", _kill, "SIGKILL one node of the recorded cluster (crash tests)"),
        ("add-user", _add_user, "create a SCRAM user with connector ACLs on an authenticated broker"),
    ):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("--data-dir", type=Path, help="default: .epochline/broker")
        if name == "start":
            _add_start_arguments(action)
        if name == "stop":
            action.add_argument("--timeout", default=30.0, type=float, help="seconds before SIGKILL")
        if name == "kill":
            action.add_argument("node", type=int, help="the node id (1..N, as 'status' lists them)")
        if name == "add-user":
            _add_user_arguments(action)
        action.set_defaults(handler=handler)
