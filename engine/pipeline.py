"""The production ``PipelineCallback``: a connector config wired to Kafka sources, operators and a sink.

Where each step of the epoch protocol (DESIGN.md) happens:

* **Reserve**: ``reserve_checkpoint_attempt`` appends the id to the durable id log first.
* **Barrier / drain**: the coordinator cuts every source at one point of its loop; everything handed out
  before it has already gone through the operators into the open transaction, so draining is complete.
* **Capture**: ``checkpoint_with_barrier`` snapshots operator and watermark state under the id and
  persists it (temp file, fsync, rename, fsync dir, checksum).
* **Commit point**: the sink flushes, sends the cut offsets tagged ``epochline:checkpoint=N`` and
  commits the Kafka transaction. Only then is the checkpoint completed locally and reported.
* **Abandon**: abort the transaction, restore the last committed state, rewind to the last committed cut.
* **Recovery** (``recover``): ``init_transactions`` fences the previous instance and aborts its open
  transaction; the group's committed offsets name the last committed checkpoint M; exactly M's state is
  restored, state above M (never committed) is deleted, and sources resume at the committed offsets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import pyarrow as pa

from connectors.admin import end_offsets
from connectors.checkpoint import SourceCheckpoint
from connectors.dead_letter import DeadLetter
from connectors.source import METADATA_FIELDS, KafkaSource, SourceBatch, SourceSettings
from connectors.watermarks import filter_late_rows
from engine.checkpoints import (
    CheckpointCoordinator,
    CheckpointError,
    CheckpointIdLog,
    FileCheckpointStorage,
    StateDirLock,
)
from engine.config import ConnectorConfig, SourceConfig, StepConfig
from engine.coordinator import (
    CheckpointAbandoned,
    CheckpointAttempt,
    ControlMessage,
    CycleFailed,
    PipelineCallback,
    Source,
)
from engine.metrics import Metrics
from engine.operators import (
    Operator,
    OperatorChain,
    OperatorRuntimeError,
    PythonOperator,
    SqlOperator,
    build_chain,
)
from engine.windows import WindowOperator, WindowSpec
from schemas import Format, make_format
from sinks.kafka import (
    AtLeastOnceKafkaSink,
    EpochAborted,
    Sink,
    SinkSettings,
    TransactionalKafkaSink,
    checkpoint_id_from_metadata,
    checkpoint_metadata,
)

log = logging.getLogger(__name__)

WATERMARK_STATE_PREFIX = "watermarks/"
SOURCE_NAME = "source"  # the config's source; streams added while running bring their own names


class RecoveryError(RuntimeError):
    """The committed checkpoint named by Kafka cannot be restored; starting anyway would break exactness."""


def build_operator(step: StepConfig, index: int) -> Operator:
    name = f"step{index}"
    if step.sql is not None:
        return SqlOperator(step.sql, name=f"{name}-sql")
    if step.python is not None:
        return PythonOperator(step.python, name=f"{name}-python")
    assert step.window is not None
    window = step.window
    spec = WindowSpec(kind=window.kind, size_ms=window.size, slide_ms=window.slide, key=list(window.key),
                      time_column=window.time_column, aggregates=dict(window.aggregates))
    return WindowOperator(spec, name=f"{name}-window")


def source_settings(config: ConnectorConfig, source: SourceConfig, name: str) -> SourceSettings:
    return SourceSettings(
        name=name,
        topic=source.topic,
        format=source.format_spec(config.base_dir),
        max_batch_records=source.max_batch_records,
        max_batch_bytes=source.max_batch_bytes,
        start_from=source.start_from,
        event_time_column=source.event_time.column,
        allowed_lateness_ms=source.event_time.allowed_lateness,
        idle_timeout_ms=source.event_time.idle_timeout,
        on_error="halt" if source.on_error == "halt" else "dead-letter",  # fail-item: the batch job's call
        consumer_config=dict(source.consumer),
    )


def sink_settings(config: ConnectorConfig, transactional_id: str, group_id: str) -> SinkSettings:
    sink = config.sink
    return SinkSettings(
        topic=sink.topic,
        transactional_id=transactional_id,
        group_id=group_id,
        dead_letter_topic=config.dead_letter.topic if config.dead_letter else None,
        key_column=sink.key,
        include_metadata=tuple(sink.include_metadata),
        transaction_timeout_ms=sink.transaction_timeout,
        producer_config=dict(sink.producer),
    )


def input_schema(value_format: Format) -> pa.Schema | None:
    """The rows a cycle sees: the value columns plus the Kafka metadata columns; None when inferred."""
    if value_format.arrow_schema is None:
        return None
    return pa.schema(list(value_format.arrow_schema) + list(METADATA_FIELDS))


def build_chain_for(config: ConnectorConfig) -> OperatorChain:
    return build_chain([build_operator(step, index) for index, step in enumerate(config.transform)])


def validate_offline(config: ConnectorConfig) -> None:
    """Everything that can be checked without a broker: schemas load, the sink format builds, and the
    transform accepts the source's schema (when the source has an explicit schema)."""
    source_format = make_format(config.source.format_spec(config.base_dir))
    make_format(config.sink.format_spec(config.base_dir))
    schema = input_schema(source_format)
    if schema is not None:
        build_chain_for(config).validate(schema)


