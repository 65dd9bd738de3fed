"""``CheckpointCoordinator``: operators register their state, checkpoints capture it durably, restores put it back.

Through the public API only: file storage on local disk (new processes included), and the runtime's
changelog storage against the real broker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from connectors.admin import create_topic, end_offsets, group_offsets
from connectors.offset_metadata import committed_epoch
from engine import (
    CheckpointCoordinator,
    CheckpointCoordinatorConfig,
    CheckpointFailed,
    FileCheckpointStorage,
)
from engine.checkpoint import (
    EpochLoop,
    EpochLoopSettings,
    KafkaPipeline,
    OperatorAlreadyRegistered,
    SnapshotFailed,
    UnknownCheckpoint,
)
from engine.config import load_config
from engine.state import CheckpointIdLog, CheckpointNotFound, StoredCheckpointCorrupted
from engine.testing.connectors import produce_values, write_config
from engine.wiring import SOURCE_NAME
from tests.helpers import REPO_ROOT

WAIT_S = 10.0
"""Upper bound of any wait in these tests."""


class Counter:
    """A user operator's state: a number, snapshotted as its decimal bytes."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def snapshot(self) -> bytes:
        return str(self.value).encode()

    def restore(self, snapshot: bytes | None) -> None:
        self.value = int(snapshot) if snapshot is not None else 0


class BrokenSnapshot:
    """An operator whose snapshot raises: the checkpoint must fail."""

    def snapshot(self) -> bytes:
        raise OSError("disk of the operator's own cache is gone")

    def restore(self, snapshot: bytes | None) -> None:
        raise AssertionError("a checkpoint that never completed cannot be restored")


class CountsPerPartition:
    """A keyed operator's state (a ``KeyedState``): a count per source partition, tracking what changed."""

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.changed: set[int] = set()

    def add(self, partition: int, count: int) -> None:
        self.counts[partition] = self.counts.get(partition, 0) + count
        self.changed.add(partition)

    def changed_partitions(self) -> set[int]:
        return set(self.changed)

    def clear_changed(self) -> None:
        self.changed.clear()

    def snapshot_partition(self, partition: int) -> bytes:
        return str(self.counts.get(partition, 0)).encode()

    def restore_partition(self, partition: int, data: bytes | None) -> None:
        self.counts[partition] = int(data) if data is not None else 0

    def drop_partition(self, partition: int) -> None:
        self.counts.pop(partition, None)

    def partitions(self) -> set[int]:
        return set(self.counts)

    def open_until(self) -> dict[int, int]:
        return {}

    def closed_through(self) -> dict[int, int]:
        return {}


def file_coordinator(path: Path) -> CheckpointCoordinator:
    return CheckpointCoordinator.from_config(CheckpointCoordinatorConfig(storage_path=path))


def complete_files(path: Path) -> list[str]:
    return sorted(entry.name for entry in path.iterdir() if entry.suffix == ".checkpoint")


def test_registered_operators_are_restored_to_the_checkpoint_after_their_state_changed(tmp_path: Path) -> None:
    coordinator = file_coordinator(tmp_path)
    orders, users = Counter(3), Counter(7)
    coordinator.register_operator("orders", orders)
    coordinator.register_operator("users", users)
    assert coordinator.operator_count == 2

    taken = coordinator.checkpoint()
    orders.value, users.value = 100, 200
    coordinator.restore_checkpoint(taken)

    assert (orders.value, users.value) == (3, 7)
    assert (coordinator.completed_count, coordinator.latest_checkpoint, coordinator.active_count) == (1, taken, 0)


def test_restoring_an_older_checkpoint_gives_the_state_it_captured(tmp_path: Path) -> None:
    coordinator = file_coordinator(tmp_path)
    orders = Counter(1)
    coordinator.register_operator("orders", orders)
    first = coordinator.checkpoint()
    orders.value = 2
    second = coordinator.checkpoint()

    coordinator.restore_checkpoint(first)
    assert orders.value == 1
    coordinator.restore_checkpoint(second)
    assert orders.value == 2


