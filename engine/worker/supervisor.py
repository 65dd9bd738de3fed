"""One worker's tasks: an ``epochline run`` child process per connector, kept as the configs topic says.

Why child processes: a connector that crashes, leaks or blocks takes only itself down, a config change
restarts only its own connector (the complaint against Connect's rebalances, KAFKA-17105), and the tasks of
one worker use every core. Each task is an instance of its connector's consumer group named after the worker,
so adding a worker adds an instance to every connector and losing one moves its partitions to the rest.

Exactly once across changes rests on the run protocol, not on the supervisor: a task stopped with SIGTERM
commits its epoch and exits (or, killed, leaves an open transaction its successor aborts by fencing: same
``transactional.id``); the next task of that connector on this worker resumes from the committed offsets.
The supervisor only ever has one child per connector, and starts the next after the previous has exited.

A task starts in the warm process the worker keeps ahead when there is one (``engine.worker.warm``: an
interpreter with a task's modules imported, waiting for its command line), else in a new process; either way
it is this worker's child, stopped and reaped alike.

Supervision: a task that exits without being asked is restarted after a backoff that doubles with every
failure; ``max_failures`` failures within ``failure_window_s`` make it FAILED with the child's error, until a
restart request resets it.

A task keeps its files in ``<state dir>/connectors/<name>/`` (config, schema files, state, log). Its config
may hold literal secrets, so nothing of a deleted connector is kept: the folder is removed once the task has
exited, on every worker (each reads the deletion from the configs topic), and at start for connectors no
longer in the cluster.
"""

from __future__ import annotations

import http.client
import logging
import os
import shutil
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
from engine.ports import free_port
from engine.secrets import without_url_credentials
from engine.worker.child import ERROR_FILE_ENV, PARENT_PID_ENV
from engine.worker.errors import StoreError
from engine.worker.records import STATUS_TTL_S, ConnectorRecord, TaskError, TaskState, TaskStatus
from engine.worker.store import ClusterStore
from engine.worker.task_config import write_task_config
from engine.worker.warm import TaskLauncher

