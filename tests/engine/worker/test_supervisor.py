"""A worker's supervisor keeps one task process per connector as the configs say, and never two.

The tasks here are stand-ins (``tests/helpers/fake_task.py``) started exactly as real ones would be: a
process per task, stopped with SIGTERM, killed when it will not stop. No Kafka: the cluster's topics are an
in-memory store. Each test steps the tasks itself (or runs the supervisor's loop) under a deadline.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from engine.testing.worker import MemoryClusterStore
from engine.worker.records import ConnectorRecord
from engine.worker.supervisor import TASKS_FOLDER, Supervisor, SupervisorSettings, Task, task_directory, task_launcher
from engine.worker.warm import MAX_EARLY_EXITS
from tests.helpers import REPO_ROOT

FAKE_TASK = (sys.executable, str(REPO_ROOT / "tests" / "helpers" / "fake_task.py"))


def record(name: str, **changes: object) -> ConnectorRecord:
    config = {"name": name, "source": {"topic": "in", "format": "json"}, "sink": {"topic": "out"},
              "dead_letter": {"topic": "dlq"}}
    return replace(ConnectorRecord(name, config), **changes)  # type: ignore[arg-type]


@pytest.fixture
def settings(tmp_path: Path) -> SupervisorSettings:
    return SupervisorSettings(worker_id="w1", bootstrap="127.0.0.1:1", state_dir=tmp_path, max_failures=3,
                              backoff_s=0.05, stop_timeout_s=1.0, status_interval_s=0.2, tick_s=0.05,
                              program=FAKE_TASK)


@pytest.fixture
def tasks() -> Iterator[list[Task]]:
    """Every task a test made; whatever still runs is killed by its PID afterwards."""
    made: list[Task] = []
    yield made
    for task in made:
        task.kill()


def step_until(task: Task, current: Callable[[], ConnectorRecord | None], done: Callable[[], bool],
               timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"task {task.name} stuck in {task.state}"
        task.step(current(), time.monotonic())
        time.sleep(0.02)


def starts(settings: SupervisorSettings, name: str) -> list[int]:
    log = settings.state_dir / "starts" / f"{name}.log"
    return [int(line) for line in log.read_text().split()] if log.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_task_runs_its_connector_and_a_pause_stops_it_with_sigterm(
        settings: SupervisorSettings, tasks: list[Task]) -> None:
    wanted = record("runs-a")
    task = Task("runs-a", settings, wanted)
    tasks.append(task)
    step_until(task, lambda: wanted, lambda: task.state == "RUNNING" and bool(starts(settings, "runs-a")))
    [pid] = starts(settings, "runs-a")
    assert task.pid == pid and alive(pid)
    paused = wanted.with_target("PAUSED")
    step_until(task, lambda: paused, lambda: task.state == "PAUSED")
    assert task.pid is None and not alive(pid) and task.restarts == 0


def test_a_task_that_ignores_sigterm_is_killed_after_the_stop_timeout(
        settings: SupervisorSettings, tasks: list[Task]) -> None:
    wanted = record("stubborn-a")
    task = Task("stubborn-a", settings, wanted)
    tasks.append(task)
    step_until(task, lambda: wanted, lambda: bool(starts(settings, "stubborn-a")))
    time.sleep(0.3)  # let it install its SIGTERM handler
    stopped = wanted.with_target("STOPPED")
    began = time.monotonic()
    resumed_too_early = replace(stopped, target="RUNNING")
    task.step(stopped, time.monotonic())
    # Resumed while still stopping: the stubborn child is waited for and killed before a second one starts.
    step_until(task, lambda: resumed_too_early, lambda: len(starts(settings, "stubborn-a")) == 2)
    assert time.monotonic() - began >= settings.stop_timeout_s
    first, second = starts(settings, "stubborn-a")
    assert not alive(first) and task.pid == second


def test_a_failing_task_restarts_with_backoff_then_is_failed_with_its_error_until_a_restart(
        settings: SupervisorSettings, tasks: list[Task]) -> None:
    wanted = record("fails-a")
    task = Task("fails-a", settings, wanted)
    tasks.append(task)
    step_until(task, lambda: wanted, lambda: task.state == "FAILED")
    assert task.restarts == settings.max_failures == len(starts(settings, "fails-a"))
    assert task.error is not None and task.error.message == "failing on purpose"
    assert (task.error.type, task.error.exit_code) == ("PipelineHalted", 2)
    assert task.trace == "Traceback: failing on purpose"
    for _ in range(5):
        task.step(wanted, time.monotonic())
    assert len(starts(settings, "fails-a")) == settings.max_failures, "a FAILED task was started again"
    restarted = replace(wanted, restart=wanted.restart + 1)
    step_until(task, lambda: restarted, lambda: len(starts(settings, "fails-a")) > settings.max_failures)


def test_a_new_config_restarts_a_running_task_once_and_brings_a_failed_one_back(
        settings: SupervisorSettings, tasks: list[Task]) -> None:
    wanted = record("runs-b")
    task = Task("runs-b", settings, wanted)
    tasks.append(task)
    step_until(task, lambda: wanted, lambda: bool(starts(settings, "runs-b")))
    updated = replace(wanted, version=2)
    step_until(task, lambda: updated, lambda: len(starts(settings, "runs-b")) == 2 and task.state == "RUNNING")
    first, second = starts(settings, "runs-b")
    assert not alive(first) and alive(second) and task.restarts == 0

    failing = record("fails-b")
    broken = Task("fails-b", settings, failing)
    tasks.append(broken)
    step_until(broken, lambda: failing, lambda: broken.state == "FAILED")
    fixed = replace(failing, version=2)
    step_until(broken, lambda: fixed, lambda: len(starts(settings, "fails-b")) > settings.max_failures)


def test_the_supervisor_replaces_a_connector_deleted_and_created_again_and_forgets_a_deleted_one(
        settings: SupervisorSettings) -> None:
    store = MemoryClusterStore()
    store.put_connector(record("runs-c"))
    supervisor = Supervisor(store, settings)
    supervisor.start()
    try:
        wait = time.monotonic() + 20
        while not starts(settings, "runs-c") or not any(s.state == "RUNNING" for s in store.statuses()):
            assert time.monotonic() < wait
            time.sleep(0.05)
        [first] = starts(settings, "runs-c")
        store.delete_connector("runs-c")
        store.put_connector(record("runs-c"))  # a new incarnation, seen in the same tick as the delete
        while len(starts(settings, "runs-c")) < 2:
            assert time.monotonic() < wait
            time.sleep(0.05)
        assert not alive(first)
        store.delete_connector("runs-c")
        while store.statuses():
            assert time.monotonic() < wait, store.statuses()
            time.sleep(0.05)
        assert not any(alive(pid) for pid in starts(settings, "runs-c"))
    finally:
        supervisor.stop()
    assert not supervisor.alive


def test_a_task_starts_in_the_warm_process_made_ahead_and_the_next_one_is_made_once_the_start_settled(
        settings: SupervisorSettings, tasks: list[Task]) -> None:
    launcher = task_launcher(replace(settings, warm_after_s=60.0), warm=True)
    launcher.prepare(time.monotonic())
    warm = launcher.warm_pid
    assert warm is not None and alive(warm)
    try:
        wanted = record("runs-w")
        task = Task("runs-w", settings, wanted, launcher)
        tasks.append(task)
        step_until(task, lambda: wanted, lambda: bool(starts(settings, "runs-w")))
        assert starts(settings, "runs-w") == [warm] and task.pid == warm
        launcher.prepare(time.monotonic())
        assert launcher.warm_pid is None, "a warm process was made while the task was starting"
        launcher.prepare(time.monotonic() + 60.0)
        second = launcher.warm_pid
        assert second not in (None, warm)

        failing = record("fails-w")  # the task's own environment reaches the warm process: its error file
        broken = Task("fails-w", settings, failing, launcher)
        tasks.append(broken)
        step_until(broken, lambda: failing, lambda: bool(starts(settings, "fails-w")) and broken.state != "RUNNING")
        assert broken.error is not None and broken.error.message == "failing on purpose"
        assert broken.restarts == 1 and starts(settings, "fails-w")[0] == second

        paused = wanted.with_target("PAUSED")
        step_until(task, lambda: paused, lambda: task.state == "PAUSED")
        assert not alive(warm), "a task started warm did not stop on SIGTERM"
    finally:
        launcher.close()


def test_a_warm_process_that_died_waiting_is_replaced_until_several_in_a_row_did_then_tasks_start_cold(
        settings: SupervisorSettings, tasks: list[Task], caplog: pytest.LogCaptureFixture) -> None:
    launcher = task_launcher(replace(settings, warm_after_s=0.0), warm=True)
    killed = []
    launcher.prepare(time.monotonic())
    for _ in range(MAX_EARLY_EXITS):
        warm = launcher.warm_pid
        assert warm is not None and warm not in killed, "a warm process that died was not replaced"
        os.kill(warm, signal.SIGKILL)
        killed.append(warm)
        deadline = time.monotonic() + 10
        while alive(warm):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        launcher.prepare(time.monotonic())
    assert launcher.warm_pid is None
    assert caplog.text.count("exited before it was given a task: another is made") == MAX_EARLY_EXITS - 1
    assert "exited before it was given a task: tasks start cold from now on" in caplog.text

    wanted = record("runs-x")
    task = Task("runs-x", settings, wanted, launcher)
    tasks.append(task)
    step_until(task, lambda: wanted, lambda: bool(starts(settings, "runs-x")))
    [pid] = starts(settings, "runs-x")
    assert pid not in killed and task.pid == pid and alive(pid)
    launcher.prepare(time.monotonic() + 60)
    assert launcher.warm_pid is None


def wait_until(what: str, done: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"not {what} within {timeout_s}s"
        time.sleep(0.05)


def test_a_deleted_connector_leaves_nothing_on_disk_on_any_worker_once_its_task_has_stopped(
        settings: SupervisorSettings, tmp_path: Path) -> None:
    """The API's DELETE only removes the record from the configs topic: every worker's supervisor, the one
    that served it or another, sees the deletion there and removes its task's files (config with the literal
    secret, schema files, state, log) after the task has exited. A stubborn task is killed first."""
    store = MemoryClusterStore()
    secret = {"client": {"sasl.password": "hunter2-" + tmp_path.name}}
    deployed = record("stubborn-d")
    store.put_connector(replace(deployed, config={**deployed.config, "kafka": secret}))
    workers = [replace(settings, worker_id=worker, state_dir=tmp_path / worker) for worker in ("w1", "w2")]
    supervisors = [Supervisor(store, worker) for worker in workers]
    for supervisor in supervisors:
        supervisor.start()
    try:
        wait_until("started on both workers", lambda: all(starts(worker, "stubborn-d") for worker in workers))
        folders = [task_directory(worker, "stubborn-d") for worker in workers]
        assert all(secret["client"]["sasl.password"] in (folder / "config" / "config.yaml").read_text()
                   for folder in folders)  # at rest while the connector exists
        store.delete_connector("stubborn-d")
        assert all(folder.exists() for folder in folders)  # its task ignores SIGTERM for stop_timeout_s
        wait_until("the folders removed", lambda: not any(folder.exists() for folder in folders))
        assert not any(alive(pid) for worker in workers for pid in starts(worker, "stubborn-d"))
        assert [path.name for path in (tmp_path / "w1" / TASKS_FOLDER).iterdir()] == []
    finally:
        for supervisor in supervisors:
            supervisor.stop()


def test_a_starting_supervisor_removes_the_folders_of_connectors_no_longer_in_the_cluster(
        settings: SupervisorSettings) -> None:
    """Deleted while the worker was down (or before it removed their files): nothing of them is left."""
    leftover = task_directory(settings, "runs-gone") / "config"
    leftover.mkdir(parents=True)
    (leftover / "config.yaml").write_text("kafka: {client: {sasl.password: hunter2}}\n")
    store = MemoryClusterStore()
    store.put_connector(record("runs-kept"))
    kept_state = task_directory(settings, "runs-kept") / "state" / "checkpoint"
    kept_state.parent.mkdir(parents=True)
    kept_state.write_text("kept")
    supervisor = Supervisor(store, settings)
    supervisor.start()
    try:
        wait_until("runs-kept started", lambda: bool(starts(settings, "runs-kept")))
        assert not task_directory(settings, "runs-gone").exists()
        assert kept_state.read_text() == "kept"
    finally:
        supervisor.stop()