def test_an_operator_registered_after_a_checkpoint_restores_as_fresh_from_it(tmp_path: Path) -> None:
    coordinator = file_coordinator(tmp_path)
    coordinator.register_operator("orders", Counter(1))
    taken = coordinator.checkpoint()
    late = Counter(9)
    coordinator.register_operator("late", late)

    coordinator.restore_checkpoint(taken)
    assert late.value == 0


def test_a_keyed_operator_is_captured_per_changed_partition_and_restored_per_partition(tmp_path: Path) -> None:
    """Each checkpoint writes only the partitions that changed, yet restores every partition as it stood."""
    coordinator = file_coordinator(tmp_path)
    windows = CountsPerPartition()
    coordinator.register_operator("windows", windows)
    windows.add(0, 5)
    windows.add(1, 7)
    coordinator.checkpoint()
    windows.add(1, 1)  # only partition 1 changes
    second = coordinator.checkpoint()
    assert windows.changed_partitions() == set(), "a completed checkpoint clears what changed"

    windows.add(0, 100)
    windows.add(1, 100)
    coordinator.restore_checkpoint(second)
    assert windows.counts == {0: 5, 1: 8}

    moved_in = CountsPerPartition()  # another instance taking partition 1 over
    other = file_coordinator(tmp_path)
    other.register_operator("windows", moved_in)
    other.restore_partitions([1, 2])
    assert moved_in.counts == {1: 8, 2: 0}


def test_two_operators_cannot_share_a_name(tmp_path: Path) -> None:
    coordinator = file_coordinator(tmp_path)
    coordinator.register_operator("orders", Counter())

    with pytest.raises(OperatorAlreadyRegistered, match="'orders'"):
        coordinator.register_operator("orders", Counter())
    assert coordinator.operator_count == 1


def test_with_storage_puts_another_storage_behind_the_coordinator(tmp_path: Path) -> None:
    elsewhere = FileCheckpointStorage(tmp_path / "elsewhere")
    coordinator = CheckpointCoordinator.new(CheckpointIdLog(tmp_path / "ids.log")).with_storage(elsewhere)
    orders = Counter(8)
    coordinator.register_operator("orders", orders)
    taken = coordinator.checkpoint()

    assert coordinator.storage is elsewhere and elsewhere.completed() == [taken]
    assert not (tmp_path / "checkpoints").exists()


def test_a_failing_snapshot_is_never_reported_as_success(tmp_path: Path) -> None:
    coordinator = file_coordinator(tmp_path)
    coordinator.register_operator("orders", Counter(1))
    good = coordinator.checkpoint()
    coordinator.register_operator("broken", BrokenSnapshot())

    with pytest.raises(SnapshotFailed) as failure:
        coordinator.checkpoint()

    assert failure.value.operator == "broken" and "disk of the operator's own cache is gone" in str(failure.value)
    assert (coordinator.completed_count, coordinator.latest_checkpoint, coordinator.active_count) == (1, good, 0)
    assert complete_files(tmp_path) == [f"{good}.checkpoint"]
    assert not list(tmp_path.glob("*.pending"))
    with pytest.raises(CheckpointNotFound):
        coordinator.restore_checkpoint(failure.value.checkpoint_id)


def test_a_triggered_checkpoint_is_active_until_completed_or_failed(tmp_path: Path) -> None:
    coordinator = file_coordinator(tmp_path)
    coordinator.register_operator("orders", Counter(5))

    kept = coordinator.trigger_checkpoint()
    dropped = coordinator.trigger_checkpoint()
    assert coordinator.active_count == 2
    assert [m.checkpoint_id for m in coordinator.active_metadata] == [kept.checkpoint_id, dropped.checkpoint_id]
    assert dropped.checkpoint_id > kept.checkpoint_id

    coordinator.capture_checkpoint(kept.checkpoint_id)
    assert coordinator.completed_count == 0, "captured is not complete"
    coordinator.complete_checkpoint(kept.checkpoint_id, success=True)
    coordinator.complete_checkpoint(dropped.checkpoint_id, success=False)

    assert (coordinator.active_count, coordinator.completed_count) == (0, 1)
    assert coordinator.latest_checkpoint == kept.checkpoint_id
    with pytest.raises(UnknownCheckpoint):
        coordinator.complete_checkpoint(kept.checkpoint_id, success=True)


