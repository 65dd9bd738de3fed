"""The epoch loop: the one loop that decides when a cycle runs and when a checkpoint is taken.

The checkpoint protocol (see DESIGN.md, "One epoch, start to end") is split at one seam only:

* this module owns *when*: the cycle loop, the checkpoint interval, reserving the attempt, injecting
  the barrier into every source at the same point of the loop (so barriers are aligned by construction:
  a batch polled after the barrier can only belong to the next epoch), and choosing commit or abandon;
* ``PipelineCallback`` owns *what*: running operators, writing sinks, capturing state and committing the
  epoch's Kafka transaction (``engine.checkpoint.pipeline`` is the production implementation; tests use
  a fake).

A checkpoint is only ever reported successful by ``checkpoint_with_barrier`` returning, which the
pipeline allows only after state is durably written and the transaction committed. Any failure in
between abandons the attempt: its id is burned, sources are rewound to the last committed cut.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import pyarrow as pa

from connectors.batch import SourceBatch
from connectors.checkpoint import SourceCheckpoint
from engine.transforms.operator import Watermark

log = logging.getLogger(__name__)


class EpochLoopError(RuntimeError):
    """The epoch loop cannot go on."""


class CycleFailed(EpochLoopError):
    """An operator failed while executing a cycle; the message names the operator."""


class CheckpointAbandoned(EpochLoopError):
    """A checkpoint attempt could not complete (capture, persistence or an abortable transaction)."""


class PipelineHalted(EpochLoopError):
    """A deterministic failure (poison input) would loop through recovery for ever: stop without committing."""


class ImmediateStop(EpochLoopError):
    """A second stop signal: stop at once, without a final checkpoint."""


class StoppedBeforeStart(EpochLoopError):
    """A stop was requested while the connector was still starting: nothing was opened for writing."""


class StopRequest:
    """SIGTERM/SIGINT for a whole run: the first asks for a graceful stop, the second stops at once.

    One object serves every phase (start-up, recovery, the cycle loop, a restart's backoff), so a signal is
    honoured wherever it lands: phases poll ``requested`` between bounded steps or ``wait`` on it. The
    second request raises ``ImmediateStop`` from the signal handler, at the next bytecode of the main thread.
    """

    def __init__(self) -> None:
        self._requested = threading.Event()

    def request(self) -> None:
        if self._requested.is_set():
            raise ImmediateStop("second stop signal: stopping at once without a final checkpoint")
        self._requested.set()

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True at once when a stop is requested meanwhile."""
        return self._requested.wait(seconds)

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.request())


@dataclass(frozen=True)
class CheckpointAttempt:
    """A durably reserved checkpoint id; once reserved it is never handed out again."""

    checkpoint_id: int
    reserved_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class ControlMessage:
    """Add or drop a stream while the pipeline runs."""

    action: Literal["add", "drop"]
    source: str
    settings: Any = None


class Source(Protocol):
    """What the loop needs of a source (``connectors.source.KafkaSource`` is one)."""

    name: str

    def poll_batch(self, timeout: float) -> SourceBatch | None: ...
    def position(self) -> SourceCheckpoint: ...
    def inject_barrier(self, checkpoint_id: int) -> SourceCheckpoint: ...
    def restore(self, checkpoint: SourceCheckpoint) -> None: ...
    def reached(self, ends: Mapping[int, int]) -> bool: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def close(self) -> None: ...


class EpochControl(Protocol):
    """What the pipeline may ask of the loop from inside a rebalance callback: commit the epoch now
    (partitions are about to be revoked) or abandon it (they were lost). Safe there because the loop
    polls one source per cycle, so when a callback runs every record handed out is already processed."""

    def checkpoint(self) -> bool: ...
    def abandon(self, reason: str) -> None: ...


