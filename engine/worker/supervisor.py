"""One worker's tasks: an ``epochline run`` child process per connector, kept as the configs topic says.

Why child processes: a connector that crashes, leaks or blocks takes only itself down, a config change
restarts only its own connector (the complaint against Connect's rebalances, KAFKA-17105), and the tasks of
one worker use every core. Each task is an instance of its connector's consumer group named after the worker,
so adding a worker adds an instance to every connector and losing one moves its partitions to the rest.

Exactly once across changes rests on the run protocol, not on the supervisor: a task stopped with SIGTERM
commits its epoch and exits (or, killed, leaves an open transaction its successor aborts by fencing: same
``transactional.id``); the next task of that connector on this worker resumes from the committed offsets.
The supervisor only ever has one child per connector, and starts the next after the previous has exited.

Supervision: a task that exits without being asked is restarted after a backoff that doubles with every
failure; ``max_failures`` failures within ``failure_window_s`` make it FAILED with the child's error, until a
restart request resets it.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import orjson
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from engine.config import ConfigError
from engine.worker.child import ERROR_FILE_ENV, PARENT_PID_ENV
from engine.worker.records import ConnectorRecord, TaskError, TaskState, TaskStatus
from engine.worker.store import ClusterStore, StoreError
from engine.worker.task_config import write_task_config

log = logging.getLogger(__name__)
TRACE_LINES = 40


@dataclass(frozen=True)
class SupervisorSettings:
    worker_id: str
    bootstrap: str
    state_dir: Path
    max_failures: int = 5
    failure_window_s: float = 300.0
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    stop_timeout_s: float = 30.0
    """How long a stopping task may take to commit its last epoch before it is killed."""
    status_interval_s: float = 3.0
    tick_s: float = 0.25


@dataclass
class _Child:
    process: subprocess.Popen[bytes]
    version: int
    metrics_port: int
    error_file: Path
    log_file: Path
    started_at: float = field(default_factory=time.monotonic)
    stop_requested_at: float | None = None


class Task:
    """One connector's task on this worker, stepped by the supervisor's loop (never blocks)."""

    def __init__(self, name: str, settings: SupervisorSettings, record: ConnectorRecord) -> None:
        self.name = name
        self._settings = settings
        self._directory = settings.state_dir / "connectors" / name
        self.state: TaskState = "UNASSIGNED"
        self.child: _Child | None = None
        self.restarts = 0
        self.error: TaskError | None = None
        self.trace: str | None = None
        self.dead_letters: int | None = None
        self._failures: deque[float] = deque()
        self._backoff_until = 0.0
        self._seen_restart = record.restart

    @property
    def pid(self) -> int | None:
        return self.child.process.pid if self.child is not None else None

    def step(self, record: ConnectorRecord | None, now: float) -> None:
        """Move one step towards ``record`` (None: the connector was deleted)."""
        self._reap(now)
        if record is None:
            self._stop(now)
            return
        if record.restart != self._seen_restart:
            self._seen_restart = record.restart
            if not record.restart_only_failed or self.state == "FAILED":
                self._reset(now)
        if record.target != "RUNNING":
            self._stop(now)
            if self.child is None:
                self.state = record.target
            return
        if self.child is not None:
            if self.child.version != record.version:
                self.state = "RESTARTING"
                self._stop(now)
            return
        if self.state != "FAILED" and now >= self._backoff_until:
            self._start(record)

    def status(self) -> TaskStatus:
        return TaskStatus(connector=self.name, worker_id=self._settings.worker_id, state=self.state, pid=self.pid,
                          restarts=self.restarts, version=self.child.version if self.child else 0,
                          error=self.error, trace=self.trace, dead_letters=self.dead_letters)

    @property
    def stopped(self) -> bool:
        return self.child is None

    def kill(self) -> None:
        if self.child is not None and self.child.process.poll() is None:
            self.child.process.kill()
            self.child.process.wait(timeout=10)

    def scrape_dead_letters(self) -> None:
        """The child's own count of records sent to the dead-letter topic, from its metrics endpoint."""
        if self.child is None or self.state != "RUNNING":
            return
        found = scrape(self.child.metrics_port, timeout_s=1.0)
        if found is not None:
            self.dead_letters = int(sum(sample.value for family in found for sample in family.samples
                                        if sample.name == "epochline_dead_letters_total"))

    def _reset(self, now: float) -> None:
        self._failures.clear()
        self.error, self.trace, self._backoff_until = None, None, 0.0
        if self.child is not None:
            self._stop(now)
        self.state = "RESTARTING"

    def _start(self, record: ConnectorRecord) -> None:
        port = free_port()
        try:
            path = write_task_config(record.config, self._directory / "config", state_dir=self._directory / "state",
                                     metrics_port=port)
        except (OSError, ConfigError) as error:
            self._fail_now(TaskError(type(error).__name__, str(error), None, _now_text()), None)
            return
        error_file, log_file = self._directory / "error.json", self._directory / "task.log"
        error_file.unlink(missing_ok=True)
        command = [sys.executable, "-m", "engine.cli", "--log-format", "json", "run", str(path),
                   "--instance", self._settings.worker_id, "--bootstrap-servers", self._settings.bootstrap]
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid()), ERROR_FILE_ENV: str(error_file)}
        with open(log_file, "ab") as output:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                       env=env, start_new_session=True)
        self.child = _Child(process, record.version, port, error_file, log_file)
        self.state = "RUNNING"
        log.info("task started", extra={"connector": self.name, "pid": process.pid, "version": record.version})

    def _stop(self, now: float) -> None:
        """SIGTERM (the task commits its epoch and exits); SIGKILL after ``stop_timeout_s``."""
        child = self.child
        if child is None:
            return
        if child.stop_requested_at is None:
            child.stop_requested_at = now
            child.process.terminate()
        elif now - child.stop_requested_at > self._settings.stop_timeout_s:
            log.warning("task did not stop in time: killed", extra={"connector": self.name, "pid": child.process.pid})
            child.process.kill()

    def _reap(self, now: float) -> None:
        child = self.child
        if child is None or (code := child.process.poll()) is None:
            return
        self.child = None
        if child.stop_requested_at is not None:
            log.info("task stopped", extra={"connector": self.name, "pid": child.process.pid, "exit_code": code})
            return
        error, trace = _exit_report(child, code)
        self.restarts += 1
        self._failures.append(now)
        while self._failures and now - self._failures[0] > self._settings.failure_window_s:
            self._failures.popleft()
        if len(self._failures) >= self._settings.max_failures:
            self._fail_now(error, trace)
            return
        backoff = min(self._settings.backoff_s * 2 ** (len(self._failures) - 1), self._settings.max_backoff_s)
        self._backoff_until = now + backoff
        self.state, self.error, self.trace = "RESTARTING", error, trace
        log.warning("task exited: restarting", extra={"connector": self.name, "exit_code": code,
                                                      "error": error.message, "backoff_s": backoff})

    def _fail_now(self, error: TaskError, trace: str | None) -> None:
        self.state, self.error, self.trace = "FAILED", error, trace
        log.error("task failed", extra={"connector": self.name, "error": error.message})


