"""The epoch loop's protocol, driven through a fake PipelineCallback (no Kafka)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pytest

from connectors.batch import SourceBatch
from connectors.checkpoint import SourceCheckpoint
from engine.checkpoint.loop import (
    CheckpointAbandoned,
    CheckpointAttempt,
    ControlMessage,
    CycleFailed,
    EpochLoop,
    EpochLoopSettings,
    ImmediateStop,
    PipelineHalted,
)
from engine.state import CheckpointIdLog


class FakeSource:
    """Hands out ``batches`` one per poll; its position is the number of records handed out."""

    def __init__(self, name: str, batches: list[list[int]]) -> None:
        self.name = name
        self._batches = batches
        self.handed_out = 0
        self.paused = False
        self.closed = False

    def poll_batch(self, timeout: float) -> SourceBatch | None:
        index = self._batch_index()
        if self.paused or index is None:
            return None
        values = self._batches[index]
        self.handed_out += len(values)
        return SourceBatch(source=self.name, batch=pa.record_batch({"v": values}), dead_letters=[])

    def _batch_index(self) -> int | None:
        total = 0
        for index, batch in enumerate(self._batches):
            if total == self.handed_out:
                return index
            total += len(batch)
        return None

    def cut(self) -> SourceCheckpoint:
        return SourceCheckpoint(source=self.name, topic=self.name, offsets={0: self.handed_out})

    def inject_barrier(self, checkpoint_id: int) -> SourceCheckpoint:
        return self.cut()

    def position(self) -> SourceCheckpoint:
        return self.cut()

    def restore(self, checkpoint: SourceCheckpoint) -> None:
        self.handed_out = checkpoint.offsets[0]

    def reached(self, ends: Mapping[int, int]) -> bool:
        return self._batch_index() is None

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def close(self) -> None:
        self.closed = True


class FakeCallback:
    """Records every call; commits into ``committed`` (values) when a checkpoint succeeds."""

    def __init__(self, sources: list[FakeSource], ids: CheckpointIdLog | None = None) -> None:
        self.sources = sources
        self.ids = ids
        self.calls: list[str] = []
        self.epoch_output: list[int] = []
        self.committed: list[int] = []
        self.committed_cuts: dict[str, SourceCheckpoint] = {s.name: s.cut() for s in sources}
        self.checkpoints: list[tuple[int, dict[str, SourceCheckpoint]]] = []
        self.abandoned: list[tuple[int | None, str]] = []
        self.fail_checkpoints = 0
        self.fail_cycles_on: int | None = None
        self.exactly_once = True
        self.backpressured = False
        self.next_id = 0
        self.faults_since_commit = 0
        self.extra_source: FakeSource | None = None

    def recover(self, control: object) -> list[FakeSource]:
        self.calls.append("recover")
        return list(self.sources)

    def filter_late_rows(self, source: str, batch: SourceBatch) -> SourceBatch:
        self.calls.append(f"filter_late_rows:{source}")
        return batch

    def extract_watermark(self, source: str, batch: SourceBatch) -> None:
        self.calls.append(f"extract_watermark:{source}")

    def current_watermark(self) -> int | None:
        self.calls.append("current_watermark")
        return None

    def execute_cycle(self, source_batches: Sequence[SourceBatch], watermark: int | None) -> pa.Table | None:
        self.calls.append("execute_cycle")
        values = [v for b in source_batches for v in b.batch.column("v").to_pylist()]
        if self.fail_cycles_on is not None and self.fail_cycles_on in values:
            raise CycleFailed(f"operator failed on {self.fail_cycles_on}")
        return pa.table({"v": values})

    def write_to_sinks(self, results: pa.Table | None) -> None:
        self.calls.append("write_to_sinks")
        if results is not None:
            self.epoch_output += results.column("v").to_pylist()

    def reserve_checkpoint_attempt(self) -> CheckpointAttempt:
        self.calls.append("reserve_checkpoint_attempt")
        if self.ids is not None:
            return CheckpointAttempt(self.ids.reserve())
        self.next_id += 1
        return CheckpointAttempt(self.next_id)

    def checkpoint_with_barrier(self, source_checkpoints: Mapping[str, SourceCheckpoint],
                                attempt: CheckpointAttempt) -> None:
        self.calls.append("checkpoint_with_barrier")
        self.checkpoints.append((attempt.checkpoint_id, dict(source_checkpoints)))
        if self.fail_checkpoints:
            self.fail_checkpoints -= 1
            raise CheckpointAbandoned("capture failed")
        self.committed += self.epoch_output
        self.epoch_output = []
        self.committed_cuts = dict(source_checkpoints)
        self.faults_since_commit = 0

    def abandon_checkpoint_attempt(self, attempt: CheckpointAttempt | None,
                                   reason: str) -> Mapping[str, SourceCheckpoint]:
        self.calls.append("abandon_checkpoint_attempt")
        self.abandoned.append((attempt.checkpoint_id if attempt else None, reason))
        self.epoch_output = []
        self.faults_since_commit += 1
        return self.committed_cuts

    def input_ended(self, ends: Mapping[str, Mapping[int, int]]) -> bool:
        return all(source.reached(ends.get(source.name, {})) for source in self.sources)

    def record_cycle(self, events: int, batches: int, elapsed_ns: int) -> None:
        self.calls.append("record_cycle")

    def apply_control(self, msg: ControlMessage) -> FakeSource | None:
        self.calls.append(f"apply_control:{msg.action}:{msg.source}")
        return self.extra_source if msg.action == "add" else None

    def is_backpressured(self) -> bool:
        return self.backpressured

    def fault_on_cycle_error(self) -> bool:
        return self.exactly_once

    def take_pipeline_halt(self) -> str | None:
        return "poison" if self.faults_since_commit >= 2 else None

    def close_sinks(self) -> None:
        self.calls.append("close_sinks")


def _loop(callback: FakeCallback, **settings) -> EpochLoop:
    chosen = EpochLoopSettings(checkpoint_interval_s=3600, poll_timeout_s=0,
                                 stop_at={s.name: {} for s in callback.sources}, **settings)
    return EpochLoop(callback, chosen)


def test_a_cycle_filters_then_extracts_watermarks_then_executes_then_writes() -> None:
    callback = FakeCallback([FakeSource("a", [[1, 2]]), FakeSource("b", [[3]])])
    loop = _loop(callback)
    loop._sources = {s.name: s for s in callback.sources}
    loop.run_cycle()
    loop.run_cycle()
    one_cycle = ["current_watermark", "execute_cycle", "write_to_sinks", "record_cycle"]
    assert callback.calls == ["filter_late_rows:a", "extract_watermark:a", *one_cycle,
                              "filter_late_rows:b", "extract_watermark:b", *one_cycle]


def test_stop_at_end_commits_everything_exactly_once_and_closes() -> None:
    callback = FakeCallback([FakeSource("a", [[1, 2], [3]])])
    _loop(callback).run()
    assert callback.committed == [1, 2, 3]
    assert callback.calls[-1] == "close_sinks"
    assert callback.sources[0].closed


def test_stop_at_end_does_not_return_after_its_final_epoch_was_abandoned() -> None:
    callback = FakeCallback([FakeSource("a", [[1, 2], [3]])])
    callback.fail_checkpoints = 1  # the epoch taken at the end aborts: its rows are read again
    _loop(callback).run()
    assert callback.committed == [1, 2, 3]


def test_sources_take_turns_one_per_cycle_and_barriers_cut_both_at_what_they_handed_out() -> None:
    a, b = FakeSource("a", [[1, 2], [3]]), FakeSource("b", [[10], [11, 12]])
    callback = FakeCallback([a, b])
    loop = _loop(callback)
    loop._sources = {"a": a, "b": b}
    loop.run_cycle()
    assert (a.handed_out, b.handed_out) == (2, 0)  # a poll may commit (a revoke): nothing may wait unprocessed
    loop.run_cycle()
    assert loop.checkpoint()
    checkpoint_id, cuts = callback.checkpoints[-1]
    assert {name: cut.offsets[0] for name, cut in cuts.items()} == {"a": 2, "b": 1}
    loop.run_cycle()  # polled after the barrier: belongs to the next epoch
    loop.run_cycle()
    assert callback.committed == [1, 2, 10]
    assert callback.epoch_output == [3, 11, 12]


def cut_offsets(callback: FakeCallback) -> list[int]:
    return [cuts["a"].offsets[0] for _, cuts in callback.checkpoints]


def test_the_first_epoch_commits_as_soon_as_it_holds_a_record_and_later_ones_wait_for_the_interval() -> None:
    callback = FakeCallback([FakeSource("a", [[1], [2], [3]])])
    _loop(callback).run()  # an interval of an hour: only the end would commit without the rule
    assert cut_offsets(callback) == [1, 3]
    assert callback.committed == [1, 2, 3]


def test_after_an_abandoned_first_epoch_the_interval_rules_again() -> None:
    callback = FakeCallback([FakeSource("a", [[1], [2], [3]])])
    callback.fail_checkpoints = 1
    _loop(callback).run()
    assert cut_offsets(callback) == [1, 3]  # the first (abandoned) at one record, the next at the end
    assert callback.committed == [1, 2, 3]


def test_abandoned_checkpoint_rewinds_sources_and_burns_its_id() -> None:
    source = FakeSource("a", [[1, 2], [3]])
    callback = FakeCallback([source])
    callback.fail_checkpoints = 1
    loop = _loop(callback)
    loop._sources = {"a": source}
    loop.run_cycle()
    assert not loop.checkpoint()
    assert callback.abandoned == [(1, "capture failed")]
    assert source.handed_out == 0
    loop.run_cycle()
    assert loop.checkpoint()
    assert [cid for cid, _ in callback.checkpoints] == [1, 2]
    assert callback.committed == [1, 2]


def test_checkpoint_ids_are_never_reused_across_a_crash_and_restart(tmp_path: Path) -> None:
    first = FakeCallback([FakeSource("a", [[1], [2]])], ids=CheckpointIdLog(tmp_path / "ids.log"))
    first.fail_checkpoints = 1  # reserves id 1, abandons it
    loop = _loop(first)
    loop._sources = {"a": first.sources[0]}
    loop.run_cycle()
    loop.checkpoint()
    loop.run_cycle()
    first.reserve_checkpoint_attempt()  # reserved, then the process "crashes" before using it
    before_crash = [cid for cid, _ in first.checkpoints] + [first.ids.highest_reserved()]

    restarted = FakeCallback([FakeSource("a", [[1], [2]])], ids=CheckpointIdLog(tmp_path / "ids.log"))
    _loop(restarted).run()
    after_restart = [cid for cid, _ in restarted.checkpoints]
    assert after_restart and min(after_restart) > max(before_crash)


def test_cycle_failure_in_exactly_once_rewinds_and_a_repeat_halts() -> None:
    source = FakeSource("a", [[1], [2, 66], [3]])
    callback = FakeCallback([source])
    callback.fail_cycles_on = 66
    with pytest.raises(PipelineHalted, match="poison"):
        _loop(callback).run()
    assert [reason for _, reason in callback.abandoned] == ["operator failed on 66"] * 2
    assert callback.committed == [1]  # the first epoch, committed at its first record; nothing after it
    assert callback.calls[-1] == "close_sinks"


def test_cycle_failure_in_at_least_once_drops_the_cycle_and_goes_on() -> None:
    callback = FakeCallback([FakeSource("a", [[1], [2, 66], [3]])])
    callback.fail_cycles_on = 66
    callback.exactly_once = False
    _loop(callback).run()
    assert callback.committed == [1, 3]
    assert callback.abandoned == []


def test_graceful_stop_takes_a_final_checkpoint() -> None:
    source = FakeSource("a", [[1], [2], [3]])
    callback = FakeCallback([source])
    loop = EpochLoop(callback, EpochLoopSettings(checkpoint_interval_s=3600, poll_timeout_s=0))
    original = callback.write_to_sinks

    def stop_after_first_write(results: pa.Table | None) -> None:
        original(results)
        loop.request_stop()

    callback.write_to_sinks = stop_after_first_write
    loop.run()
    assert callback.committed == [1]
    assert source.handed_out == 1


def test_a_second_stop_request_stops_at_once() -> None:
    loop = _loop(FakeCallback([]))
    loop.request_stop()
    with pytest.raises(ImmediateStop):
        loop.request_stop()


def test_backpressure_pauses_sources_until_it_clears() -> None:
    source = FakeSource("a", [[1], [2]])
    callback = FakeCallback([source])
    loop = _loop(callback)
    loop._sources = {"a": source}
    callback.backpressured = True
    loop._apply_backpressure()
    assert loop.run_cycle() == 0 and source.paused
    callback.backpressured = False
    loop._apply_backpressure()
    assert loop.run_cycle() == 1 and not source.paused


def test_control_messages_add_and_drop_streams_between_cycles() -> None:
    a, b = FakeSource("a", [[1]]), FakeSource("b", [[7]])
    callback = FakeCallback([a])
    callback.extra_source = b
    loop = _loop(callback)
    loop._sources = {"a": a}
    loop.submit(ControlMessage("add", "b"))
    loop._apply_controls()
    loop.run_cycle()
    loop.run_cycle()
    loop.submit(ControlMessage("drop", "a"))
    loop._apply_controls()
    assert set(loop.sources) == {"b"}
    assert a.closed
    assert sorted(callback.committed) == [1, 7]  # the drop committed what both had handed out