class PipelineCallback(Protocol):
    """The seam between the loop and sources' consumers, operators, state and sinks."""

    def recover(self, control: EpochControl) -> list[Source]:
        """Fence older instances and return the sources; each partition's committed state is restored when
        the group assigns it (``control`` serves the commits and aborts rebalances need)."""

    def filter_late_rows(self, source: str, batch: SourceBatch) -> SourceBatch:
        """Set apart the rows event-time state can no longer take (late, or without an event time), as dead
        letters or dropped, counted either way; a source that feeds no event-time state keeps every row."""

    def extract_watermark(self, source: str, batch: SourceBatch) -> None: ...

    def current_watermark(self) -> Watermark: ...

    def execute_cycle(self, source_batches: Sequence[SourceBatch], watermark: Watermark) -> pa.Table | None:
        """Run the operators over this cycle's rows; raises ``CycleFailed``."""

    def write_to_sinks(self, results: pa.Table | None) -> None: ...

    def reserve_checkpoint_attempt(self) -> CheckpointAttempt: ...

    def checkpoint_with_barrier(self, source_checkpoints: Mapping[str, SourceCheckpoint],
                                attempt: CheckpointAttempt) -> None:
        """Capture state and commit the epoch at these cuts; raises ``CheckpointAbandoned``."""

    def abandon_checkpoint_attempt(self, attempt: CheckpointAttempt | None,
                                   reason: str) -> Mapping[str, SourceCheckpoint]:
        """Abort the epoch, restore the last committed state; returns the cuts to rewind sources to."""

    def record_cycle(self, events: int, batches: int, elapsed_ns: int) -> None: ...

    def input_ended(self, ends: Mapping[str, Mapping[int, int]]) -> bool:
        """Everything up to ``ends`` (and whatever the connector derived from it) is committed by the group."""

    def apply_control(self, msg: ControlMessage) -> Source | None:
        """An added stream's source (positioned), or None for a drop."""

    def is_backpressured(self) -> bool: ...

    def fault_on_cycle_error(self) -> bool:
        """True (exactly-once): a failed cycle abandons the epoch; False: the cycle is dropped and counted."""

    def take_pipeline_halt(self) -> str | None:
        """A reason to halt when the same failure recurs after recovery (deterministic poison input)."""

    def close_sinks(self) -> None: ...


@dataclass
class EpochLoopSettings:
    checkpoint_interval_s: float = 1.0
    poll_timeout_s: float = 0.1
    stop_at: Mapping[str, Mapping[int, int]] | None = None