log = logging.getLogger(__name__)
TRACE_LINES = 40
FORGET_AFTER_S = 10 * STATUS_TTL_S
"""A status not rewritten for this long is removed: its worker is not coming back soon."""
TASKS_FOLDER = "connectors"
"""The folder of the worker's state dir that holds one folder per connector task (``task_directory``)."""
WORKER_ONLY_ENV = frozenset({"EPOCHLINE_API_TOKEN"})
"""What a task does not inherit from its worker: the API token is the worker's, not the connector's."""


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
    program: tuple[str, ...] = (sys.executable, "-m", "engine.cli")
    """What a task runs: ``<program> --log-format json run CONFIG --instance W --bootstrap-servers B``
    (the specifications put a stand-in here to drive the supervisor without Kafka)."""
    warm_task: bool = True
    """Keep a process ahead with a task's modules imported, to start the next task in (``engine.worker.warm``)."""
    warm_after_s: float = 5.0
    """How long after a task's start the next warm process is made (its imports would slow that start)."""


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
    """One connector's task on this worker, stepped by the supervisor's loop (steps send signals and start
    processes, they never wait for one)."""

    def __init__(self, name: str, settings: SupervisorSettings, record: ConnectorRecord,
                 launcher: TaskLauncher | None = None) -> None:
        self.name = name
        self._launcher = launcher or task_launcher(settings, warm=False)
        self.incarnation = record.incarnation
        self._settings = settings
        self._directory = task_directory(settings, name)
        self.state: TaskState = "UNASSIGNED"
        self.child: _Child | None = None
        self.restarts = 0
        self.error: TaskError | None = None
        self.trace: str | None = None
        self._failures: deque[float] = deque()
        self._backoff_until = 0.0
        self._seen_restart = record.restart
        self._seen_version = record.version

    @property
    def pid(self) -> int | None:
        return self.child.process.pid if self.child is not None else None

    def step(self, record: ConnectorRecord | None, now: float) -> None:
        """Move one step towards ``record`` (None: the connector was deleted). A child asked to stop is
        waited for (and killed after ``stop_timeout_s``) before anything else happens."""
        self._reap(now)
        if self.child is not None and self.child.stop_requested_at is not None:
            self._stop(now)
            return
        if record is None:
            self._stop(now)
            return
        if record.restart != self._seen_restart or record.version != self._seen_version:
            restart_requested = record.restart != self._seen_restart
            self._seen_restart, self._seen_version = record.restart, record.version
            if not restart_requested or not record.restart_only_failed or self.state == "FAILED":
                self._reset(now)
        if record.target != "RUNNING":
            self._stop(now)
            if self.child is None:
                self.state = record.target
            return
        if self.child is None and self.state != "FAILED" and now >= self._backoff_until:
            self._start(record, now)

    def status(self) -> TaskStatus:
        return TaskStatus(connector=self.name, worker_id=self._settings.worker_id, state=self.state, pid=self.pid,
                          restarts=self.restarts, version=self.child.version if self.child else 0,
                          error=self.error, trace=self.trace)

    @property
    def stopped(self) -> bool:
        return self.child is None

    def kill(self) -> None:
        if self.child is not None and self.child.process.poll() is None:
            self.child.process.kill()
            self.child.process.wait(timeout=10)

    def remove_files(self) -> None:
        """Remove everything the task kept on disk: its config (which may hold literal secrets), schema files,
        state and log. Called once the connector is deleted and the task has stopped."""
        remove_task_files(self._directory)

    def _reset(self, now: float) -> None:
        """A restart request or a new config: failures are forgotten, a running child is stopped first."""
        self._failures.clear()
        self.error, self.trace, self._backoff_until = None, None, 0.0
        if self.child is not None:
            self._stop(now)
            self.state = "RESTARTING"
        elif self.state == "FAILED":
            self.state = "RESTARTING"

    def _start(self, record: ConnectorRecord, now: float) -> None:
        port = free_port()
        try:
            path = write_task_config(record.config, self._directory / "config", state_dir=self._directory / "state",
                                     metrics_port=port)
        except ConfigError as error:  # validated when stored, so only a config from a newer version gets here
            self._fail_now(TaskError(type(error).__name__, str(error), None, _now_text()), None)
            return
        except OSError as error:
            self._failed(TaskError(type(error).__name__, str(error), None, _now_text()), None, time.monotonic())
            return
        error_file, log_file = self._directory / "error.json", self._directory / "task.log"
        error_file.unlink(missing_ok=True)
        arguments = ["--log-format", "json", "run", str(path), "--instance", self._settings.worker_id,
                     "--bootstrap-servers", self._settings.bootstrap]
        process = self._launcher.launch(arguments, {ERROR_FILE_ENV: str(error_file)}, log_file, now)
        self.child = _Child(process, record.version, port, error_file, log_file)
        self.state, self.error, self.trace = "RUNNING", None, None
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
        self._failed(*_exit_report(child, code), now)

    def _failed(self, error: TaskError, trace: str | None, now: float) -> None:
        """An exit nobody asked for: FAILED after ``max_failures`` within the window, else a backoff."""
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
        log.warning("task exited: restarting", extra={"connector": self.name, "exit_code": error.exit_code,
                                                      "error": error.message, "backoff_s": backoff})

    def _fail_now(self, error: TaskError, trace: str | None) -> None:
        self.state, self.error, self.trace = "FAILED", error, trace
        log.error("task failed", extra={"connector": self.name, "error": error.message})


def task_directory(settings: SupervisorSettings, name: str) -> Path:
    """Where connector ``name``'s task keeps its config, state and log on this worker."""
    return settings.state_dir / TASKS_FOLDER / name


def remove_task_files(directory: Path) -> None:
    try:
        shutil.rmtree(directory)
    except FileNotFoundError:
        pass
    except OSError as error:
        log.warning("cannot remove a deleted connector's files", extra={"directory": str(directory),
                                                                         "error": str(error)})
    else:
        log.info("removed a deleted connector's files", extra={"directory": str(directory)})


def task_launcher(settings: SupervisorSettings, *, warm: bool) -> TaskLauncher:
    """A launcher of ``settings.program``, whose tasks get the worker's environment (less what is the worker's
    only) and are killed with it."""
    env = {key: value for key, value in os.environ.items() if key not in WORKER_ONLY_ENV}
    env[PARENT_PID_ENV] = str(os.getpid())
    return TaskLauncher(settings.program, env, settings.state_dir, warm=warm, settle_s=settings.warm_after_s)


def _exit_report(child: _Child, code: int) -> tuple[TaskError, str | None]:
    """What the child wrote to its error file; else (a crash, a signal) the tail of its log. Credentials in
    URLs (a registry's) are redacted: the report goes to the status topic, the API and the log."""
    tail = without_url_credentials(_tail(child.log_file, TRACE_LINES))
    try:
        report = orjson.loads(child.error_file.read_bytes())
        message, trace = (without_url_credentials(str(report[key])) for key in ("message", "trace"))
        return TaskError(str(report["type"]), message, code, _now_text()), trace
    except (OSError, ValueError, KeyError, TypeError):
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