def test_clear_old_checkpoints_keeps_the_newest_n_and_each_kept_one_still_restores(tmp_path: Path) -> None:
    coordinator = file_coordinator(tmp_path)
    orders = Counter()
    coordinator.register_operator("orders", orders)
    taken = []
    for value in range(5):
        orders.value = value
        taken.append(coordinator.checkpoint())

    removed = coordinator.clear_old_checkpoints(keep=2)

    assert removed == taken[:3]
    assert complete_files(tmp_path) == [f"{checkpoint_id}.checkpoint" for checkpoint_id in taken[3:]]
    assert coordinator.completed_count == 2
    coordinator.restore_checkpoint(taken[3])
    assert orders.value == 3
    with pytest.raises(CheckpointNotFound):
        coordinator.restore_checkpoint(taken[0])


def test_a_checkpoint_file_that_does_not_match_its_checksum_is_refused(tmp_path: Path) -> None:
    coordinator = file_coordinator(tmp_path)
    coordinator.register_operator("orders", Counter(42))
    taken = coordinator.checkpoint()
    stored = tmp_path / f"{taken}.checkpoint"
    stored.write_bytes(stored.read_bytes().replace(b"\"orders\"", b"\"ordxrs\""))

    with pytest.raises(StoredCheckpointCorrupted, match=str(stored)):
        coordinator.restore_checkpoint(taken)


def test_periodic_checkpointing_takes_checkpoints_until_stopped(tmp_path: Path) -> None:
    coordinator = file_coordinator(tmp_path)
    orders = Counter()
    coordinator.register_operator("orders", orders)

    periodic = coordinator.start_periodic_checkpointing(interval=0.05)
    deadline = time.monotonic() + WAIT_S
    while coordinator.completed_count < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    periodic.stop(timeout=WAIT_S)

    assert coordinator.completed_count >= 3 and not periodic.running and periodic.failures == []
    after_stop = coordinator.completed_count
    time.sleep(0.2)
    assert coordinator.completed_count == after_stop


def test_periodic_checkpointing_reports_a_failing_snapshot_and_completes_nothing(tmp_path: Path) -> None:
    coordinator = file_coordinator(tmp_path)
    coordinator.register_operator("broken", BrokenSnapshot())

    with coordinator.start_periodic_checkpointing(interval=0.05) as periodic:
        deadline = time.monotonic() + WAIT_S
        while not periodic.failures and time.monotonic() < deadline:
            time.sleep(0.01)

    assert periodic.failures and all(isinstance(failure, CheckpointFailed) for failure in periodic.failures)
    assert (coordinator.completed_count, coordinator.latest_checkpoint) == (0, None)


def test_the_default_file_storage_lives_beside_the_id_log(tmp_path: Path) -> None:
    coordinator = CheckpointCoordinator.new(CheckpointIdLog(tmp_path / "ids.log"))
    coordinator.register_operator("orders", Counter(1))
    taken = coordinator.checkpoint()

    assert complete_files(tmp_path / "checkpoints") == [f"{taken}.checkpoint"]
    assert isinstance(coordinator.storage, FileCheckpointStorage)


PROCESS_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from engine import CheckpointCoordinator, CheckpointCoordinatorConfig

    class Counter:
        def __init__(self):
            self.value = 0
        def snapshot(self):
            return str(self.value).encode()
        def restore(self, snapshot):
            self.value = int(snapshot) if snapshot is not None else 0

    action, path = sys.argv[1], Path(sys.argv[2])
    coordinator = CheckpointCoordinator.from_config(CheckpointCoordinatorConfig(storage_path=path))
    counter = Counter()
    coordinator.register_operator("counter", counter)
    if action == "write":
        counter.value = int(sys.argv[3])
        print(coordinator.checkpoint())
    elif action == "burn":
        print(coordinator.trigger_checkpoint().checkpoint_id)
    else:
        coordinator.restore_checkpoint(coordinator.latest_checkpoint)
        print(coordinator.latest_checkpoint, counter.value)
