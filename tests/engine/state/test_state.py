"""An instance's local state: checkpoint ids are never reused, small files are replaced whole and durably,
and one live process owns a state directory."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from engine.state import (
    CheckpointCorrupted,
    CheckpointIdLog,
    CheckpointPersistFailed,
    StateDirLock,
    StateDirLocked,
    write_atomically,
)

pytestmark = pytest.mark.timeout(10)


# -- checkpoint ids ------------------------------------------------------------------------------------


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

    with pytest.raises(CheckpointCorrupted, match="line 2") as raised:
        CheckpointIdLog(log_path)
    assert raised.value.path == log_path


def test_reserve_above_a_committed_id_the_log_never_saw(tmp_path: Path) -> None:
    ids = CheckpointIdLog(tmp_path / "ids.log")
    ids.reserve()

    ids.advance_to(41)  # Kafka's offset metadata names checkpoint 41

    assert ids.reserve() == 42
    assert CheckpointIdLog(ids.path).highest_reserved() == 42


def test_advancing_to_an_id_below_the_highest_reserved_changes_nothing(tmp_path: Path) -> None:
    ids = CheckpointIdLog(tmp_path / "ids.log")
    for _ in range(3):
        ids.reserve()

    ids.advance_to(2)

    assert ids.reserve() == 4


def test_an_id_whose_reservation_failed_to_reach_the_disk_is_burned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = CheckpointIdLog(tmp_path / "ids.log")
    ids.reserve()

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as patched:
        patched.setattr(os, "fsync", failing_fsync)
        with pytest.raises(CheckpointPersistFailed, match="could not reserve checkpoint id 2"):
            ids.reserve()

    assert ids.reserve() == 3


# -- files replaced atomically -------------------------------------------------------------------------


def test_write_atomically_fsyncs_the_file_then_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append("directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    write_atomically(tmp_path / "plan.json", [b"{", b"}"])

    assert synced == ["file", "directory"]
    assert (tmp_path / "plan.json").read_bytes() == b"{}"


def test_a_failed_write_keeps_the_old_content_and_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "instance"
    write_atomically(path, [b"old"])

    def disk_full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, [b"new"])

    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["instance"]


def test_a_temp_file_left_by_a_crash_is_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "instance"
    (tmp_path / ".instance.tmp").write_bytes(b"half of an earlier wri")

    write_atomically(path, [b"i-1234"])

    assert path.read_bytes() == b"i-1234"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["instance"]


# -- one live process per state directory ---------------------------------------------------------------


def test_the_lock_records_the_owner_pid(tmp_path: Path) -> None:
    lock = StateDirLock(tmp_path / "instances" / "a")
    lock.acquire(timeout_s=1)
    try:
        assert lock.path == tmp_path / "instances" / "a" / "owner.lock"
        assert lock.path.read_text() == str(os.getpid())
    finally:
        lock.release()


def test_a_directory_still_owned_is_refused_after_the_timeout_naming_the_owner(tmp_path: Path) -> None:
    owner = StateDirLock(tmp_path)
    owner.acquire(timeout_s=1)
    try:
        with pytest.raises(StateDirLocked, match=rf"still owned by another process \(pid {os.getpid()}\)"):
            StateDirLock(tmp_path).acquire(timeout_s=0.2)
    finally:
        owner.release()


def test_a_stop_signal_ends_the_wait_without_the_lock(tmp_path: Path) -> None:
    owner = StateDirLock(tmp_path)
    owner.acquire(timeout_s=1)
    waiting = StateDirLock(tmp_path)
    try:
        waiting.acquire(timeout_s=5, interrupted=lambda: True)
    finally:
        owner.release()

    successor = StateDirLock(tmp_path)
    successor.acquire(timeout_s=0.2)  # the interrupted waiter holds nothing
    successor.release()


def test_a_released_directory_can_be_taken_by_the_next_process(tmp_path: Path) -> None:
    first = StateDirLock(tmp_path)
    first.acquire(timeout_s=1)
    first.release()

    second = StateDirLock(tmp_path)
    second.acquire(timeout_s=0.2)
    second.release()