class EpochLoop:
    """Runs cycles and checkpoints until stopped, the input ends (``stop_at_end``) or a halt."""

    def __init__(self, callback: PipelineCallback, settings: EpochLoopSettings,
                 clock: Callable[[], float] = time.monotonic, stop: StopRequest | None = None) -> None:
        self.callback = callback
        self.settings = settings
        self._clock = clock
        self.stop = stop or StopRequest()
        self._sources: dict[str, Source] = {}
        self._controls: list[ControlMessage] = []
        self._paused = False
        self._dirty = False
        self._handed_out = False  # a cycle of this run has had records or output
        self._turn = 0
        self._committed_cuts: dict[str, SourceCheckpoint] = {}
        self.checkpoints_committed = 0
        self.checkpoints_abandoned = 0

    # -- control ---------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Graceful stop: finish the cycle, take a final checkpoint, return. A second request is immediate."""
        self.stop.request()

    def install_signal_handlers(self) -> None:
        self.stop.install()

    def submit(self, msg: ControlMessage) -> None:
        """Queue a control message; it is applied between cycles."""
        self._controls.append(msg)

    @property
    def sources(self) -> Mapping[str, Source]:
        return dict(self._sources)

    # -- the loop ---------------------------------------------------------------------------------
    def run(self) -> None:
        """Recover, then cycle until stopped. ``settings.stop_at`` (end offsets per source, captured
        once when the connector started) makes it return once everything up to them is committed."""
        try:
            self.start()
            ends = self.settings.stop_at
            next_checkpoint = self._clock() + self.settings.checkpoint_interval_s
            while True:
                self._apply_controls()
                self._apply_backpressure()
                polled = self.run_cycle()
                if ends is not None and not polled and not self._dirty and self._moved_since_commit():
                    self._dirty = True  # past trailing transaction markers: the group must see that too
                at_end = ends is not None and not polled and self.callback.input_ended(ends)
                committed = True
                if self.stop.requested or at_end or self._clock() >= next_checkpoint or self._first_epoch_has_output():
                    committed = self.checkpoint()
                    next_checkpoint = self._clock() + self.settings.checkpoint_interval_s
                # At the end only a committed epoch counts: an abandoned one was rewound and is read again.
                if (self.stop.requested or (at_end and committed)) and not self._dirty:
                    return
        finally:
            self.close()

    def start(self) -> None:
        """Recovery: the callback fences older instances, restores the committed state and hands over the
        positioned sources. ``run`` starts with it; a caller stepping cycles itself (the test driver) too."""
        self._sources = {source.name: source for source in self.callback.recover(self)}

    def run_cycle(self) -> int:
        """One cycle: poll, filter late rows, watermarks, execute, write. Returns batches polled."""
        started = time.perf_counter_ns()
        polled = self._poll_one()
        # Late rows are judged against the watermark from before this cycle, then watermarks advance.
        batches = [self.callback.filter_late_rows(name, batch) for name, batch in polled]
        for (name, _), batch in zip(polled, batches):
            self.callback.extract_watermark(name, batch)
        watermark = self.callback.current_watermark()
        try:
            results = self.callback.execute_cycle(batches, watermark)
        except CycleFailed as failure:
            self._on_cycle_failure(failure)
            return len(batches)
        self.callback.write_to_sinks(results)
        if batches or (results is not None and results.num_rows):
            self._dirty = True
            self._handed_out = True
        events = sum(batch.batch.num_rows for batch in batches)
        self.callback.record_cycle(events, len(batches), time.perf_counter_ns() - started)
        return len(batches)

    def _poll_one(self) -> list[tuple[str, SourceBatch]]:
        """A batch of the first source that has one, taking turns. One source per cycle, because a poll may
        run a rebalance callback that commits the epoch: nothing another source handed out may be waiting
        unprocessed then, or the commit's cut would cover records whose output was never written."""
        names = list(self._sources)
        for turn in range(len(names)):
            name = names[(self._turn + turn) % len(names)]
            batch = self._sources[name].poll_batch(self.settings.poll_timeout_s / len(names))
            if batch is not None:
                self._turn = (self._turn + turn + 1) % len(names)
                return [(name, batch)]
        return []

    def abandon(self, reason: str) -> None:
        """Abort the open epoch and rewind every source to the last committed cut (partitions were lost)."""
        self._rewind(None, reason)
        self.checkpoints_abandoned += 1

    def _on_cycle_failure(self, failure: CycleFailed) -> None:
        if not self.callback.fault_on_cycle_error():
            log.error("cycle dropped", extra={"error": str(failure)})
            self._dirty = True  # its rows went to the dead-letter topic and its offsets moved: commit them
            return
        log.error("cycle failed, recovering from the last committed checkpoint", extra={"error": str(failure)})
        self._rewind(None, str(failure))
        halt = self.callback.take_pipeline_halt()
        if halt is not None:
            raise PipelineHalted(f"{halt}; the failure: {failure}") from failure

    def checkpoint(self) -> bool:
        """Reserve, barrier, capture and commit; True when the epoch committed."""
        if not self._dirty:
            return True
        attempt = self.callback.reserve_checkpoint_attempt()
        cuts = {name: source.inject_barrier(attempt.checkpoint_id) for name, source in self._sources.items()}
        try:
            self.callback.checkpoint_with_barrier(cuts, attempt)
        except CheckpointAbandoned as abandoned:
            log.warning("checkpoint abandoned",
                        extra={"checkpoint_id": attempt.checkpoint_id, "reason": str(abandoned)})
            self._rewind(attempt, str(abandoned))
            self.checkpoints_abandoned += 1
            return False
        self._dirty = False
        self._committed_cuts = cuts
        self.checkpoints_committed += 1
        return True

    def _first_epoch_has_output(self) -> bool:
        """The run's first epoch commits as soon as a cycle has had records, not at the end of the interval:
        a user sees the first output (and the group's first committed offsets) a moment after start, and a
        short run does not wait out a whole interval. It is one more small transaction per run; an epoch
        that was abandoned first means trouble, so after one the interval rules again."""
        return (self._dirty and self._handed_out
                and self.checkpoints_committed + self.checkpoints_abandoned == 0)

    def _moved_since_commit(self) -> bool:
        """A source's position moved without handing out a record (over transaction markers): its offsets
        are worth committing, or instances waiting for the group's committed offsets would wait for ever."""
        return any(source.position() != self._committed_cuts.get(name) for name, source in self._sources.items())

    def _rewind(self, attempt: CheckpointAttempt | None, reason: str) -> None:
        cuts = self.callback.abandon_checkpoint_attempt(attempt, reason)
        for name, cut in cuts.items():
            if name in self._sources:
                self._sources[name].restore(cut)
        self._dirty = False

    def _apply_backpressure(self) -> None:
        pressured = self.callback.is_backpressured()
        if pressured != self._paused:
            for source in self._sources.values():
                source.pause() if pressured else source.resume()
            self._paused = pressured
            log.info("backpressure", extra={"paused": pressured})

    def _apply_controls(self) -> None:
        while self._controls:
            msg = self._controls.pop(0)
            if msg.action == "drop" and msg.source in self._sources:
                self.checkpoint()  # what the dropped stream has handed out is committed first
                self._sources.pop(msg.source).close()
            added = self.callback.apply_control(msg)
            if added is not None:
                self._sources[added.name] = added
            log.info("control applied", extra={"action": msg.action, "source": msg.source})

    def close(self) -> None:
        try:
            self.callback.close_sinks()
        finally:
            for source in self._sources.values():
                source.close()
