"""Checkpoint storage: ids are never reused, state is durable and verified, success is never claimed falsely."""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.state import (
    CheckpointCaptureFailed,
    CheckpointCoordinator,
    CheckpointCorrupted,
    CheckpointError,
    CheckpointIdLog,
    CheckpointMetadata,
    CheckpointNotFound,
    CheckpointPersistFailed,
    CheckpointStateMismatch,
    FileCheckpointStorage,
)

pytestmark = pytest.mark.timeout(10)


class BytesState:
    def __init__(self, value: bytes = b"") -> None:
        self.value = value

    def snapshot(self) -> bytes:
        return self.value

    def restore(self, data: bytes) -> None:
        self.value = data


class FailingState(BytesState):
    def snapshot(self) -> bytes:
        raise RuntimeError("state is inconsistent")


class BlockingState(BytesState):
    """Blocks in ``snapshot`` until released, like an operator stuck on a lock or slow I/O."""

    def __init__(self) -> None:
        super().__init__(b"late state")
        self.release = threading.Event()

    def snapshot(self) -> bytes:
        self.release.wait(5)
        return self.value


@pytest.fixture
def coordinator(tmp_path: Path) -> CheckpointCoordinator:
    return CheckpointCoordinator.from_config({"path": tmp_path / "checkpoints"})


def _checkpoint_files(coordinator: CheckpointCoordinator) -> list[str]:
    return sorted(p.name for p in coordinator.storage.directory.iterdir() if p.name != "ids.log")


