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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Protocol, cast

import orjson
import pyarrow as pa
from confluent_kafka import TopicPartition

from connectors.batch import SourceBatch
from connectors.checkpoint import SourceCheckpoint
from connectors.dead_letter import DeadLetter, PoisonRecord, dead_letters_from_rows, unwritten_dead_letters
from connectors.metadata import KEY, OFFSET, PARTITION, TIMESTAMP, is_metadata_column
from connectors.offset_metadata import CommittedEpoch, MalformedOffsetMetadata, checkpoint_metadata, committed_epoch
from connectors.source import KafkaSource, PartitionListener, SourceSettings, SourceUnavailable
from connectors.watermarks import WatermarkTracker, judge_event_time
from engine.checkpoint.coordinator import CheckpointCoordinator
from engine.checkpoint.loop import (
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
from engine.checkpoint.totals import EpochCounts, RunTotals
from engine.config import ConnectorConfig
from engine.instance import Instance, resolve_instance
from engine.metrics import Metrics
from engine.state import CheckpointIdLog, KeyedState, StateDirLock
from engine.state.changelog import (
    KafkaChangelogStorage,
    KafkaStateChangelog,
    StateChangelog,
    StateReadTimedOut,
    StateUnreadable,
    changelog_topic,
)
from engine.transforms import OperatorRuntimeError, Watermark
from engine.transforms.repartition import (
    carried,
    ipc_record,
    repartitioned_schema,
    restored,
    split_by_key,
    split_for_repartition,
)
from engine.wiring import (
    REPARTITION_SOURCE,
    SOURCE_NAME,
    CrashPoint,
    build_chain,
    build_external_sink,
    build_sink,
    check_sink_types,
    client_config,
    input_schema,
    repartition_source_settings,
    sink_format,
    source_settings,
)
from schemas import Format
from sinks import EpochAborted, KafkaWriter, OffsetCommit, OutgoingRecord, RefusedRow, Sink, SinkAssignment
from sinks.writer import Unwritten

log = logging.getLogger(__name__)

WAITING_LOG_INTERVAL_S = 5.0


class RecoveryError(RuntimeError):
    """What Kafka says committed cannot be restored; starting anyway would break exactness."""


class PipelineSource(Source, Protocol):
    """What the pipeline needs of a source beyond the loop's ``Source``: its format and watermarks,
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
    def commit_offsets(self, offsets: list[TopicPartition]) -> None: ...
    def lag(self) -> dict[int, int]: ...
    def end_offsets(self) -> dict[int, int]: ...


SourceOpener = Callable[[SourceSettings], PipelineSource]
CycleObserver = Callable[[Mapping[str, SourceCheckpoint]], None]


class KafkaPipeline(PipelineCallback, PartitionListener):
    """One connector instance: sources → operator chain → Kafka sink, one epoch per transaction, partitions
    from the connector's consumer group."""

    def __init__(self, config: ConnectorConfig, bootstrap: str, metrics: Metrics | None = None,
                 crash_point: CrashPoint | None = None, *, instance: Instance | None = None,
                 open_source: SourceOpener | None = None,
                 sink: Sink | None = None, changelog: StateChangelog | None = None,
                 cycle_observer: CycleObserver | None = None, stop: StopRequest | None = None,
                 totals: RunTotals | None = None) -> None:
        """``open_source``, ``sink`` and ``changelog`` replace the Kafka ones (the test driver's in-memory
        parts); by default sources are ``KafkaSource``s in the connector's group, the sink is what
        ``sink.delivery`` asks and keyed state goes to changelog topics. ``cycle_observer`` is told every
        source's position after each cycle (a progress bar). ``stop`` is polled between the steps of
        start-up, so a stop signal then is honoured within seconds. ``instance`` defaults to the one
        ``resolve_instance`` names (``EPOCHLINE_INSTANCE`` or the name kept in the state directory).
        ``totals`` is given each committed epoch's counts (a runner passes one to every pipeline it makes)."""
        self.config = config
        self.bootstrap = bootstrap
        self.instance = instance = instance or resolve_instance(config)
        self.metrics = metrics or Metrics()
        self._state_lock = StateDirLock(instance.state_dir)
        self._ids = CheckpointIdLog(instance.state_dir / "ids.log")
        self.chain = build_chain(config)
        self.stages = split_for_repartition(self.chain)
        self._keyed_source = REPARTITION_SOURCE if self.stages is not None else SOURCE_NAME
        """The source whose partitions keyed state is partitioned by."""
        self._judged_source = self._keyed_source if self._keyed_states() else None
        """The source whose rows are judged by event time: the one feeding event-time state, if any."""
        before_commit = (lambda: crash_point("between-flush-and-commit")) if crash_point is not None else None
        self._sink_format = sink_format(config)
        self.sink = sink or build_sink(config, bootstrap, transactional_id=instance.transactional_id,
                                       group_id=config.group_id, before_commit=before_commit,
                                       value_format=self._sink_format)
        self.external = build_external_sink(config)
        """The sink beyond Kafka the rows go to, if any: it prepares before the Kafka commit, finishes after."""
        self._crash_point = crash_point
        # A new owner's committed() waits while the old owner's transaction is open: up to its timeout.
        timeout = config.sink.transaction_timeout / 1000 + 10
        self._new_source = open_source or (lambda settings: KafkaSource(
            settings, bootstrap, config.group_id, member=instance.member(settings.name), timeout=timeout))
        self._changelog = changelog or KafkaStateChangelog(bootstrap, client_config(config), timeout)
        self.checkpoints = CheckpointCoordinator.new(self._ids).with_storage(
            KafkaChangelogStorage(self.sink, self._changelog, config.name, instance.name))
        """Every keyed state is captured and restored through it, on the changelog topics."""
        for operator, state in self._keyed_states().items():
            self.checkpoints.register_operator(operator, state)
        self._source_settings = {SOURCE_NAME: source_settings(config)}
        if self.stages is not None:
            # Rows of every source partition meet on the repartition topic: read them in event-time order.
            self._source_settings[SOURCE_NAME] = replace(self._source_settings[SOURCE_NAME], align_event_time=True)
            self._source_settings[REPARTITION_SOURCE] = repartition_source_settings(self._source_settings[SOURCE_NAME],
                                                                                    config)
        self._partitions = 0
        self._repartition_pending = False
        self._repartition_ends: dict[int, int] | None = None
        self._waiting_logged_at = float("-inf")
        self._sources: dict[str, PipelineSource] = {}
        self._control: EpochControl | None = None
        self._committed_cuts: dict[str, dict[int, int]] = {}
        self._committed_event_times: dict[str, dict[int, int]] = {}
        self._committed_watermarks: dict[str, int | None] = {}
        self._committed_id: int | None = None
        self._pending_dead_letters: list[DeadLetter] = []
        self._epoch = EpochCounts()
        self.totals = totals or RunTotals()
        self._committed_dead_letters: dict[str, dict[int, int]] = {}
        """Per source and partition, its records dead-lettered in all committed epochs (offset metadata)."""
        self._faults_since_commit = 0
        self._cycle_bytes_in = 0
        self._cycle_observer = cycle_observer
        self._stop = stop or StopRequest()
        if isinstance(self.sink, KafkaWriter):
            self.sink.interrupted = lambda: self._stop.requested

    # -- start-up ---------------------------------------------------------------------------------
    def recover(self, control: EpochControl) -> list[Source]:
        """Fence the previous incarnation, wait for it to exit, then join the group: committed offsets are
        read (in the assignment callback, inside a later poll) only after the fence (DESIGN.md, "Recovery").

        The fence (``sink.start``: a connection, then ``init_transactions``) is mostly waiting on the broker,
        so it runs on a thread of its own while this one opens the sources and checks the transform: work
        that joins no group and reads no record, so it may run before the fence is done."""
        self._control = control
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fence") as fencing:
            fenced = fencing.submit(self.sink.start)  # fences the previous incarnation first, so it stops writing...
            self._open_sources()
            fenced.result()
        self._honour_stop("fencing")
        self._state_lock.acquire(timeout_s=self.config.checkpoint.timeout / 1000 * 2,  # ...then waits for it to exit
                                 interrupted=lambda: self._stop.requested)
        self._honour_stop("waiting for the previous instance to exit")
        self._recover_external_sink()
        self.sink.begin_epoch()
        for source in self._sources.values():
            source.subscribe(self)
        self._observe_positions()
        return list(self._sources.values())

    def _recover_external_sink(self) -> None:
        """Open the external sink and resolve what this instance's previous incarnation left prepared, by
        the checkpoint Kafka says this instance committed last. Only now: the fence has made sure that
        incarnation can commit nothing more. (In group mode an instance's partitions may since have been
        committed by another instance, hiding its last commit; the external sinks support single instances.)"""
        if self.external is None:
            return
        self.external.open(SinkAssignment(self.config.name, self.instance.name))
        self.external.recover(self._last_committed_by_this_instance())
        self._crash("during-recover")

    def _last_committed_by_this_instance(self) -> int | None:
        """The largest checkpoint id the committed offsets' metadata names with this instance."""
        committed = self._sources[SOURCE_NAME].committed_metadata()
        epochs = [committed_epoch(metadata) for _, metadata in committed.values()]
        return max((epoch.checkpoint_id for epoch in epochs if epoch and epoch.instance == self.instance.name),
                   default=None)

    def _crash(self, moment: str) -> None:
        """Crash tests' hook at a moment of the external sink's two-phase commit (``engine.testing.faults``)."""
        if self._crash_point is not None:
            self._crash_point(moment)

    def _open_sources(self) -> None:
        """Every source made and its topic described (a missing topic fails here), the internal topics
        ensured and the transform checked against the input schema; nothing subscribed yet."""
        self._sources[SOURCE_NAME] = self._new_source(self._source_settings[SOURCE_NAME])
        self._partitions = len(self._sources[SOURCE_NAME].partitions())
        self._ensure_internal_topics()
        for name, settings in self._source_settings.items():
            if name not in self._sources:
                self._sources[name] = self._new_source(settings)
            self._honour_stop("opening the sources")
        self._validate_chain()

    def _honour_stop(self, during: str) -> None:
        if self._stop.requested:
            raise StoppedBeforeStart(f"stop requested while {during}; nothing was committed")

    def _validate_chain(self) -> None:
        """A bad query or function, or output the sink format cannot write, is a config error at start, not a
        crash mid-stream."""
        schema = input_schema(self._sources[SOURCE_NAME].format)
        if schema is None:
            self.chain.check_without_schema()
            return
        if self.stages is None:
            output = self.chain.validate(schema)
        else:
            output = self.stages.after.validate(repartitioned_schema(self.stages.before.validate(schema)))
        if self.config.kafka_sink is not None and self._sink_format is not None:
            check_sink_types(self.config.kafka_sink, output, self._sink_format)

    def _keyed_states(self) -> dict[str, KeyedState]:
        """Operator name -> its state, partitioned like the config's source."""
        return self.chain.states

    def _changelog_topic(self, operator: str) -> str:
        return changelog_topic(self.config.name, operator)

    def _ensure_internal_topics(self) -> None:
        """One compacted changelog per stateful operator and, when rows are re-keyed, the repartition topic:
        all partitioned like the source, so partition p of each belongs with source partition p."""
        for operator in self._keyed_states():
            self._changelog.ensure(self._changelog_topic(operator), self._partitions, compacted=True)
        if self.stages is not None:
            self._changelog.ensure(self._source_settings[REPARTITION_SOURCE].topic, self._partitions,
                                   compacted=False)

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
        if source == self._keyed_source:
            self._restore_keyed(partitions)
        if self._cycle_observer is not None:  # where the new partitions stand, before anything is read
            self._cycle_observer({source: SourceCheckpoint(source, reader.settings.topic, starts)})
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
        if epoch.dead_letters is not None:
            self._committed_dead_letters.setdefault(source, {})[partition] = epoch.dead_letters
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
            self._committed_dead_letters.get(source, {}).pop(partition, None)
        if source == self._keyed_source:
            for state in self._keyed_states().values():
                for partition in partitions:
                    state.drop_partition(partition)

    def _restore_keyed(self, partitions: Sequence[int]) -> None:
        """Each partition's keyed state from the last committed record of its changelog partition."""
        try:
            restored = self.checkpoints.restore_partitions(partitions)
        except StateReadTimedOut as error:  # e.g. a dead owner's transaction not yet timed out
            raise SourceUnavailable(f"restoring {error.key.operator!r} partition {error.key.partition}: "
                                    f"{error.cause}") from error
        except StateUnreadable as error:
            raise RecoveryError(f"the state of {error.key.operator!r} partition {error.key.partition} cannot be "
                                f"read from {error.topic!r} ({error.cause}); starting without it would lose "
                                "window results") from error
        for operator, done in restored.items():
            self.metrics.state_restored(operator, seconds=done.seconds, size_bytes=done.size_bytes)
            log.info("state restored", extra={"operator": operator, "partitions": list(partitions),
                                              "bytes": done.size_bytes, "seconds": round(done.seconds, 3)})

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
        """The batch's decode failures to the dead-letter topic, and, only for the source whose rows feed
        event-time state (``_judged_source``), the rows that state can no longer take: late rows (behind
        their partition's threshold, ``_late_thresholds``) dead-lettered or dropped as ``late_rows`` says,
        and rows without an event time dead-lettered. Any other source's rows are never judged by their
        timestamps (DESIGN.md, "Event time judges only what holds event-time state")."""
        self._pending_dead_letters += batch.dead_letters
        self._cycle_bytes_in += batch.value_bytes
        if source == SOURCE_NAME:  # the repartition topic's rows were counted when their records were read
            self._epoch.records_in += batch.batch.num_rows + len(batch.dead_letters)
        self.metrics.dead_letters(len(batch.dead_letters))
        rows = restored(batch.batch) if source == REPARTITION_SOURCE else batch.batch
        if source != self._judged_source:
            return SourceBatch(source=batch.source, batch=rows, dead_letters=[], value_bytes=batch.value_bytes)
        thresholds = self._late_thresholds(source)
        column = self._source_settings[source].event_time_column
        judged = judge_event_time(rows, thresholds, column)
        if judged.late.num_rows:
            self._set_apart_late(source, judged.late, thresholds)
        if judged.untimed.num_rows:
            self._pending_dead_letters += self._dead_letters_from_rows(
                source, judged.untimed, f"no event time: column {column or TIMESTAMP!r} is null", "event-time")
            self.metrics.dead_letters(judged.untimed.num_rows)
            log.warning("rows without event time dead-lettered", extra={
                "source": source, "rows": judged.untimed.num_rows, "column": column or TIMESTAMP})
        return SourceBatch(source=batch.source, batch=judged.on_time, dead_letters=[], value_bytes=batch.value_bytes)

    def _set_apart_late(self, source: str, late: pa.RecordBatch, thresholds: Mapping[int, int]) -> None:
        """Late rows to the dead-letter topic (or dropped, ``late_rows: drop``), counted, and said in one
        warning line per cycle: how many, of which partitions, behind which thresholds."""
        diverted = self.config.late_rows == "dead-letter"
        self.metrics.late_rows(late.num_rows, diverted=diverted)
        partitions = sorted(set(cast(list[int], late.column(PARTITION).to_pylist())))
        behind = {p: thresholds[p] for p in partitions if p in thresholds}
        if diverted:
            self._pending_dead_letters += self._dead_letters_from_rows(
                source, late, f"late row: event time behind its partition's watermark {behind}", "late")
        log.warning("late rows dead-lettered" if diverted else "late rows dropped", extra={
            "source": source, "rows": late.num_rows, "partitions": partitions, "thresholds": behind,
            "allowed_lateness_ms": self._source_settings[source].allowed_lateness_ms})

    def _late_thresholds(self, source: str) -> dict[int, int]:
        """The source's per-partition thresholds, never below what keyed state already closed: a partition's
        own threshold can be lower (it moved here, or its quiet windows were closed while it was idle), and
        a row between the two would fall in a window already emitted."""
        thresholds = self._sources[source].watermarks.late_thresholds()
        for state in self._keyed_states().values():
            for partition, closed in state.closed_through().items():
                thresholds[partition] = max(thresholds.get(partition, closed), closed)
        return thresholds

    def _dead_letters_from_rows(self, source: str, rows: pa.RecordBatch | pa.Table, reason: str,
                                stage: str) -> list[DeadLetter]:
        return dead_letters_from_rows(rows, self._sources[source].format, self._source_settings[source].topic,
                                      reason, stage)

    def extract_watermark(self, source: str, batch: SourceBatch) -> None:
        self._sources[source].observe_event_times(batch.batch)

    def current_watermark(self) -> Watermark:
        """Per partition of the source keyed state is partitioned by, how far its windows may close: its own
        stream time minus the allowed lateness (Kafka Streams' stream time), so a partition taken over with a
        backlog closes its windows as it catches up instead of finding them closed by the partitions its new
        owner had already read further. A partition idle past ``idle_timeout`` with nothing waiting closes
        its open windows by the others' progress (``WatermarkTracker.closing_watermarks``). None without
        event-time state: nothing would use it."""
        if self._judged_source is None:
            return None
        source = self._sources[self._judged_source]
        open_until: dict[int, int] = {}
        for state in self._keyed_states().values():
            for partition, end in state.open_until().items():
                open_until[partition] = max(open_until.get(partition, end), end)
        if not source.watermarks.idle_partitions():
            return source.watermarks.closing_watermarks(open_until)
        busy = {partition for partition, lag in source.lag().items() if lag > 0}
        return source.watermarks.closing_watermarks(open_until, busy)

    def execute_cycle(self, source_batches: Sequence[SourceBatch], watermark: Watermark) -> pa.Table | None:
        batches = [b.batch for b in source_batches if b.batch.num_rows]
        table = pa.Table.from_batches(batches) if batches else None
        source = source_batches[0].source if source_batches else None
        try:
            if self.stages is not None and source == SOURCE_NAME:
                if table is not None:
                    self._repartition(self.stages.before.process(table, watermark))
                return None
            chain = self.stages.after if self.stages is not None else self.chain
            if table is None and not watermark:
                return None
            return chain.process(table if table is not None else chain.empty_input(), watermark)
        except OperatorRuntimeError as error:
            self.metrics.cycle_failed()
            if not self.fault_on_cycle_error():
                for batch in source_batches:
                    self._pending_dead_letters += self._dead_letters_from_rows(
                        batch.source, batch.batch, f"transform failed: {error}", "transform")
                self._write_dead_letters()
            raise CycleFailed(str(error)) from error

    def _repartition(self, table: pa.Table) -> None:
        """The first stage's rows to the repartition topic, one ``arrow-ipc`` record per partition their
        window key hashes to, in the open epoch's transaction."""
        if not table.num_rows or self.stages is None:
            return
        topic = self._source_settings[REPARTITION_SOURCE].topic
        records = [OutgoingRecord(topic, partition, ipc_record(part))
                   for partition, part in sorted(split_by_key(carried(table), self.stages.key,
                                                              self._partitions).items())]
        self.sink.write_records(records)
        self._repartition_pending = True

    def input_ended(self, ends: Mapping[str, Mapping[int, int]]) -> bool:
        """The group committed everything up to ``ends`` (captured when this instance started) and, when
        rows are repartitioned, every repartitioned row of that input: the repartition topic's end is
        taken once the input is committed (by then nobody writes to it any more), and this instance's own
        repartitioned rows are committed."""
        if not all(source.reached(ends[name]) for name, source in self._sources.items() if name in ends):
            return False
        if self.stages is None:
            return True
        if self._repartition_pending:
            return False
        repartitioned = self._sources[REPARTITION_SOURCE]
        if self._repartition_ends is None:
            self._repartition_ends = repartitioned.end_offsets()
            log.info("input committed; waiting for its repartitioned rows", extra={
                "repartition_ends": self._repartition_ends})
        if repartitioned.reached(self._repartition_ends):
            return True
        self._log_waiting(repartitioned)
        return False

    def _log_waiting(self, source: PipelineSource) -> None:
        now = time.monotonic()
        if now - self._waiting_logged_at >= WAITING_LOG_INTERVAL_S:
            self._waiting_logged_at = now
            log.info("waiting for the group to commit the end", extra={
                "source": source.name, "positions": dict(source.position().offsets), "ends": self._repartition_ends})

    def _write_dead_letters(self) -> None:
        """The pending dead letters into the open epoch's transaction, counted for its commit."""
        letters, self._pending_dead_letters = self._pending_dead_letters, []
        self._epoch.count_dead_letters(letters)
        self.sink.write_dead_letters(letters)

    def write_to_sinks(self, results: pa.Table | None) -> None:
        """The cycle's rows to the sink (the external one, else the Kafka topic); rows it refuses become dead
        letters of the epoch, or halt the connector with ``on_error: halt``."""
        if results is not None:
            letters = self._write_rows(results)
            if letters and self._source_settings[SOURCE_NAME].on_error == "halt":
                raise PoisonRecord(letters[0])
            self._pending_dead_letters += letters
        self._write_dead_letters()

    def _write_rows(self, results: pa.Table) -> list[DeadLetter]:
        if self.external is not None:
            refused = self.external.write(results)
            written, written_bytes = results.num_rows - len(refused), 0
            letters = [self._refused_dead_letter(results, row) for row in refused]
        else:
            produced = self.sink.write(results)
            written, written_bytes = produced.records, produced.bytes
            letters = self._unwritten_dead_letters(results, produced.unwritten) if produced.unwritten else []
        self.metrics.records_out(written, bytes_out=written_bytes)
        self._epoch.records_out += written
        return letters

    def _unwritten_dead_letters(self, results: pa.Table, unwritten: Sequence[Unwritten]) -> list[DeadLetter]:
        """Output rows the sink's format refused: the source records they are, or (after a repartition,
        whose rows come from the repartition topic) the rows as JSON."""
        return unwritten_dead_letters(
            results, unwritten, source_topic=self._source_settings[SOURCE_NAME].topic,
            source_format=self._sources[SOURCE_NAME].format if self.stages is None else None,
            sink_topic=self.config.kafka_sink.topic if self.config.kafka_sink is not None else "")

    def _refused_dead_letter(self, results: pa.Table, refused: RefusedRow) -> DeadLetter:
        """A row the external sink refused, as a dead letter: the output row in JSON, and where it came from
        when the transform kept the Kafka metadata columns (partition and offset -1 otherwise)."""
        row = results.slice(refused.index, 1).to_pylist()[0]
        partition, offset = row.get(PARTITION, -1), row.get(OFFSET, -1)
        value = orjson.dumps({name: value for name, value in row.items() if not is_metadata_column(name)},
                             default=str)
        return DeadLetter(topic=self._source_settings[SOURCE_NAME].topic, partition=partition, offset=offset,
                          key=row.get(KEY), value=value, reason=refused.reason, stage="sink")

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
        triggered = self.checkpoints.trigger_checkpoint()
        return CheckpointAttempt(triggered.checkpoint_id, triggered.triggered_at)

    def checkpoint_with_barrier(self, source_checkpoints: Mapping[str, SourceCheckpoint],
                                attempt: CheckpointAttempt) -> None:
        started = time.monotonic()
        checkpoint_id = attempt.checkpoint_id
        try:
            state_bytes = self._capture_keyed_state(checkpoint_id)
            self._prepare_external(checkpoint_id)
            self.sink.commit_epoch([OffsetCommit(self._tagged(name, cut, checkpoint_id),
                                                 self._sources[name].consumer_group_metadata(),
                                                 self._sources[name].commit_offsets)
                                    for name, cut in source_checkpoints.items()])
        except EpochAborted as error:
            raise CheckpointAbandoned(f"checkpoint {checkpoint_id}: {error}") from error
        self.checkpoints.complete_checkpoint(checkpoint_id, success=True)
        self.checkpoints.clear_old_checkpoints(keep=1)  # compaction keeps one state per partition anyway
        self._finish_external(checkpoint_id)
        self._committed_id = checkpoint_id
        for name, cut in source_checkpoints.items():
            self._committed_cuts.setdefault(name, {}).update(cut.offsets)
            self._committed_dead_letters.setdefault(name, {}).update(self._dead_letter_totals(name, cut))
            tracker = self._sources[name].watermarks
            self._committed_event_times[name] = tracker.max_event_times()
            self._committed_watermarks[name] = tracker.current()
        self.totals.add_committed(self._epoch)
        self._epoch = EpochCounts()
        self._faults_since_commit = 0
        self._repartition_pending = False
        self.metrics.checkpoint(duration_s=time.monotonic() - started, size_bytes=state_bytes)
        for source in self._sources.values():
            self.metrics.lag(source.name, source.lag())
        log.info("checkpoint committed", extra={"checkpoint_id": checkpoint_id, "state_bytes": state_bytes})
        self.sink.begin_epoch()

    def _prepare_external(self, checkpoint_id: int) -> None:
        """The external sink's epoch made durable before the Kafka commit decides it."""
        if self.external is not None:
            self._crash("before-prepare")
            self.external.prepare(checkpoint_id)
            self._crash("after-prepare")

    def _finish_external(self, checkpoint_id: int) -> None:
        """Kafka committed the epoch: the external sink publishes it (or the next start's recovery does)."""
        if self.external is not None:
            self._crash("before-finish")
            self.external.commit(checkpoint_id)

    def _capture_keyed_state(self, checkpoint_id: int) -> int:
        """The changed partitions' state into their changelogs, inside the epoch's transaction (the
        coordinator's storage is ``KafkaChangelogStorage`` over this pipeline's sink)."""
        return self.checkpoints.capture_checkpoint(checkpoint_id)

    def _tagged(self, source: str, cut: SourceCheckpoint, checkpoint_id: int) -> list[TopicPartition]:
        """The cut's offsets, each naming the epoch and carrying its partition's largest event time and its
        dead letters so far, this epoch's included (``connectors.offset_metadata.checkpoint_metadata``)."""
        tracker = self._sources[source].watermarks
        now_ms = time.time_ns() // 1_000_000
        dead_letters = self._dead_letter_totals(source, cut)
        return [TopicPartition(cut.topic, partition, offset, metadata=checkpoint_metadata(
                    checkpoint_id, self.instance.name, tracker.max_event_time(partition), now_ms,
                    dead_letters[partition]))
                for partition, offset in cut.offsets.items()]

    def _dead_letter_totals(self, source: str, cut: SourceCheckpoint) -> dict[int, int]:
        """Per partition of the cut: its dead letters in committed epochs plus those of the open epoch. A
        transform's row the sink's format refused comes from no source partition (its dead letter names the
        sink topic, partition -1); its count rides on the main source's first partition in the cut, so the
        connector's committed total still counts every dead letter."""
        committed = self._committed_dead_letters.get(source, {})
        totals = {partition: committed.get(partition, 0) + self._epoch.dead_letters[(cut.topic, partition)]
                  for partition in cut.offsets}
        if source == SOURCE_NAME and totals:
            totals[min(totals)] += self._epoch.unattributed_dead_letters
        return totals

    def abandon_checkpoint_attempt(self, attempt: CheckpointAttempt | None,
                                   reason: str) -> Mapping[str, SourceCheckpoint]:
        """Abort, then give every owned partition back its committed state: keyed state from the changelog,
        event time and offset as last committed (DESIGN.md, group rule 4). The attempt's id stays burned."""
        self._faults_since_commit += 1
        self._pending_dead_letters.clear()
        self._epoch = EpochCounts()
        self.sink.abort_epoch()
        if self.external is not None:
            self.external.abort(attempt.checkpoint_id if attempt is not None else None)
        if attempt is not None:
            self.checkpoints.complete_checkpoint(attempt.checkpoint_id, success=False)
        cuts = {}
        for name, source in self._sources.items():
            owned = source.owned()
            committed = self._committed_cuts.get(name, {})
            source.watermarks.rewind({p: t for p, t in self._committed_event_times.get(name, {}).items()
                                      if p in owned}, self._committed_watermarks.get(name))
            cuts[name] = SourceCheckpoint(name, source.settings.topic, {p: committed[p] for p in owned
                                                                         if p in committed})
            if name == self._keyed_source:
                self._restore_keyed(owned)
        log.warning("epoch abandoned", extra={"checkpoint_id": attempt and attempt.checkpoint_id, "reason": reason,
                                              "rewind_to": self._committed_id})
        self.sink.begin_epoch()
        return cuts

    # -- control and health ---------------------------------------------------------------------------
    def apply_control(self, msg: ControlMessage) -> Source | None:
        if msg.action == "drop":
            self._sources.pop(msg.source, None)
            self._source_settings.pop(msg.source, None)
            return None
        settings: SourceSettings = msg.settings
        self._source_settings[msg.source] = settings
        source = self._sources[msg.source] = self._new_source(settings)
        source.subscribe(self)
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
            if self.external is not None:
                self.external.close()
        finally:
            self._changelog.close()
            self._state_lock.release()
