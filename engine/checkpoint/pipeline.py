"""The production ``PipelineCallback``: a connector config wired to Kafka sources, operators and a sink.

``engine.checkpoint`` (the package docstring) says which method here does which step of the epoch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, cast

import pyarrow as pa

from connectors.checkpoint import SourceCheckpoint
from connectors.dead_letter import DeadLetter
from connectors.metadata import KEY, OFFSET, PARTITION, value_columns
from connectors.offset_metadata import MalformedOffsetMetadata, checkpoint_id_from_metadata, checkpoint_metadata
from connectors.source import KafkaSource, SourceBatch, SourceSettings
from connectors.watermarks import WatermarkTracker, filter_late_rows
from engine.checkpoint.coordinator import (
    CheckpointAbandoned,
    CheckpointAttempt,
    ControlMessage,
    CycleFailed,
    PipelineCallback,
    Source,
    StoppedBeforeStart,
    StopRequest,
)
from engine.config import ConnectorConfig
from engine.metrics import Metrics
from engine.state import (
    CheckpointCoordinator,
    CheckpointError,
    CheckpointIdLog,
    FileCheckpointStorage,
    OperatorState,
    StateDirLock,
)
from engine.transforms import OperatorRuntimeError
from engine.wiring import SOURCE_NAME, CrashPoint, build_chain, build_sink, input_schema, source_settings
from schemas import Format
from sinks import EpochAborted, KafkaWriter, Sink

log = logging.getLogger(__name__)

WATERMARK_STATE_PREFIX = "watermarks/"

class RecoveryError(RuntimeError):
    """What Kafka says committed cannot be restored; starting anyway would break exactness."""


class PipelineSource(Source, Protocol):
    """What the pipeline needs of a source beyond the coordinator's ``Source``: its format and watermarks,
    the group's committed offsets, and its cut. ``connectors.source.KafkaSource`` is the real one; the
    broker-free test driver (``engine.testing.driver``) has an in-memory one."""

    settings: SourceSettings
    format: Format
    watermarks: WatermarkTracker

    def open(self, start_at: SourceCheckpoint | None = None) -> None: ...
    def committed(self) -> tuple[SourceCheckpoint | None, str | None]: ...
    def committed_metadata(self) -> dict[int, tuple[int, str | None]]: ...
    def position(self) -> SourceCheckpoint: ...
    def observe_event_times(self, batch: pa.RecordBatch) -> None: ...
    def consumer_group_metadata(self) -> object: ...
    def lag(self) -> dict[int, int]: ...


SourceOpener = Callable[[SourceSettings], PipelineSource]
CycleObserver = Callable[[Mapping[str, SourceCheckpoint]], None]


class KafkaPipeline(PipelineCallback):
    """One connector: sources → operator chain → Kafka sink, checkpointed as one epoch per transaction."""

    def __init__(self, config: ConnectorConfig, bootstrap: str, metrics: Metrics | None = None,
                 crash_point: CrashPoint | None = None, *, open_source: SourceOpener | None = None,
                 sink: Sink | None = None, cycle_observer: CycleObserver | None = None,
                 stop: StopRequest | None = None) -> None:
        """``open_source`` and ``sink`` replace the Kafka ones (the test driver's in-memory parts); by default
        sources are ``KafkaSource``s in the connector's group and the sink is what ``sink.delivery`` asks.
        ``cycle_observer`` is told every source's position after each cycle (a progress bar). ``stop`` is
        polled between the steps of recovery, so a stop signal during start-up is honoured within seconds."""
        self.config = config
        self.bootstrap = bootstrap
        self.metrics = metrics or Metrics()
        self._state_lock = StateDirLock(config.state_dir)
        self.checkpoints = CheckpointCoordinator(FileCheckpointStorage(config.state_dir),
                                                 CheckpointIdLog(config.state_dir / "ids.log"))
        self.chain = build_chain(config)
        before_commit = (lambda: crash_point("between-flush-and-commit")) if crash_point is not None else None
        self.sink = sink or build_sink(config, bootstrap, transactional_id=config.transactional_id,
                                       group_id=config.group_id, before_commit=before_commit)
        self._new_source = open_source or (lambda settings: KafkaSource(settings, bootstrap, config.group_id))
        self._source_settings = {SOURCE_NAME: source_settings(config)}
        self._sources: dict[str, PipelineSource] = {}
        self._committed_id: int | None = None
        self._committed_cuts: dict[str, SourceCheckpoint] = {}
        self._initial_state: dict[str, bytes] = {}
        self._pending_dead_letters: list[DeadLetter] = []
        self._faults_since_commit = 0
        self._watermark: int | None = None  # as of the end of the last cycle: what this cycle's rows are judged by
        self._cycle_bytes_in = 0
        self._cycle_observer = cycle_observer
        self._stop = stop or StopRequest()
        if isinstance(self.sink, KafkaWriter):
            self.sink.interrupted = lambda: self._stop.requested

    # -- recovery ---------------------------------------------------------------------------------
    def recover(self) -> list[Source]:
        self.sink.start()  # fences the previous instance first, so it stops writing state...
        self._honour_stop("fencing")
        self._state_lock.acquire(timeout_s=self.config.checkpoint.timeout / 1000 * 2,  # ...then waits for it to exit
                                 interrupted=lambda: self._stop.requested)
        self._honour_stop("waiting for the previous instance to exit")
        for name, settings in self._source_settings.items():
            self._open_source(name, settings)
            self._honour_stop("opening the sources")
        self._validate_chain()
        self._register_state()
        self._initial_state = {name: state.snapshot() for name, state in self._states().items()}
        self._restore_committed_state()
        self._watermark = self.current_watermark()
        self.sink.begin_epoch()
        self._observe_positions()
        return list(self._sources.values())

    def _open_source(self, name: str, settings: SourceSettings) -> PipelineSource:
        source = self._new_source(settings)
        committed, metadata = source.committed()
        checkpoint_id = self._checkpoint_named_by(source, metadata)
        if checkpoint_id is not None:
            self._committed_id = max(self._committed_id or 0, checkpoint_id)
        source.open(committed)
        self._sources[name] = source
        self._committed_cuts[name] = source.position()
        log.info("source opened", extra={"source": name, "topic": settings.topic,
                                         "committed_checkpoint": checkpoint_id,
                                         "offsets": dict(self._committed_cuts[name].offsets)})
        return source

    def _honour_stop(self, during: str) -> None:
        if self._stop.requested:
            raise StoppedBeforeStart(f"stop requested while {during}; nothing was committed")

    def _checkpoint_named_by(self, source: PipelineSource, metadata: str | None) -> int | None:
        """The checkpoint id in the committed offsets' metadata; unreadable metadata is a ``RecoveryError``
        naming the group, topic, partition and the string: guessing a checkpoint could restore wrong state."""
        try:
            return checkpoint_id_from_metadata(metadata)
        except MalformedOffsetMetadata as error:
            partitions = sorted(p for p, (_, text) in source.committed_metadata().items() if text == metadata)
            raise RecoveryError(
                f"consumer group {self.config.group_id!r} committed offsets on topic "
                f"{source.settings.topic!r} partition(s) {partitions} with metadata {metadata!r}, which names no "
                f"checkpoint ({error}); epochline did not write it, so the connector does not guess where to resume"
            ) from error

    def _validate_chain(self) -> None:
        """A bad query or function is a config error at start, not a crash mid-stream."""
        schema = input_schema(next(iter(self._sources.values())).format)
        if schema is not None:
            self.chain.validate(schema)

    def _states(self) -> dict[str, OperatorState]:
        states = dict(self.chain.states)
        for name, source in self._sources.items():
            states[WATERMARK_STATE_PREFIX + name] = source.watermarks
        return states

    def _register_state(self) -> None:
        for name, state in self._states().items():
            self.checkpoints.register_operator(name, state)

    def _restore_committed_state(self) -> None:
        """Restore exactly the committed checkpoint; delete state of ids that never committed."""
        committed = self._committed_id or 0
        self.checkpoints.discard_above(committed)
        self.checkpoints.reserve_above(committed)
        if self._committed_id is None:
            return
        try:
            self.checkpoints.restore_checkpoint(self._committed_id)
        except CheckpointError as error:
            raise RecoveryError(
                f"Kafka says checkpoint {self._committed_id} of {self.config.name} committed, but its state in "
                f"{self.config.state_dir} cannot be restored ({error}); restoring older state would duplicate "
                "or lose window results, so the connector stops"
            ) from error

    # -- one cycle ---------------------------------------------------------------------------------
    def filter_late_rows(self, source: str, batch: SourceBatch) -> SourceBatch:
        self._pending_dead_letters += batch.dead_letters
        self._cycle_bytes_in += batch.value_bytes
        self.metrics.dead_letters(len(batch.dead_letters))
        watermark = self._watermark
        settings = self._source_settings[source]
        on_time, late = filter_late_rows(batch.batch, watermark, settings.event_time_column)
        if late.num_rows:
            self.metrics.late_rows(late.num_rows, diverted=self.config.late_rows == "dead-letter")
            if self.config.late_rows == "dead-letter":
                self._pending_dead_letters += self._dead_letters_from_rows(
                    source, late, f"late row: event time behind watermark {watermark}", "late")
        return SourceBatch(source=batch.source, batch=on_time, dead_letters=[], value_bytes=batch.value_bytes)

    def _dead_letters_from_rows(self, source: str, rows: pa.RecordBatch | pa.Table, reason: str,
                                stage: str) -> list[DeadLetter]:
        """Decoded rows back to their wire format, so a dead-letter record can be replayed as it came."""
        table = pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows
        values: list[bytes | None] = []
        for batch in table.select(value_columns(table.column_names)).to_batches():
            values += self._sources[source].format.encode(batch)
        topic = self._source_settings[source].topic
        partitions = cast(list[int], table.column(PARTITION).to_pylist())  # non-nullable columns
        offsets = cast(list[int], table.column(OFFSET).to_pylist())
        return [
            DeadLetter(topic=topic, partition=partition, offset=offset, key=key, value=value, reason=reason,
                       stage=stage)
            for partition, offset, key, value in zip(partitions, offsets, table.column(KEY).to_pylist(), values)
        ]

    def extract_watermark(self, source: str, batch: SourceBatch) -> None:
        self._sources[source].observe_event_times(batch.batch)

    def current_watermark(self) -> int | None:
        """The minimum over sources; None until every source has one (a silent source holds it back).
        The coordinator asks once per cycle, after the cycle's event times are observed; the answer is also
        what the next cycle's rows are judged late against."""
        marks = [source.watermarks.current() for source in self._sources.values()]
        known = [mark for mark in marks if mark is not None]
        self._watermark = min(known) if known and len(known) == len(marks) else None
        return self._watermark

    def execute_cycle(self, source_batches: Sequence[SourceBatch], watermark: int | None) -> pa.Table | None:
        batches = [b.batch for b in source_batches if b.batch.num_rows]
        table = pa.Table.from_batches(batches) if batches else None
        if table is None and watermark is None:
            return None
        try:
            return self.chain.process(table if table is not None else self.chain.empty_input(), watermark)
        except OperatorRuntimeError as error:
            self.metrics.cycle_failed()
            if not self.fault_on_cycle_error():
                for batch in source_batches:
                    self._pending_dead_letters += self._dead_letters_from_rows(
                        batch.source, batch.batch, f"transform failed: {error}", "transform")
                self.sink.write_dead_letters(self._take_dead_letters())
            raise CycleFailed(str(error)) from error

    def _take_dead_letters(self) -> list[DeadLetter]:
        letters, self._pending_dead_letters = self._pending_dead_letters, []
        return letters

    def write_to_sinks(self, results: pa.Table | None) -> None:
        if results is not None:
            written = self.sink.write(results)
            self.metrics.records_out(written.records, bytes_out=written.bytes)
        self.sink.write_dead_letters(self._take_dead_letters())

    def record_cycle(self, events: int, batches: int, elapsed_ns: int) -> None:
        bytes_in, self._cycle_bytes_in = self._cycle_bytes_in, 0
        self.metrics.record_cycle(records_in=events, batches=batches, elapsed_ns=elapsed_ns, bytes_in=bytes_in,
                                  phase_ns=self.chain.last_cycle_ns)
        self._observe_positions()

    def _observe_positions(self) -> None:
        if self._cycle_observer is not None:
            self._cycle_observer({name: source.position() for name, source in self._sources.items()})

    # -- checkpoints -------------------------------------------------------------------------------
    def reserve_checkpoint_attempt(self) -> CheckpointAttempt:
        return CheckpointAttempt(self.checkpoints.reserve_id())

    def checkpoint_with_barrier(self, source_checkpoints: Mapping[str, SourceCheckpoint],
                                attempt: CheckpointAttempt) -> None:
        started = time.monotonic()
        checkpoint_id = attempt.checkpoint_id
        try:
            metadata = self.checkpoints.trigger_checkpoint(checkpoint_id)
            self.checkpoints.persist(checkpoint_id)
            offsets = [tp for cut in source_checkpoints.values() for tp in cut.topic_partitions()]
            group_metadata = next(iter(self._sources.values())).consumer_group_metadata()
            self.sink.commit_epoch(offsets, checkpoint_metadata(checkpoint_id), group_metadata)
        except (CheckpointError, EpochAborted) as error:
            raise CheckpointAbandoned(f"checkpoint {checkpoint_id}: {error}") from error
        self.checkpoints.complete_checkpoint(checkpoint_id, True)
        self._committed_id = checkpoint_id
        self._committed_cuts = dict(source_checkpoints)
        self._faults_since_commit = 0
        self.checkpoints.clear_old_checkpoints(self.config.checkpoint.keep)
        self.metrics.checkpoint(duration_s=time.monotonic() - started, size_bytes=metadata.total_bytes)
        for source in self._sources.values():
            self.metrics.lag(source.name, source.lag())
        log.info("checkpoint committed", extra={"checkpoint_id": checkpoint_id, "bytes": metadata.total_bytes})
        self.sink.begin_epoch()

    def abandon_checkpoint_attempt(self, attempt: CheckpointAttempt | None,
                                   reason: str) -> Mapping[str, SourceCheckpoint]:
        self._faults_since_commit += 1
        self._pending_dead_letters.clear()
        self.sink.abort_epoch()
        if attempt is not None:
            self.checkpoints.complete_checkpoint(attempt.checkpoint_id, False)
        if self._committed_id is None:
            for name, state in self._states().items():
                state.restore(self._initial_state[name])
        else:
            self.checkpoints.restore_checkpoint(self._committed_id)
        self._watermark = self.current_watermark()
        log.warning("epoch abandoned", extra={"checkpoint_id": attempt and attempt.checkpoint_id, "reason": reason,
                                              "rewind_to": self._committed_id})
        self.sink.begin_epoch()
        return dict(self._committed_cuts)

    # -- control and health ---------------------------------------------------------------------------
    def apply_control(self, msg: ControlMessage) -> Source | None:
        if msg.action == "drop":
            self._sources.pop(msg.source, None)
            self._source_settings.pop(msg.source, None)
            self.current_watermark()
            return None
        settings: SourceSettings = msg.settings
        self._source_settings[msg.source] = settings
        source = self._open_source(msg.source, settings)
        self.checkpoints.register_operator(WATERMARK_STATE_PREFIX + msg.source, source.watermarks)
        self.current_watermark()  # a new source holds the watermark back until it has one of its own
        return source

    def is_backpressured(self) -> bool:
        return self.sink.is_backpressured()

    def fault_on_cycle_error(self) -> bool:
        return self.config.transform_errors == "halt"

    def take_pipeline_halt(self) -> str | None:
        if self._faults_since_commit >= 2:
            return (f"the same input failed {self._faults_since_commit} times after recovering to checkpoint "
                    f"{self._committed_id}: halting without committing (poison input?)")
        return None

    def close_sinks(self) -> None:
        try:
            self.sink.close()
        finally:
            self._state_lock.release()
