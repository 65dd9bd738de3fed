"""``epochline worker``: join a worker cluster, run a task of every connector, serve the REST API.

A worker needs only the bootstrap address and the cluster's name: the cluster is its two topics
(``engine.worker.store``). Start-up is bounded: Kafka must answer within the connect timeout, and the topics
are read to their end before the API answers, so the first answer already knows every connector.

Security (the defaults are the safe ones): the API binds 127.0.0.1; a token, once configured
(``EPOCHLINE_API_TOKEN`` or ``--api-token-file``), is required on every request; a worker asked to bind any
other address refuses to start without one.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import uvicorn

from connectors.admin import check_connection, cluster_id
from engine.instance import InstanceNameError, instance_name
from engine.logs import set_context
from engine.state import StateDirLock
from engine.worker.api import WorkerContext, create_app
from engine.worker.errors import WorkerConfigError
from engine.worker.guard import RequestGuard
from engine.worker.history import ConnectorHistory
from engine.worker.kafka_ops import KafkaConnectorOps
from engine.worker.metrics import WorkerCollector, render
from engine.worker.store import KafkaClusterStore
from engine.worker.supervisor import Supervisor, SupervisorSettings
from engine.worker.view import GroupReader

log = logging.getLogger(__name__)
CLUSTER_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True)
class WorkerOptions:
    cluster: str
    bootstrap: str
    host: str = "127.0.0.1"
    port: int = 8083
    instance: str | None = None
    state_dir: Path = Path("state") / "worker"
    token: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    """Host names the REST API answers to besides IP addresses, localhost and ``host`` (``--rest-allowed-hosts``)."""
    client_config: dict[str, str] = field(default_factory=dict)
    """The worker's own Kafka security settings (its topics, group reads, offset changes); resolved."""
    connect_timeout_s: float = 30.0
    supervision: SupervisorSettings | None = None
    """Overrides of the supervisor's limits (tests shorten the backoff); its names are filled in here."""


def check_bind(host: str, token: str | None) -> None:
    """Only loopback may go without a token: anyone who can reach the API can run code (Python transforms)."""
    if token is not None:
        return
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise WorkerConfigError(f"refusing to serve the API on {host} without a token: set EPOCHLINE_API_TOKEN or "
                                "--api-token-file (only a loopback address may go without one)")


def run_worker(options: WorkerOptions) -> None:
    """Serve until SIGTERM/SIGINT, then stop every task (each commits its epoch) and leave."""
    check_bind(options.host, options.token)
    if not options.cluster or set(options.cluster) - CLUSTER_NAME_CHARS:
        raise WorkerConfigError(f"cluster name {options.cluster!r} must be letters, digits, '.', '_' or '-'")
    try:
        worker_id = instance_name(options.state_dir, options.instance)
    except InstanceNameError as error:
        raise WorkerConfigError(str(error)) from error
    set_context(worker=worker_id)
    lock = StateDirLock(options.state_dir / "instances" / worker_id)
    lock.acquire(timeout_s=5.0)
    try:
        check_connection(options.bootstrap, options.client_config, options.connect_timeout_s)
        _serve(options, worker_id)
    finally:
        lock.release()


def _exit_on_signals(server: uvicorn.Server) -> None:
    """SIGTERM/SIGINT end the server and return from ``run`` so the tasks are stopped cleanly. uvicorn
    installs its own handlers while it serves and re-raises the signal when done (to die of it): these are
    the handlers it restores first, so the re-raised signal only asks again for what is already happening."""
    def request_exit(signum: int, frame: FrameType | None) -> None:
        server.should_exit = True

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, request_exit)


def _start_once_serving(server: uvicorn.Server, supervisor: Supervisor, options: WorkerOptions,
                        worker_id: str) -> None:
    """Tasks start once the API listens: a worker that cannot bind its port (taken) exits before any of its
    tasks joined a group or fenced anything."""
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.05)
    supervisor.start()
    log.info("worker started", extra={"cluster": options.cluster, "worker": worker_id,
                                      "api": f"http://{options.host}:{options.port}", "pid": os.getpid()})


def _serve(options: WorkerOptions, worker_id: str) -> None:
    client = options.client_config
    store = KafkaClusterStore(options.bootstrap, options.cluster, client, timeout_s=options.connect_timeout_s)
    base = options.supervision or SupervisorSettings(worker_id, options.bootstrap, options.state_dir)
    settings = SupervisorSettings(**{**base.__dict__, "worker_id": worker_id, "bootstrap": options.bootstrap,
                                     "state_dir": options.state_dir.absolute()})
    supervisor = Supervisor(store, settings)
    collector = WorkerCollector(worker_id, supervisor.metrics_ports, supervisor.task_states)
    groups = GroupReader(options.bootstrap, client)
    history, sampling = ConnectorHistory(), threading.Event()
    context = WorkerContext(store=store, groups=groups,
                            kafka=KafkaConnectorOps(options.bootstrap, client), worker_id=worker_id,
                            cluster=options.cluster,
                            kafka_cluster_id=cluster_id(options.bootstrap, client, options.connect_timeout_s),
                            token=options.token, metrics=render(collector), supervising=lambda: supervisor.alive,
                            guard=RequestGuard.serving(options.host, options.allowed_hosts), history=history)
    server = uvicorn.Server(uvicorn.Config(create_app(context), host=options.host, port=options.port,
                                           log_config=None, access_log=False, lifespan="off"))
    _exit_on_signals(server)
    threading.Thread(target=_start_once_serving, args=(server, supervisor, options, worker_id), daemon=True,
                     name="start-tasks").start()
    threading.Thread(target=history.run, args=(lambda: store.connectors().values(), groups.read, sampling),
                     daemon=True, name="history").start()
    try:
        server.run()
    finally:
        sampling.set()
        log.info("worker stopping: stopping its tasks", extra={"worker": worker_id})
        supervisor.stop()
        store.close()
        log.info("worker stopped", extra={"worker": worker_id})