def _exit_report(child: _Child, code: int) -> tuple[TaskError, str | None]:
    """What the child wrote to its error file; else (a crash, a signal) the tail of its log."""
    tail = _tail(child.log_file, TRACE_LINES)
    try:
        report = orjson.loads(child.error_file.read_bytes())
        return TaskError(str(report["type"]), str(report["message"]), code, _now_text()), str(report["trace"])
    except (OSError, ValueError, KeyError):
        reason = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        last = next((line for line in reversed(tail.splitlines()) if line.strip()), "") if tail else ""
        return TaskError("TaskExited", f"the task {reason}" + (f": {last}" if last else ""), code, _now_text()), tail


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 64 * 1024))
            return b"\n".join(handle.read().splitlines()[-lines:]).decode(errors="replace")
    except OSError:
        return ""


def _now_text() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int, timeout_s: float) -> list[Metric] | None:
    """The metric families a task's endpoint serves, or None when it does not answer (starting, stopping)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as response:
            text = response.read().decode()
    except OSError:
        return None
    return list(text_string_to_metric_families(text))


class Supervisor:
    """Reconciles this worker's tasks with the configs topic in a loop of its own thread, and writes their
    status to the status topic (on every change, and every ``status_interval_s`` as a heartbeat)."""

    def __init__(self, store: ClusterStore, settings: SupervisorSettings) -> None:
        self._store = store
        self._settings = settings
        self._tasks: dict[str, Task] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)
        self._published: dict[str, TaskStatus] = {}
        self._last_heartbeat = 0.0

    def start(self) -> None:
        self._thread.start()

    def metrics_ports(self) -> dict[str, int]:
        """Where each running task serves its metrics (the worker's ``/metrics`` re-labels them)."""
        with self._lock:
            return {name: task.child.metrics_port for name, task in self._tasks.items()
                    if task.child is not None and task.state == "RUNNING"}

    def task_states(self) -> dict[str, tuple[TaskState, int]]:
        with self._lock:
            return {name: (task.state, task.restarts) for name, task in self._tasks.items()}

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop every task (each commits its epoch), then the loop; kill what outlives ``timeout_s``."""
        self._stop.set()
        self._thread.join(timeout=(timeout_s or self._settings.stop_timeout_s) + 5)

    def _loop(self) -> None:
        """Tasks are started from this thread, and ``PR_SET_PDEATHSIG`` fires when the thread that forked a
        child ends: so this thread lives exactly as long as the tasks may."""
        while not self._stop.is_set():
            self._tick(time.monotonic())
            self._stop.wait(self._settings.tick_s)
        self._stop_all()

    def _tick(self, now: float) -> None:
        records = self._store.connectors()
        with self._lock:
            for name, record in records.items():
                self._tasks.setdefault(name, Task(name, self._settings, record)).step(record, now)
            for name in [name for name in self._tasks if name not in records]:
                task = self._tasks[name]
                task.step(None, now)
                if task.stopped:
                    del self._tasks[name]
                    self._forget(name)
        self._publish(now)

    def _publish(self, now: float) -> None:
        heartbeat = now - self._last_heartbeat >= self._settings.status_interval_s
        if heartbeat:
            self._last_heartbeat = now
        with self._lock:
            tasks = list(self._tasks.values())
        for task in tasks:
            if heartbeat:
                task.scrape_dead_letters()
            status = task.status()
            published = self._published.get(task.name)
            if heartbeat or published is None or _changed(published, status):
                self._write(status)

    def _write(self, status: TaskStatus) -> None:
        try:
            self._store.put_status(status)
            self._published[status.connector] = status
        except StoreError as error:
            log.warning("cannot write task status", extra={"connector": status.connector, "error": str(error)})

    def _forget(self, name: str) -> None:
        self._published.pop(name, None)
        try:
            self._store.delete_status(name, self._settings.worker_id)
        except StoreError as error:
            log.warning("cannot remove task status", extra={"connector": name, "error": str(error)})

    def _stop_all(self) -> None:
        deadline = time.monotonic() + self._settings.stop_timeout_s
        with self._lock:
            tasks = list(self._tasks.values())
        for task in tasks:
            task.step(None, time.monotonic())
        while any(not task.stopped for task in tasks) and time.monotonic() < deadline:
            time.sleep(0.1)
            for task in tasks:
                task.step(None, time.monotonic())
        for task in tasks:
            task.kill()
            self._forget(task.name)


def _changed(before: TaskStatus, after: TaskStatus) -> bool:
    return (before.state, before.pid, before.restarts, before.version, before.error) != \
        (after.state, after.pid, after.restarts, after.version, after.error)