def _wait_until(condition: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def _collect_error(errors: list[Exception], action: Callable[[], None]) -> None:
    try:
        action()
    except Exception as error:  # noqa: BLE001 - handed to the test thread to assert on
        errors.append(error)


def _join_attempt_threads() -> None:
    for thread in threading.enumerate():
        if thread.name.startswith("epochline-checkpoint-"):
            thread.join(5)


def test_registering_a_name_again_replaces_the_operator(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("counts", BytesState(b"old"))
    coordinator.register_operator("counts", BytesState(b"newer"))

    metadata = coordinator.checkpoint()

    assert coordinator.storage.read(metadata.checkpoint_id).blobs == {"counts": b"newer"}


def test_trigger_captures_every_operator_with_its_real_total_size(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("window", BytesState(b"abc"))
    coordinator.register_operator("dedup", BytesState(b"12345"))

    metadata = coordinator.trigger_checkpoint(extra={"source": "orders:0=17"})

    assert metadata.operators == {"window": 3, "dedup": 5}
    assert metadata.total_bytes == 8
    assert metadata.extra == {"source": "orders:0=17"}
    assert coordinator.active_count() == 1


def test_failing_snapshot_registers_no_active_checkpoint_and_burns_the_id(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("good", BytesState(b"x"))
    coordinator.register_operator("bad", FailingState())
    checkpoint_id = coordinator.reserve_id()

    with pytest.raises(CheckpointCaptureFailed, match="'bad'"):
        coordinator.trigger_checkpoint(checkpoint_id)

    assert coordinator.active_count() == 0
    assert coordinator.reserve_id() > checkpoint_id
    with pytest.raises(CheckpointError, match="never reused"):
        coordinator.trigger_checkpoint(checkpoint_id)


def test_checkpoint_reports_no_success_when_capture_fails(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("bad", FailingState())

    with pytest.raises(CheckpointCaptureFailed):
        coordinator.checkpoint()

    assert (coordinator.completed_count(), coordinator.failed_count(), coordinator.active_count()) == (0, 1, 0)
    assert coordinator.latest_checkpoint() is None
    assert _checkpoint_files(coordinator) == []


def test_checkpoint_reports_no_success_when_the_rename_fails(
    coordinator: CheckpointCoordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator.register_operator("window", BytesState(b"state"))

    def disk_full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(CheckpointPersistFailed, match="No space left"):
        coordinator.checkpoint()

    assert (coordinator.completed_count(), coordinator.failed_count(), coordinator.active_count()) == (0, 1, 0)
    assert _checkpoint_files(coordinator) == []  # the temp file is gone too


def test_checkpoint_reports_no_success_when_fsync_of_the_state_fails(
    coordinator: CheckpointCoordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator.register_operator("window", BytesState(b"state"))
    real_fsync = os.fsync

    def failing_fsync_of_checkpoint_files(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".ckpt.tmp"):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync_of_checkpoint_files)
    with pytest.raises(CheckpointPersistFailed, match="Input/output error"):
        coordinator.checkpoint()

    assert (coordinator.completed_count(), coordinator.failed_count()) == (0, 1)
    assert _checkpoint_files(coordinator) == []


def test_completing_successfully_requires_persisted_state(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("window", BytesState(b"state"))
    metadata = coordinator.trigger_checkpoint()

    with pytest.raises(CheckpointError, match="not persisted"):
        coordinator.complete_checkpoint(metadata.checkpoint_id, success=True)

    assert coordinator.completed_count() == 0


def test_failed_completion_drops_the_active_checkpoint_and_deletes_its_file(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("window", BytesState(b"state"))
    metadata = coordinator.trigger_checkpoint()
    coordinator.persist(metadata.checkpoint_id)

    coordinator.complete_checkpoint(metadata.checkpoint_id, success=False)

    assert coordinator.active_count() == 0
    assert coordinator.storage.ids() == []


def test_persist_fsyncs_the_file_then_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = FileCheckpointStorage(tmp_path)
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append("directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    storage.write(CheckpointMetadata(1, time.time(), 2, {"op": 2}), {"op": b"ab"})

    assert synced == ["file", "directory"]


def test_stored_checkpoint_reads_back_exactly(tmp_path: Path) -> None:
    storage = FileCheckpointStorage(tmp_path)
    metadata = CheckpointMetadata(7, 1700000000.5, 4, {"a": 1, "b": 3}, {"offsets": "t:0=5"})

    storage.write(metadata, {"a": b"\x00", "b": b"xyz"})

    assert storage.read(7).metadata == metadata
    assert storage.read(7).blobs == {"a": b"\x00", "b": b"xyz"}


def test_restore_routes_each_blob_to_the_operator_of_its_name(tmp_path: Path) -> None:
    config = {"path": tmp_path}
    first = CheckpointCoordinator.from_config(config)
    first.register_operator("left", BytesState(b"L"))
    first.register_operator("right", BytesState(b"RR"))
    saved = first.checkpoint()

    left, right = BytesState(), BytesState()
    second = CheckpointCoordinator.from_config(config)
    second.register_operator("right", right)
    second.register_operator("left", left)
    second.restore_checkpoint(saved.checkpoint_id)

    assert (left.value, right.value) == (b"L", b"RR")
    assert second.latest_checkpoint() == saved


def test_restore_rejects_state_for_an_unregistered_operator(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("old-name", BytesState(b"x"))
    saved = coordinator.checkpoint()
    coordinator.register_operator("new-name", BytesState())

    with pytest.raises(CheckpointStateMismatch, match=r"unregistered operators \['old-name'\]"):
        CheckpointCoordinator(coordinator.storage, coordinator.id_log).restore_checkpoint(saved.checkpoint_id)


def test_restore_rejects_a_registered_operator_without_state(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("window", BytesState(b"x"))
    saved = coordinator.checkpoint()
    untouched = BytesState(b"current")
    coordinator.register_operator("added-later", untouched)

    with pytest.raises(CheckpointStateMismatch, match=r"registered operators \['added-later'\]"):
        coordinator.restore_checkpoint(saved.checkpoint_id)
    assert untouched.value == b"current"


def test_restoring_a_missing_id_raises_not_found(coordinator: CheckpointCoordinator) -> None:
    with pytest.raises(CheckpointNotFound):
        coordinator.restore_checkpoint(42)


def test_flipped_byte_is_detected_as_corruption_naming_the_file(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("window", BytesState(b"precious state"))
    saved = coordinator.checkpoint()
    path = coordinator.storage.path_of(saved.checkpoint_id)
    content = bytearray(path.read_bytes())
    content[-40] ^= 0x01
    path.write_bytes(content)

    with pytest.raises(CheckpointCorrupted, match="checksum") as raised:
        coordinator.restore_checkpoint(saved.checkpoint_id)
    assert raised.value.path == path
    assert str(path) in str(raised.value)


def test_truncated_file_is_detected_as_corruption(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("window", BytesState(b"precious state"))
    saved = coordinator.checkpoint()
    path = coordinator.storage.path_of(saved.checkpoint_id)
    path.write_bytes(path.read_bytes()[:-10])

    with pytest.raises(CheckpointCorrupted):
        coordinator.storage.read(saved.checkpoint_id)


def test_restore_latest_valid_falls_back_to_the_previous_checkpoint_with_a_warning(
    coordinator: CheckpointCoordinator, caplog: pytest.LogCaptureFixture
) -> None:
    state = BytesState(b"first")
    coordinator.register_operator("window", state)
    first = coordinator.checkpoint()
    state.value = b"second"
    second = coordinator.checkpoint()
    newest = coordinator.storage.path_of(second.checkpoint_id)
    newest.write_bytes(newest.read_bytes()[:25])

    with caplog.at_level(logging.WARNING, logger="engine.state.files"):
        restored = coordinator.restore_latest_valid()

    assert restored == first
    assert state.value == b"first"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [(vars(r)["checkpoint_id"], vars(r)["file"]) for r in warnings] == [(second.checkpoint_id, str(newest))]


def test_latest_valid_ignores_ids_above_at_most(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("window", BytesState(b"x"))
    first = coordinator.checkpoint()
    coordinator.checkpoint()

    found = coordinator.storage.latest_valid(at_most=first.checkpoint_id)

    assert found is not None and found.metadata == first


def test_reserved_ids_are_never_reused_after_a_crash(tmp_path: Path) -> None:
    log_path = tmp_path / "ids.log"
    before = [CheckpointIdLog(log_path).reserve() for _ in range(2)]
    crashed = CheckpointIdLog(log_path)
    before += [crashed.reserve(), crashed.reserve()]
    del crashed  # the process dies: nothing but the file survives

    reopened = CheckpointIdLog(log_path)

    assert reopened.highest_reserved() == max(before)
    assert reopened.reserve() > max(before)
    assert len(set(before)) == len(before)


@pytest.mark.parametrize("torn_tail", [b"5", b"\x00\x00"], ids=["partial-digits", "zero-filled"])
def test_torn_last_line_burns_the_id_being_written(tmp_path: Path, torn_tail: bytes) -> None:
    log_path = tmp_path / "ids.log"
    ids = CheckpointIdLog(log_path)
    returned = [ids.reserve() for _ in range(4)]
    with open(log_path, "ab") as handle:  # crash in the middle of appending id 5
        handle.write(torn_tail)

    reopened = CheckpointIdLog(log_path)

    assert reopened.reserve() == max(returned) + 2
    assert CheckpointIdLog(log_path).reserve() == max(returned) + 3


def test_unparsable_complete_line_in_the_id_log_is_reported_as_corruption(tmp_path: Path) -> None:
    log_path = tmp_path / "ids.log"
    log_path.write_bytes(b"1\ngarbage\n3\n")

    with pytest.raises(CheckpointCorrupted, match="line 2"):
        CheckpointIdLog(log_path)


def test_coordinator_reserves_above_existing_checkpoint_files_when_the_id_log_is_lost(tmp_path: Path) -> None:
    first = CheckpointCoordinator.from_config({"path": tmp_path})
    first.register_operator("window", BytesState(b"x"))
    saved = [first.checkpoint() for _ in range(3)]
    (tmp_path / "ids.log").unlink()

    second = CheckpointCoordinator.from_config({"path": tmp_path})

    assert second.reserve_id() > saved[-1].checkpoint_id


def test_reserve_above_a_committed_id_the_log_never_saw(coordinator: CheckpointCoordinator) -> None:
    coordinator.reserve_id()

    coordinator.reserve_above(41)  # Kafka's offset metadata names checkpoint 41

    assert coordinator.reserve_id() == 42
    assert CheckpointIdLog(coordinator.id_log.path).highest_reserved() == 42


def test_clear_old_checkpoints_keeps_the_newest_completed(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("window", BytesState(b"x"))
    saved = [coordinator.checkpoint().checkpoint_id for _ in range(5)]

    cleared = coordinator.clear_old_checkpoints(keep=2)

    assert cleared == saved[:3]
    assert coordinator.storage.ids() == saved[3:]
    assert coordinator.completed_count() == 2


def test_clear_old_checkpoints_never_touches_an_in_flight_checkpoint(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("window", BytesState(b"x"))
    saved = [coordinator.checkpoint().checkpoint_id for _ in range(2)]
    in_flight = coordinator.trigger_checkpoint().checkpoint_id
    coordinator.persist(in_flight)

    coordinator.clear_old_checkpoints(keep=1)

    assert coordinator.storage.ids() == [saved[1], in_flight]


def test_discard_above_deletes_state_of_uncommitted_ids(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("window", BytesState(b"x"))
    saved = [coordinator.checkpoint().checkpoint_id for _ in range(4)]

    discarded = coordinator.discard_above(saved[1])

    assert discarded == saved[2:]
    assert coordinator.storage.ids() == saved[:2]
    latest = coordinator.latest_checkpoint()
    assert latest is not None and latest.checkpoint_id == saved[1]


def test_periodic_checkpointing_completes_checkpoints_with_durable_state(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("window", BytesState(b"x"))

    coordinator.start_periodic(interval_s=0.02, timeout_s=1.0)
    _wait_until(lambda: coordinator.completed_count() >= 2)
    coordinator.stop_periodic()

    completed = [o for o in coordinator.outcomes() if o.status == "completed"]
    assert len(completed) >= 2
    assert all(coordinator.storage.read(o.checkpoint_id or 0).blobs == {"window": b"x"} for o in completed)


def test_periodic_attempt_with_a_failing_operator_never_records_success(coordinator: CheckpointCoordinator) -> None:
    coordinator.register_operator("bad", FailingState())

    coordinator.start_periodic(interval_s=0.02, timeout_s=1.0)
    _wait_until(lambda: len(coordinator.outcomes()) >= 2)
    coordinator.stop_periodic()

    assert {o.status for o in coordinator.outcomes()} == {"failed"}
    assert "state is inconsistent" in (coordinator.outcomes()[0].error or "")
    assert coordinator.completed_count() == 0
    assert coordinator.storage.ids() == []


def test_periodic_attempt_that_times_out_is_failed_and_never_persists_later(coordinator: CheckpointCoordinator) -> None:
    slow = BlockingState()
    coordinator.register_operator("slow", slow)

    coordinator.start_periodic(interval_s=0.02, timeout_s=0.1)
    _wait_until(lambda: any(o.status == "timed_out" for o in coordinator.outcomes()))
    coordinator.stop_periodic()
    slow.release.set()  # the stuck snapshot returns after its checkpoint was failed
    _join_attempt_threads()

    statuses = {o.status for o in coordinator.outcomes()}
    assert "timed_out" in statuses and "completed" not in statuses
    assert (coordinator.completed_count(), coordinator.active_count()) == (0, 0)
    assert coordinator.storage.ids() == []


def test_checkpoint_failed_while_being_written_leaves_no_file(
    coordinator: CheckpointCoordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    coordinator.register_operator("window", BytesState(b"x"))
    checkpoint_id = coordinator.trigger_checkpoint().checkpoint_id
    writing, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync_of_checkpoint_files(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".ckpt.tmp"):
            writing.set()
            release.wait(5)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync_of_checkpoint_files)
    errors: list[Exception] = []
    persisting = threading.Thread(target=lambda: _collect_error(errors, lambda: coordinator.persist(checkpoint_id)))
    persisting.start()
    assert writing.wait(5)
    coordinator.complete_checkpoint(checkpoint_id, success=False)  # e.g. its timeout expired
    release.set()
    persisting.join(5)

    assert len(errors) == 1 and isinstance(errors[0], CheckpointPersistFailed)
    assert coordinator.storage.ids() == []
    with pytest.raises(CheckpointError):
        coordinator.complete_checkpoint(checkpoint_id, success=True)
