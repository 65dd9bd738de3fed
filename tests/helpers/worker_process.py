"""Running ``epochline worker`` as real processes for the cluster specifications, and waiting on what they say.

Each worker is its own process (so SIGKILL is a real crash), started from the repository root (so tasks can
load ``tests.helpers.transforms``), stopped by the PID recorded here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from engine.ports import free_port
from engine.worker.client import WorkerApiError, WorkerClient
from tests.helpers import REPO_ROOT

T = TypeVar("T")


@dataclass
class WorkerProcess:
    name: str
    port: int
    state_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    token: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> WorkerClient:
        return WorkerClient(self.url, self.token, timeout_s=30.0)

    def kill(self) -> None:
        """SIGKILL: the worker cannot stop its tasks; they die with it (PR_SET_PDEATHSIG)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self, timeout_s: float = 45.0) -> int:
        """SIGTERM: the worker stops its tasks (each commits its epoch) and exits."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"worker {self.name} did not stop in {timeout_s}s:\n{self.log_tail()}") from None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def warm_task_pid(self) -> int | None:
        """The process this worker keeps ahead to start its next task in (``engine.worker.warm``), if any."""
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                command = (stat.parent / "cmdline").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            if parent == self.process.pid and b"engine.worker.warm" in command:
                return int(stat.parent.name)
        return None

    def task_logs(self) -> str:
        return "\n".join(path.read_text(errors="replace") for path in self.state_dir.glob("connectors/*/task.log"))


def start_worker(directory: Path, bootstrap: str, cluster: str, name: str, *, token: str | None = None,
                 port: int | None = None, extra_args: tuple[str, ...] = (), env: dict[str, str] | None = None,
                 wait_s: float = 60.0) -> WorkerProcess:
    """A worker of ``cluster`` named ``name`` (state under ``directory/name``), answering once started."""
    port = port or free_port()
    state_dir = directory / name
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = directory / f"worker-{name}-{time.monotonic_ns()}.log"
    argv = [sys.executable, "-m", "engine.cli", "--log-format", "json", "worker", "--cluster", cluster,
            "--rest", f"127.0.0.1:{port}", "--instance", name, "--state-dir", str(state_dir),
            "--bootstrap-servers", bootstrap, "--task-backoff", "0.2", *extra_args]
    environment = {key: value for key, value in os.environ.items() if key != "EPOCHLINE_API_TOKEN"}
    environment.update(env or {})
    if token is not None:
        environment["EPOCHLINE_API_TOKEN"] = token
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=environment)
    worker = WorkerProcess(name, port, state_dir, log_path, process, token)
    deadline = time.monotonic() + wait_s
    while True:
        if process.poll() is not None:
            raise AssertionError(f"worker {name} exited with {process.returncode}:\n{worker.log_tail()}")
        try:
            with worker.client() as client:
                client.info()
            return worker
        except WorkerApiError:
            if time.monotonic() > deadline:
                worker.kill()
                raise AssertionError(f"worker {name} did not answer within {wait_s}s:\n{worker.log_tail()}") from None
            time.sleep(0.3)


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 60.0, every_s: float = 0.5) -> T:
    """``probe()``'s first truthy answer; an AssertionError naming ``what`` (and the last answer) after the timeout."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last answer: {last!r}")