class KafkaPipeline(PipelineCallback):
    """One connector: sources → operator chain → Kafka sink, checkpointed as one epoch per transaction."""

    def __init__(self, config: ConnectorConfig, bootstrap: str, metrics: Metrics | None = None) -> None:
        self.config = config
        self.bootstrap = bootstrap
        self.metrics = metrics or Metrics()
        self.exactly_once = config.sink.delivery == "exactly-once"
        self._state_lock = StateDirLock(config.state_dir)
        self.checkpoints = CheckpointCoordinator(FileCheckpointStorage(config.state_dir),
                                                 CheckpointIdLog(config.state_dir / "ids.log"))
        self.chain = build_chain_for(config)
        self.sink = self._build_sink()
        self._source_settings = {SOURCE_NAME: source_settings(config, config.source, SOURCE_NAME)}
        self._sources: dict[str, KafkaSource] = {}
        self._committed_id: int | None = None
        self._committed_cuts: dict[str, SourceCheckpoint] = {}
        self._initial_state: dict[str, bytes] = {}
        self._pending_dead_letters: list[DeadLetter] = []
        self._faults_since_commit = 0

    def _build_sink(self) -> Sink:
        settings = sink_settings(self.config, self.config.transactional_id, self.config.group_id)
        value_format = make_format(self.config.sink.format_spec(self.config.base_dir))
        sink_class = TransactionalKafkaSink if self.exactly_once else AtLeastOnceKafkaSink
        return sink_class(settings, self.bootstrap, value_format)

    # -- recovery ---------------------------------------------------------------------------------
    def recover(self) -> list[Source]:
        self.sink.start()  # fences the previous instance first, so it stops writing state...
        self._state_lock.acquire(timeout_s=self.config.checkpoint.timeout / 1000 * 2)  # ...then waits for it to exit
        for name, settings in self._source_settings.items():
            self._open_source(name, settings)
        self._validate_chain()
        self._register_state()
        self._initial_state = {name: state.snapshot() for name, state in self._states().items()}
        self._restore_committed_state()
        self.sink.begin_epoch()
        return list(self._sources.values())

    def _open_source(self, name: str, settings: SourceSettings) -> KafkaSource:
        source = KafkaSource(settings, self.bootstrap, self.config.group_id)
        committed, metadata = source.committed()
        checkpoint_id = checkpoint_id_from_metadata(metadata)
        if checkpoint_id is not None:
            self._committed_id = max(self._committed_id or 0, checkpoint_id)
        source.open(committed)
        self._sources[name] = source
        self._committed_cuts[name] = source.position()
        log.info("source opened", extra={"source": name, "topic": settings.topic,
                                         "committed_checkpoint": checkpoint_id,
                                         "offsets": dict(self._committed_cuts[name].offsets)})
        return source

    def _validate_chain(self) -> None:
        """A bad query or function is a config error at start, not a crash mid-stream."""
        schema = input_schema(next(iter(self._sources.values())).format)
        if schema is not None:
            self.chain.validate(schema)

    def _states(self) -> dict:
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

    @staticmethod
    def end_offsets_of(config: ConnectorConfig, bootstrap: str) -> dict[str, dict[int, int]]:
        """Per source, the partition end offsets now: where ``--stop-at-end`` stops."""
        return {SOURCE_NAME: end_offsets(bootstrap, config.source.topic)}

    # -- one cycle ---------------------------------------------------------------------------------
    def filter_late_rows(self, source: str, batch: SourceBatch) -> SourceBatch:
        self._pending_dead_letters += batch.dead_letters
        self.metrics.dead_letters(len(batch.dead_letters))
        watermark = self.current_watermark()
        settings = self._source_settings[source]
        on_time, late = filter_late_rows(batch.batch, watermark, settings.event_time_column)
        if late.num_rows:
            self.metrics.late_rows(late.num_rows, diverted=self.config.late_rows == "dead-letter")
            if self.config.late_rows == "dead-letter":
                self._pending_dead_letters += self._dead_letters_from_rows(
                    source, late, f"late row: event time behind watermark {watermark}", "late")
        return SourceBatch(source=batch.source, batch=on_time, dead_letters=[])

    def _dead_letters_from_rows(self, source: str, rows: pa.RecordBatch | pa.Table, reason: str,
                                stage: str) -> list[DeadLetter]:
        """Decoded rows back to their wire format, so a dead-letter record can be replayed as it came."""
        table = pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows
        value_columns = [c for c in table.column_names if not c.startswith("__kafka_")]
        values: list[bytes] = []
        for batch in table.select(value_columns).to_batches():
            values += self._sources[source].format.encode(batch)
        topic = self._source_settings[source].topic
        return [
            DeadLetter(topic=topic, partition=partition, offset=offset, key=key, value=value, reason=reason, stage=stage)
            for partition, offset, key, value in zip(
                table.column("__kafka_partition").to_pylist(), table.column("__kafka_offset").to_pylist(),
                table.column("__kafka_key").to_pylist(), values)
        ]

    def extract_watermark(self, source: str, batch: SourceBatch) -> None:
        self._sources[source].observe_event_times(batch.batch)

    def current_watermark(self) -> int | None:
        """The minimum over sources; None until every source has one (a silent source holds it back)."""
        marks = [source.watermarks.current() for source in self._sources.values()]
        known = [mark for mark in marks if mark is not None]
        return min(known) if known and len(known) == len(marks) else None

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
        written = self.sink.write(results) if results is not None else 0
        self.sink.write_dead_letters(self._take_dead_letters())
        self.metrics.records_out(written)

    def record_cycle(self, events: int, batches: int, elapsed_ns: int) -> None:
        self.metrics.record_cycle(records_in=events, batches=batches, elapsed_ns=elapsed_ns,
                                  phase_ns=self.chain.last_cycle_ns)

    # -- checkpoints -------------------------------------------------------------------------------
    def reserve_checkpoint_attempt(self) -> CheckpointAttempt:
        return CheckpointAttempt(self.checkpoints.reserve_id())

    def checkpoint_with_barrier(self, source_checkpoints: Mapping[str, SourceCheckpoint],
                                attempt: CheckpointAttempt) -> None:
        started = time.monotonic()
        checkpoint_id = attempt.checkpoint_id
        try:
            metadata = self.checkpoints.trigger_checkpoint(
                checkpoint_id, extra={name: cut.to_bytes().decode() for name, cut in source_checkpoints.items()})
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
        log.warning("epoch abandoned", extra={"checkpoint_id": attempt and attempt.checkpoint_id, "reason": reason,
                                              "rewind_to": self._committed_id})
        self.sink.begin_epoch()
        return dict(self._committed_cuts)

    # -- control and health ---------------------------------------------------------------------------
    def apply_control(self, msg: ControlMessage) -> Source | None:
        if msg.action == "drop":
            self._sources.pop(msg.source, None)
            self._source_settings.pop(msg.source, None)
            return None
        settings: SourceSettings = msg.settings
        self._source_settings[msg.source] = settings
        source = self._open_source(msg.source, settings)
        self.checkpoints.register_operator(WATERMARK_STATE_PREFIX + msg.source, source.watermarks)
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
