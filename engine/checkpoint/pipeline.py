"""The production ``PipelineCallback``: a connector config wired to Kafka sources, operators and a sink.

``engine.checkpoint`` (the package docstring) says which method here does which step of the epoch.

Where the state of a partition lives, so it moves with the partition from instance to instance: its offset
and largest event time in the group's committed offsets (the metadata also names checkpoint and instance),
its keyed operator state in the operator's compacted changelog topic, written in the same transaction. So
Kafka alone says what committed; an instance's disk only keeps its checkpoint id log and its lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, cast

import pyarrow as pa
from confluent_kafka import TopicPartition

from connectors.checkpoint import SourceCheckpoint
from connectors.dead_letter import DeadLetter
from connectors.metadata import KEY, OFFSET, PARTITION, value_columns
from connectors.offset_metadata import CommittedEpoch, MalformedOffsetMetadata, checkpoint_metadata, committed_epoch
from connectors.source import KafkaSource, PartitionListener, SourceBatch, SourceSettings
from connectors.watermarks import WatermarkTracker, filter_late_rows
from engine.checkpoint.coordinator import (
    CheckpointAbandoned,
    CheckpointAttempt,
    ControlMessage,
    CycleFailed,
    EpochControl,
    PipelineCallback,
    Source,
    StoppedBeforeStart,
    StopRequest,
)
from engine.config import ConnectorConfig
from engine.instance import Instance, resolve_instance
from engine.metrics import Metrics
from engine.state import CheckpointIdLog, KeyedState, StateDirLock
from engine.state.changelog import KafkaStateChangelog, StateChangelog, changelog_topic, state_records
from engine.transforms import OperatorRuntimeError, WindowOperator
from engine.wiring import SOURCE_NAME, CrashPoint, build_chain, build_sink, client_config, input_schema, source_settings
from schemas import Format
from sinks import EpochAborted, KafkaWriter, OffsetCommit, Sink

log = logging.getLogger(__name__)


class RecoveryError(RuntimeError):
    """What Kafka says committed cannot be restored; starting anyway would break exactness."""


class PartitioningError(RecoveryError):
    """The transform needs rows grouped differently from how the topic partitions them."""


class PipelineSource(Source, Protocol):
    """What the pipeline needs of a source beyond the coordinator's ``Source``: its format and watermarks,
    the group's committed offsets, its partitions and its cut. ``connectors.source.KafkaSource`` is the real
    one; the broker-free test driver (``engine.testing.driver``) has an in-memory one."""

    settings: SourceSettings
    format: Format
    watermarks: WatermarkTracker

    def subscribe(self, listener: PartitionListener) -> None: ...
    def partitions(self) -> list[int]: ...
    def owned(self) -> list[int]: ...
    def start_offset(self, partition: int) -> int: ...
    def committed_metadata(self, partitions: list[int] | None = None) -> dict[int, tuple[int, str | None]]: ...
    def position(self) -> SourceCheckpoint: ...
    def observe_event_times(self, batch: pa.RecordBatch) -> None: ...
    def consumer_group_metadata(self) -> object: ...
    def lag(self) -> dict[int, int]: ...


SourceOpener = Callable[[SourceSettings], PipelineSource]
CycleObserver = Callable[[Mapping[str, SourceCheckpoint]], None]


class KafkaPipeline(PipelineCallback, PartitionListener):
    """One connector instance: sources → operator chain → Kafka sink, one epoch per transaction, partitions
    from the connector's consumer group."""

    def __init__(self, config: ConnectorConfig, bootstrap: str, metrics: Metrics | None = None,
                 crash_point: CrashPoint | None = None, *, instance: Instance | None = None,
                 open_source: SourceOpener | None = None,
                 sink: Sink | None = None, changelog: StateChangelog | None = None,
                 cycle_observer: CycleObserver | None = None, stop: StopRequest | None = None) -> None:
        """``open_source``, ``sink`` and ``changelog`` replace the Kafka ones (the test driver's in-memory
        parts); by default sources are ``KafkaSource``s in the connector's group, the sink is what
        ``sink.delivery`` asks and keyed state goes to changelog topics. ``cycle_observer`` is told every
        source's position after each cycle (a progress bar). ``stop`` is polled between the steps of
        start-up, so a stop signal then is honoured within seconds. ``instance`` defaults to the one
        ``resolve_instance`` names (``EPOCHLINE_INSTANCE`` or the name kept in the state directory)."""
        self.config = config
        self.bootstrap = bootstrap
        self.instance = instance = instance or resolve_instance(config)
        self.metrics = metrics or Metrics()
        self._state_lock = StateDirLock(instance.state_dir)
        self._ids = CheckpointIdLog(instance.state_dir / "ids.log")
        self.chain = build_chain(config)
        before_commit = (lambda: crash_point("between-flush-and-commit")) if crash_point is not None else None
        self.sink = sink or build_sink(config, bootstrap, transactional_id=instance.transactional_id,
                                       group_id=config.group_id, before_commit=before_commit)
        # A new owner's committed() waits while the old owner's transaction is open: up to its timeout.
        timeout = config.sink.transaction_timeout / 1000 + 10
        self._new_source = open_source or (lambda settings: KafkaSource(
            settings, bootstrap, config.group_id, member=instance.member(settings.name), timeout=timeout))
        self._changelog = changelog or KafkaStateChangelog(bootstrap, client_config(config), timeout)
        self._source_settings = {SOURCE_NAME: source_settings(config)}
        self._sources: dict[str, PipelineSource] = {}
        self._control: EpochControl | None = None
        self._committed_cuts: dict[str, dict[int, int]] = {}
        self._committed_event_times: dict[str, dict[int, int]] = {}
        self._committed_watermarks: dict[str, int | None] = {}
        self._committed_id: int | None = None
        self._pending_dead_letters: list[DeadLetter] = []
        self._faults_since_commit = 0
        self._watermark: int | None = None  # as of the end of the last cycle: what this cycle's rows are judged by
        self._cycle_bytes_in = 0
        self._cycle_observer = cycle_observer
        self._stop = stop or StopRequest()
        if isinstance(self.sink, KafkaWriter):
            self.sink.interrupted = lambda: self._stop.requested

    # -- start-up ---------------------------------------------------------------------------------
    def recover(self, control: EpochControl) -> list[Source]:
        self._control = control
        self.sink.start()  # fences the previous incarnation first, so it stops writing...
        self._honour_stop("fencing")
        self._state_lock.acquire(timeout_s=self.config.checkpoint.timeout / 1000 * 2,  # ...then waits for it to exit
                                 interrupted=lambda: self._stop.requested)
        self._honour_stop("waiting for the previous instance to exit")
        for name, settings in self._source_settings.items():
            self._sources[name] = self._new_source(settings)
            self._honour_stop("opening the sources")
        self._validate_chain()
        self._ensure_changelogs()
        self.sink.begin_epoch()
        for source in self._sources.values():
            source.subscribe(self)
        self._observe_positions()
        return list(self._sources.values())

    def _honour_stop(self, during: str) -> None:
        if self._stop.requested:
            raise StoppedBeforeStart(f"stop requested while {during}; nothing was committed")

    def _validate_chain(self) -> None:
        """A bad query or function is a config error at start, not a crash mid-stream."""
        schema = input_schema(next(iter(self._sources.values())).format)
        if schema is not None:
            self.chain.validate(schema)

    def _keyed_states(self) -> dict[str, KeyedState]:
        """Operator name -> its state, partitioned like the config's source."""
        return self.chain.states

    def _changelog_topic(self, operator: str) -> str:
        return changelog_topic(self.config.name, operator)

    def _ensure_changelogs(self) -> None:
        """One compacted changelog per stateful operator, partitioned like the source it is keyed by."""
        partitions = len(self._sources[SOURCE_NAME].partitions())
        self._refuse_split_keys(partitions)
        for operator in self._keyed_states():
            self._changelog.ensure(self._changelog_topic(operator), partitions)

    def _refuse_split_keys(self, partitions: int) -> None:
        """Keyed state lives with its source partition, so a window must never see one key on two partitions
        (two instances would each aggregate a part and both emit). Rows of one Kafka key share a partition;
        a window keyed by anything else over a topic of several partitions would give wrong results, so it is
        refused (epochline does not repartition yet)."""
        if partitions <= 1:
            return
        for step in self.chain.steps:
            if isinstance(step, WindowOperator) and KEY not in step.spec.key:
                raise PartitioningError(
                    f"operator {step.name!r}: window key {step.spec.key} does not include {KEY}, and topic "
                    f"{self.config.source.topic!r} has {partitions} partitions: rows of one key could sit on "
                    f"different partitions (and instances), each aggregated on its own. Key the records by the "
                    f"window key and add {KEY} to the window key (keep it in the preceding SQL), or read a "
                    "one-partition topic; repartitioning by other columns is not supported yet")

    # -- partitions come and go (inside the rebalance callbacks) --------------------------------------
    def assigned(self, source: str, partitions: list[int]) -> Mapping[int, int]:
        """Where each new partition starts (its committed offset, else ``start_from``), after its event
        time and keyed state are restored: nothing of it is processed before it has its committed state."""
        reader = self._sources[source]
        committed = reader.committed_metadata(partitions)
        starts: dict[int, int] = {}
        for partition in partitions:
            offset, metadata = committed.get(partition, (-1, None))
            epoch = self._epoch_named_by(reader, partition, metadata)
            starts[partition] = offset if offset >= 0 else reader.start_offset(partition)
            if epoch is not None:
                self._take_note_of(source, partition, epoch)
        self._committed_cuts.setdefault(source, {}).update(starts)
        if source == SOURCE_NAME:
            self._restore_keyed(partitions)
        log.info("partitions assigned", extra={"source": source, "offsets": starts,
                                               "committed_checkpoint": self._committed_id})
        return starts

    def _take_note_of(self, source: str, partition: int, epoch: CommittedEpoch) -> None:
        """Ids this instance reserved before (maybe with another disk) stay burned; event time moves along."""
        if epoch.instance == self.instance.name:
            self._ids.advance_to(epoch.checkpoint_id)
        if epoch.event_time is not None:
            self._committed_event_times.setdefault(source, {})[partition] = epoch.event_time
            self._sources[source].watermarks.observe(partition, epoch.event_time)
        self._committed_id = max(self._committed_id or 0, epoch.checkpoint_id)

    def revoked(self, source: str, partitions: list[int]) -> None:
        """Commit the whole epoch while the partitions are still ours; a commit after they moved could
        overwrite the new owner's offsets. If it cannot commit, the epoch is abandoned instead."""
        assert self._control is not None
        self._control.checkpoint()
        self._forget(source, partitions)

    def lost(self, source: str, partitions: list[int]) -> None:
        """The group gave them away already (session timed out): nothing of this epoch may commit."""
        assert self._control is not None
        self._forget(source, partitions)
        self._control.abandon(f"partitions {partitions} of source {source!r} were lost to another member")

    def _forget(self, source: str, partitions: list[int]) -> None:
        for partition in partitions:
            self._committed_cuts.get(source, {}).pop(partition, None)
            self._committed_event_times.get(source, {}).pop(partition, None)
        if source == SOURCE_NAME:
            for state in self._keyed_states().values():
                for partition in partitions:
                    state.drop_partition(partition)

    def _restore_keyed(self, partitions: Sequence[int]) -> None:
        """Each partition's keyed state from the last committed record of its changelog partition."""
        for operator, state in self._keyed_states().items():
            started = time.monotonic()
            restored = 0
            for partition in partitions:
                data = self._changelog.latest(self._changelog_topic(operator), partition)
                state.restore_partition(partition, data)
                restored += len(data or b"")
            elapsed = time.monotonic() - started
            self.metrics.state_restored(operator, seconds=elapsed, size_bytes=restored)
            log.info("state restored", extra={"operator": operator, "partitions": list(partitions),
                                              "bytes": restored, "seconds": round(elapsed, 3)})

    def _epoch_named_by(self, source: PipelineSource, partition: int, metadata: str | None) -> CommittedEpoch | None:
        """The epoch in a committed offset's metadata; unreadable metadata is a ``RecoveryError`` naming the
        group, topic, partition and the string: guessing a checkpoint could restore wrong state."""
        try:
            return committed_epoch(metadata)
        except MalformedOffsetMetadata as error:
            raise RecoveryError(
                f"consumer group {self.config.group_id!r} committed offsets on topic "
                f"{source.settings.topic!r} partition(s) [{partition}] with metadata {metadata!r}, which names no "
                f"checkpoint ({error}); epochline did not write it, so the connector does not guess where to resume"
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
        return CheckpointAttempt(self._ids.reserve())

    def checkpoint_with_barrier(self, source_checkpoints: Mapping[str, SourceCheckpoint],
                                attempt: CheckpointAttempt) -> None:
        started = time.monotonic()
        checkpoint_id = attempt.checkpoint_id
        try:
            state_bytes = self._capture_keyed_state(checkpoint_id)
            self.sink.commit_epoch([OffsetCommit(self._tagged(name, cut, checkpoint_id),
                                                 self._sources[name].consumer_group_metadata())
                                    for name, cut in source_checkpoints.items()])
        except EpochAborted as error:
            raise CheckpointAbandoned(f"checkpoint {checkpoint_id}: {error}") from error
        self._committed_id = checkpoint_id
        for name, cut in source_checkpoints.items():
            self._committed_cuts.setdefault(name, {}).update(cut.offsets)
            tracker = self._sources[name].watermarks
            self._committed_event_times[name] = tracker.max_event_times()
            self._committed_watermarks[name] = tracker.current()
        self._faults_since_commit = 0
        self.metrics.checkpoint(duration_s=time.monotonic() - started, size_bytes=state_bytes)
        for source in self._sources.values():
            self.metrics.lag(source.name, source.lag())
        log.info("checkpoint committed", extra={"checkpoint_id": checkpoint_id, "state_bytes": state_bytes})
        self.sink.begin_epoch()

    def _capture_keyed_state(self, checkpoint_id: int) -> int:
        """The changed partitions' state into their changelogs, inside the epoch's transaction."""
        size = 0
        for operator, state in self._keyed_states().items():
            changed = {p: state.snapshot_partition(p) for p in sorted(state.changed_partitions())}
            records = state_records(self._changelog_topic(operator), changed, checkpoint_id, self.instance.name)
            size += self.sink.write_records(records).bytes
            state.clear_changed()
        return size

    def _tagged(self, source: str, cut: SourceCheckpoint, checkpoint_id: int) -> list[TopicPartition]:
        """The cut's offsets, each naming the epoch and carrying its partition's largest event time."""
        tracker = self._sources[source].watermarks
        return [TopicPartition(cut.topic, partition, offset, metadata=checkpoint_metadata(
                    checkpoint_id, self.instance.name, tracker.max_event_time(partition)))
                for partition, offset in cut.offsets.items()]

    def abandon_checkpoint_attempt(self, attempt: CheckpointAttempt | None,
                                   reason: str) -> Mapping[str, SourceCheckpoint]:
        """Abort, then give every owned partition back its committed state: keyed state from the changelog,
        event time and offset as last committed (DESIGN.md, group rule 4). The attempt's id stays burned."""
        self._faults_since_commit += 1
        self._pending_dead_letters.clear()
        self.sink.abort_epoch()
        cuts = {}
        for name, source in self._sources.items():
            owned = source.owned()
            committed = self._committed_cuts.get(name, {})
            source.watermarks.rewind({p: t for p, t in self._committed_event_times.get(name, {}).items()
                                      if p in owned}, self._committed_watermarks.get(name))
            cuts[name] = SourceCheckpoint(name, source.settings.topic, {p: committed[p] for p in owned
                                                                         if p in committed})
            if name == SOURCE_NAME:
                self._restore_keyed(owned)
        self._watermark = self.current_watermark()
        log.warning("epoch abandoned", extra={"checkpoint_id": attempt and attempt.checkpoint_id, "reason": reason,
                                              "rewind_to": self._committed_id})
        self.sink.begin_epoch()
        return cuts

    # -- control and health ---------------------------------------------------------------------------
    def apply_control(self, msg: ControlMessage) -> Source | None:
        if msg.action == "drop":
            self._sources.pop(msg.source, None)
            self._source_settings.pop(msg.source, None)
            self.current_watermark()
            return None
        settings: SourceSettings = msg.settings
        self._source_settings[msg.source] = settings
        source = self._sources[msg.source] = self._new_source(settings)
        source.subscribe(self)
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
            self._changelog.close()
            self._state_lock.release()