""")


def in_new_process(*args: str) -> str:
    """Run ``PROCESS_SCRIPT`` in a fresh interpreter; its stdout."""
    done = subprocess.run([sys.executable, "-c", PROCESS_SCRIPT, *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_checkpoint_written_by_one_process_is_restored_by_another(tmp_path: Path) -> None:
    written = in_new_process("write", str(tmp_path), "41")

    assert in_new_process("restore", str(tmp_path)) == f"{written} 41"


def test_checkpoint_ids_are_never_reused_across_processes_even_when_abandoned(tmp_path: Path) -> None:
    first = int(in_new_process("write", str(tmp_path), "1"))
    burned = int(in_new_process("burn", str(tmp_path)))  # reserved, then the process exited without it
    second = int(in_new_process("write", str(tmp_path), "2"))

    assert first < burned < second


# -- the runtime's window state goes through its pipeline's coordinator (real broker) -------------------------

PARTITIONS = 2


def test_a_connectors_window_state_is_checkpointed_through_its_coordinator_and_restored_after_a_restart(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    """The window's open windows are captured by the pipeline's coordinator into the changelog inside the
    epoch's transaction; the checkpoint it completed is the one the group's offsets name; a new pipeline
    (a restart) gets exactly that state back through its own coordinator."""
    config = load_config(write_config(tmp_path, {
        "name": f"coord-{unique_topic}",
        "source": {"topic": f"{unique_topic}-in", "format": "json", "event_time": {"column": "ts"}},
        "transform": [{"window": {"kind": "tumbling", "size": "1h", "key": ["__kafka_key"],
                                  "aggregates": {"total": "sum(amount)"}}}],
        "sink": {"topic": f"{unique_topic}-out", "format": "json"},
        "dead_letter": {"topic": f"{unique_topic}-dlq"},
        "checkpoint": {"interval": "200ms", "dir": str(tmp_path / "state")},
    }))
    for topic in (config.source.topic, config.sink.topic, f"{unique_topic}-dlq"):
        create_topic(kafka_bootstrap, topic, PARTITIONS)
    produce_values(kafka_bootstrap, config.source.topic,  # one open hour-long window per key: nothing emitted
                   [orjson.dumps({"amount": float(i), "ts": 1_700_000_000_000 + i}) for i in range(40)], PARTITIONS,
                   key_of=lambda i: (i % PARTITIONS, f"key-{i % PARTITIONS}".encode()))

    first = KafkaPipeline(config, kafka_bootstrap)
    ends = {SOURCE_NAME: end_offsets(kafka_bootstrap, config.source.topic)}
    EpochLoop(first, EpochLoopSettings(checkpoint_interval_s=0.2, stop_at=ends)).run()

    assert first.checkpoints.operator_count == 1
    offsets = group_offsets(kafka_bootstrap, config.group_id, config.source.topic, list(range(PARTITIONS)))
    committed = [committed_epoch(offset.metadata) for offset in offsets]
    assert {epoch.checkpoint_id if epoch else None for epoch in committed} == {first.checkpoints.latest_checkpoint}
    [(operator, window)] = first.chain.states.items()
    committed_state = {partition: window.snapshot_partition(partition) for partition in range(PARTITIONS)}
    assert window.partitions() == set(range(PARTITIONS)), "the test needs open windows on every partition"

    restarted = KafkaPipeline(config, kafka_bootstrap)
    try:
        restored = restarted.checkpoints.restore_partitions(range(PARTITIONS))
        again = restarted.chain.states[operator]
        assert {partition: again.snapshot_partition(partition) for partition in range(PARTITIONS)} == committed_state
        assert restored[operator].size_bytes == sum(map(len, committed_state.values()))
    finally:
        restarted.close_sinks()


def readme_checkpoints_example() -> str:
    """The Python block of the README's "Checkpoints" section."""
    section = (REPO_ROOT / "README.md").read_text().split("### Checkpoints\n", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_checkpoints_example_runs_as_written(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", readme_checkpoints_example()], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, check=False)

    assert done.returncode == 0, done.stderr
    assert complete_files(tmp_path / "my-state"), "the example's checkpoints are on disk"