def scrape(port: int, timeout_s: float) -> list[Metric] | None:
    """The metric families a task's endpoint serves, or None when it does not answer (starting, stopping)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as response:
            return list(text_string_to_metric_families(response.read().decode()))
    except (OSError, ValueError, http.client.HTTPException):  # starting, dying mid-answer, or not our server
        return None


class Supervisor:
    """Reconciles this worker's tasks with the configs topic in a loop of its own thread, and writes their
    status to the status topic (on every change, and every ``status_interval_s`` as a heartbeat)."""

    def __init__(self, store: ClusterStore, settings: SupervisorSettings) -> None:
        self._store = store
        self._settings = settings
        self._tasks: dict[str, Task] = {}
        self._launcher = task_launcher(settings, warm=settings.warm_task)
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

    @property
    def alive(self) -> bool:
        """False once the loop has ended: then no task runs (they die with this thread)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop every task (each commits its epoch; what outlives ``stop_timeout_s`` is killed), then the loop."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=self._settings.stop_timeout_s + 30)

    def _loop(self) -> None:
        """Tasks are started from this thread, and ``PR_SET_PDEATHSIG`` fires when the thread that forked a
        child ends: so this thread lives exactly as long as the tasks may, and no failure ends it early."""
        self._remove_leftovers()
        while not self._stop.is_set():
            try:
                self._tick(time.monotonic())
            except Exception:
                log.exception("supervising the tasks failed; trying again")
            self._stop.wait(self._settings.tick_s)
        self._stop_all()

    def _tick(self, now: float) -> None:
        records = self._store.connectors()
        with self._lock:
            for name, record in records.items():
                if self._stop.is_set():
                    return
                self._step(name, record, now)
            for name in [name for name in self._tasks if name not in records]:
                self._step(name, None, now)
            self._launcher.prepare(now)
        self._publish(now)

    def _step(self, name: str, record: ConnectorRecord | None, now: float) -> None:
        """Step one task; a connector deleted and created again between two ticks (another incarnation)
        first has its old task stopped, as for a delete."""
        task = self._tasks.get(name)
        replaced = task is not None and record is not None and task.incarnation != record.incarnation
        if task is None and record is not None:
            task = self._tasks[name] = Task(name, self._settings, record, self._launcher)
        assert task is not None
        try:
            task.step(None if replaced else record, now)
        except Exception:
            log.exception("a task step failed", extra={"connector": name})
        if (record is None or replaced) and task.stopped:
            del self._tasks[name]
            task.remove_files()
            if record is None:
                self._forget(name)

    def _remove_leftovers(self) -> None:
        """At start, remove the folders of connectors no longer in the cluster: deleted while this worker was
        down, or before it had removed their files. The store has read the whole configs topic by now, and
        no task of this supervisor has started yet."""
        existing = self._store.connectors()
        folder = self._settings.state_dir / TASKS_FOLDER
        for directory in sorted(folder.iterdir()) if folder.is_dir() else []:
            if directory.is_dir() and directory.name not in existing:
                remove_task_files(directory)

    def _publish(self, now: float) -> None:
        heartbeat = now - self._last_heartbeat >= self._settings.status_interval_s
        if heartbeat:
            self._last_heartbeat = now
        with self._lock:
            tasks = list(self._tasks.values())
        if heartbeat:
            self._forget_gone_workers()
        for task in tasks:
            if self._stop.is_set():
                return
            status = task.status()
            published = self._published.get(task.name)
            if heartbeat or published is None or _changed(published, status):
                self._write(status)

    def _forget_gone_workers(self) -> None:
        """Remove the statuses of workers that stopped rewriting them long ago (killed, or gone for good),
        so the status topic holds live tasks; any worker may do it, and a worker that comes back rewrites its own."""
        now = time.time()
        for status in self._store.statuses():
            if status.worker_id != self._settings.worker_id and now - status.updated_at > FORGET_AFTER_S:
                try:
                    self._store.delete_status(status.connector, status.worker_id)
                except StoreError as error:
                    log.warning("cannot remove a gone worker's status", extra={"error": str(error)})

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
        self._launcher.close()


def _changed(before: TaskStatus, after: TaskStatus) -> bool:
    return (before.state, before.pid, before.restarts, before.version, before.error) != \
        (after.state, after.pid, after.restarts, after.version, after.error)

