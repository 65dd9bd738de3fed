"""``epochline worker`` as a real process on a test's broker, the way Kafka Connect's embedded cluster is used
in a connector's integration tests: start it, deploy connectors over its REST API, kill it, stop it.

Each worker is its own process (so SIGKILL is a real crash; its tasks die with it), started in ``cwd`` (where
the connectors' Python transforms are imported from), with its log in a file of its own, and stopped by the
PID recorded here, never by name::

    worker = start_local_worker(tmp_path, kafka_bootstrap, cluster="orders", name="w1")
    try:
        with worker.client() as api:
            api.create("orders-clean", {"source": {...}, "sink": {...}, "dead_letter": {...}})
        ...
    finally:
        worker.stop()
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine.ports import free_port
from engine.testing.errors import WorkerProcessFailed
from engine.worker.warm import MODULE as WARM_MODULE

if TYPE_CHECKING:
    from engine.worker.client import WorkerClient


@dataclass
class LocalWorker:
    """One running ``epochline worker``: its name in the cluster, REST port, state directory, log and process."""

    name: str
    port: int
    state_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    token: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, timeout_s: float = 30.0) -> WorkerClient:
        """A client of its REST API (the one ``epochline connectors`` uses), with its token if it has one."""
        from engine.worker.client import WorkerClient  # here: importing engine.testing needs no HTTP client (0.2 s)

        return WorkerClient(self.url, self.token, timeout_s=timeout_s)

    def kill(self) -> None:
        """SIGKILL: the worker cannot stop its tasks; they die with it (``PR_SET_PDEATHSIG``)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self, timeout_s: float = 45.0) -> int:
        """SIGTERM: the worker stops its tasks (each commits its epoch) and exits; its exit code. One still
        running after ``timeout_s`` is killed and reported (``WorkerProcessFailed`` with its log's tail)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise WorkerProcessFailed(f"worker {self.name} did not stop in {timeout_s:g}s:\n"
                                      f"{self.log_tail()}") from None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def task_logs(self) -> str:
        """Every task log this worker wrote (one per connector it ran, under its state directory)."""
        return "\n".join(path.read_text(errors="replace") for path in self.state_dir.glob("connectors/*/task.log"))

    def warm_task_pid(self) -> int | None:
        """The process this worker keeps ahead to start its next task in (``engine.worker.warm``), if any."""
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                command = (stat.parent / "cmdline").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            if parent == self.process.pid and WARM_MODULE.encode() in command:
                return int(stat.parent.name)
        return None


def start_local_worker(directory: Path, bootstrap: str, cluster: str, name: str, *, token: str | None = None,
                       port: int | None = None, extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                       cwd: Path | None = None, wait_s: float = 60.0) -> LocalWorker:
    """A worker of ``cluster`` named ``name`` (state under ``directory/name``, log in ``directory``), returned
    once its API answers; ``WorkerProcessFailed`` with its log's tail if it exits or does not answer within
    ``wait_s``. A worker whose wait ends without an answer, however it ends, is killed. It runs in ``cwd``,
    where its connectors' Python transforms are imported from (default: this process's working directory),
    and serves its API on 127.0.0.1 at ``port`` (default: a free one) with ``token`` (default: none).
    ``extra_args`` go to ``epochline worker`` (``--no-warm-task``, ``--max-task-failures N``, ...), ``env``
    over this process's environment."""
    from engine.worker.client import TOKEN_ENV

    directory = directory.resolve()  # the worker may run elsewhere (cwd): its paths must not depend on it
    port = port or free_port()
    state_dir = directory / name
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = directory / f"worker-{name}-{time.monotonic_ns()}.log"
    argv = [sys.executable, "-m", "engine.cli", "--log-format", "json", "worker", "--cluster", cluster,
            "--rest", f"127.0.0.1:{port}", "--instance", name, "--state-dir", str(state_dir),
            "--bootstrap-servers", bootstrap, *extra_args]
    environment = {key: value for key, value in os.environ.items() if key != TOKEN_ENV}
    environment.update(env or {})
    if token is not None:
        environment[TOKEN_ENV] = token
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=environment)
    worker = LocalWorker(name, port, state_dir, log_path, process, token)
    try:
        _wait_until_it_answers(worker, wait_s)
    except BaseException:
        worker.kill()  # never left running unseen, whatever ended the wait
        raise
    return worker


def _wait_until_it_answers(worker: LocalWorker, wait_s: float) -> None:
    from engine.worker.client import WorkerApiError

    deadline = time.monotonic() + wait_s
    while True:
        if worker.process.poll() is not None:
            raise WorkerProcessFailed(f"worker {worker.name} exited with {worker.process.returncode}:\n"
                                      f"{worker.log_tail()}")
        try:
            with worker.client() as client:
                client.info()
            return
        except WorkerApiError:
            if time.monotonic() > deadline:
                raise WorkerProcessFailed(f"worker {worker.name} did not answer within {wait_s:g}s:\n"
                                          f"{worker.log_tail()}") from None
            time.sleep(0.3)
