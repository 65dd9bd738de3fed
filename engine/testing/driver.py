"""``TransformTestDriver``: test a connector's transform in milliseconds, without Kafka.

Like Kafka Streams' ``TopologyTestDriver``: give it a connector config, feed it records (rows, or raw bytes
in the source format, with key, partition and timestamp), advance event time, and read what the sink and
the dead-letter topic would receive, as records in the sink's encoding and as rows.

What makes a test on the driver mean something for a run on a broker: the driver replaces only Kafka. It
runs the connector's real ``KafkaPipeline`` under the real ``EpochLoop`` (late-row filtering,
watermarks, the operator chain, windows, transform-error handling, checkpoint capture and restore), over an
in-memory topic that decodes with the source code's own ``decode_records`` and an in-memory sink that
encodes with the sinks' own ``encode_rows``. Output becomes visible the way a ``read_committed`` reader
sees it: when the epoch's checkpoint commits. The in-memory commit records the cut with its checkpoint id and
the changed window state as changelog records, exactly as the transactional sink does, so ``snapshot`` and
a new driver built from it go through the real recovery path (partitions assigned, state restored from the
changelog, sources resumed at the committed offsets).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from confluent_kafka import TopicPartition

from connectors.batch import SourceBatch
from connectors.checkpoint import SourceCheckpoint
from connectors.dead_letter import DeadLetter
from connectors.fetched import RecordColumns
from connectors.source import PartitionListener, SourceSettings, decode_records
from connectors.watermarks import WatermarkTracker, observe_batch
from engine.checkpoint import EpochLoop, EpochLoopSettings, KafkaPipeline
from engine.config import ConnectorConfig, load_config
from engine.instance import Instance
from engine.metrics import Metrics
from engine.wiring import sink_format, sink_settings, source_format
from schemas import Format, make_format
from sinks import OffsetCommit, OutgoingRecord, Produced, encode_rows
from sinks.writer import dead_letter_topic, produced

NO_TIMESTAMP = -1


@dataclass(frozen=True)
class DriverRecord:
    """One record the sink or the dead-letter topic would receive."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, str | bytes | None]] = field(default_factory=list)


@dataclass
class _Record:
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


@dataclass(frozen=True)
class DriverSnapshot:
    """What a later driver restores from: what Kafka would hold (the topics a connector reads with the
    group's committed offsets and their checkpoint ids, the changelog topics' last committed state)."""

    topics: dict[str, _MemoryTopic]
    changelogs: dict[str, dict[int, bytes]]


class _MemoryTopic:
    """A topic's partitions and the group's committed offsets with their metadata."""

    def __init__(self, partitions: int) -> None:
        self.records: dict[int, list[_Record]] = {partition: [] for partition in range(partitions)}
        self.committed: dict[int, tuple[int, str]] = {}

    def end(self, partition: int) -> int:
        return len(self.records[partition])

    def copy(self) -> _MemoryTopic:
        copied = _MemoryTopic(0)
        copied.records = {p: list(records) for p, records in self.records.items()}
        copied.committed = dict(self.committed)
        return copied


class _MemoryKafka:
    """The topics connectors read (the source topic, a repartition topic) and the committed state records
    of the changelog topics (the last one per partition: what compaction keeps)."""

    def __init__(self, source_topic: str, partitions: int) -> None:
        self.partitions = partitions
        self.topics: dict[str, _MemoryTopic] = {source_topic: _MemoryTopic(partitions)}
        self.changelogs: dict[str, dict[int, bytes]] = {}
        self.appended = 0
        """Records a commit made readable in ``topics`` (repartitioned rows): more cycles to run."""

    def topic(self, name: str) -> _MemoryTopic:
        return self.topics.setdefault(name, _MemoryTopic(self.partitions))


class _MemorySource:
    """A ``PipelineSource`` over a ``_MemoryTopic``: hands out records in batches and decodes them as a
    ``KafkaSource`` does. Positions are offsets into the partition lists."""

    def __init__(self, settings: SourceSettings, topic: _MemoryTopic) -> None:
        self.settings = settings
        self.name = settings.name
        self.format: Format = make_format(settings.format)
        self.watermarks = WatermarkTracker(settings.allowed_lateness_ms, settings.idle_timeout_ms)
        self._topic = topic
        self._positions: dict[int, int] = {}

    def subscribe(self, listener: PartitionListener) -> None:
        """One instance, so the group gives it every partition at once."""
        partitions = self.partitions()
        self._positions = dict(listener.assigned(self.name, partitions))
        self.watermarks.assign(partitions)

    def partitions(self) -> list[int]:
        return sorted(self._topic.records)

    def end_offsets(self) -> dict[int, int]:
        return {partition: self._topic.end(partition) for partition in self._topic.records}

    def owned(self) -> list[int]:
        return sorted(self._positions)

    def start_offset(self, partition: int) -> int:
        return 0 if self.settings.start_from == "earliest" else self._topic.end(partition)

    def poll_batch(self, timeout: float) -> SourceBatch | None:
        taken: list[tuple[int, int, _Record]] = []
        for partition, records in self._topic.records.items():
            start = self._positions[partition]
            room = self.settings.max_batch_records - len(taken)
            taken += [(partition, start + i, record) for i, record in enumerate(records[start:start + room])]
        if not taken:
            return None
        for partition, offset, _ in taken:
            self._positions[partition] = offset + 1
        columns = RecordColumns.from_lists(values=[r.value for _, _, r in taken], keys=[r.key for _, _, r in taken],
                                           partitions=[p for p, _, _ in taken], offsets=[o for _, o, _ in taken],
                                           timestamps=[r.timestamp_ms for _, _, r in taken])
        return decode_records(self.name, self.settings.topic, self.format, columns,
                              on_error=self.settings.on_error, value_bytes=columns.value_bytes())

    def position(self) -> SourceCheckpoint:
        return SourceCheckpoint(self.name, self.settings.topic, dict(self._positions))

    def inject_barrier(self, checkpoint_id: int) -> SourceCheckpoint:
        return self.position()

    def restore(self, checkpoint: SourceCheckpoint) -> None:
        self._positions.update(checkpoint.offsets)

    def reached(self, ends: Mapping[int, int]) -> bool:
        return all(self._positions.get(partition, 0) >= end for partition, end in ends.items())

    def committed_metadata(self, partitions: list[int] | None = None) -> dict[int, tuple[int, str | None]]:
        return {partition: (offset, text) for partition, (offset, text) in self._topic.committed.items()
                if partitions is None or partition in partitions}

    def observe_event_times(self, batch: pa.RecordBatch) -> None:
        observe_batch(self.watermarks, batch, self.settings.event_time_column)

    def consumer_group_metadata(self) -> object:
        return None

    def commit_offsets(self, offsets: list[TopicPartition]) -> None:
        """The in-memory sink records committed offsets itself, for either delivery guarantee."""
        return None

    def lag(self) -> dict[int, int]:
        return {partition: self._topic.end(partition) - position for partition, position in self._positions.items()}

    def pause(self) -> None:
        return None

    def resume(self) -> None:
        return None

    def close(self) -> None:
        return None


def kafka_sink_format(config: ConnectorConfig) -> Format:
    """The Kafka sink's format: the driver stands in for Kafka only, not for a sink beyond it."""
    value_format = sink_format(config)
    if value_format is None:
        raise ValueError(f"connector {config.name!r}: the test driver runs Kafka sinks only, not sink type "
                         f"{config.sink.type!r}; test it against a real broker (epochline run)")
    return value_format


class _MemorySink:
    """A ``Sink`` whose commit does what the transactional sink's does: the epoch's records become visible
    together with the cut, which records the checkpoint id as the offsets' metadata."""

    def __init__(self, config: ConnectorConfig, kafka: _MemoryKafka) -> None:
        self._settings = sink_settings(config, transactional_id="driver", group_id="driver")
        self._format = kafka_sink_format(config)
        self._kafka = kafka
        self.output: list[DriverRecord] = []
        self.dead_letters: list[DriverRecord] = []
        self._pending_output: list[DriverRecord] = []
        self._pending_dead_letters: list[DriverRecord] = []
        self._pending_records: list[OutgoingRecord] = []

    def start(self) -> None:
        return None

    def begin_epoch(self) -> None:
        return None

    def write(self, table: pa.Table) -> Produced:
        if table.num_rows == 0:
            return Produced(0, 0)
        values, keys, unwritten = encode_rows(table, self._format, self._settings)
        self._pending_output += [DriverRecord(keys[i] if keys else None, value) for i, value in enumerate(values)]
        return produced(values, unwritten)

    def write_dead_letters(self, letters: Iterable[DeadLetter]) -> int:
        letters = list(letters)
        if letters:
            dead_letter_topic(self._settings, letters)
        self._pending_dead_letters += [DriverRecord(letter.key, letter.value or b"", letter.headers())
                                       for letter in letters]
        return len(letters)

    def write_records(self, records: Sequence[OutgoingRecord]) -> Produced:
        self._pending_records += records
        return produced([record.value for record in records])

    def commit_epoch(self, commits: Sequence[OffsetCommit]) -> None:
        self.output += self._pending_output
        self.dead_letters += self._pending_dead_letters
        for record in self._pending_records:
            if record.topic in self._kafka.topics:  # a repartition topic: its rows are read again
                self._kafka.topics[record.topic].records[record.partition].append(
                    _Record(record.key, record.value, NO_TIMESTAMP))
                self._kafka.appended += 1
            else:
                self._kafka.changelogs.setdefault(record.topic, {})[record.partition] = record.value or b""
        self.abort_epoch()
        for commit in commits:
            for tp in commit.offsets:
                self._kafka.topic(tp.topic).committed[tp.partition] = (tp.offset, tp.metadata or "")

    def abort_epoch(self) -> None:
        self._pending_output, self._pending_dead_letters, self._pending_records = [], [], []

    def is_backpressured(self) -> bool:
        return False

    def close(self) -> None:
        return None


class _MemoryChangelog:
    """The internal topics of ``_MemoryKafka``: what the sink committed is what a restore reads."""

    def __init__(self, kafka: _MemoryKafka) -> None:
        self._kafka = kafka

    def ensure(self, topic: str, partitions: int, *, compacted: bool) -> None:
        if compacted:
            self._kafka.changelogs.setdefault(topic, {})
        else:
            self._kafka.topic(topic)

    def latest(self, topic: str, partition: int) -> bytes | None:
        return self._kafka.changelogs.get(topic, {}).get(partition)

    def close(self) -> None:
        return None


class TransformTestDriver:
    """A connector run over an in-memory topic and sink (see the module docstring).

    ``send`` and ``send_raw`` queue records; ``output``, ``dead_letters``, ``advance_event_time`` and
    ``snapshot`` first process everything queued and commit it, as the connector would at its next
    checkpoint. The instance's files (checkpoint id log, lock) go to a temporary directory ``close`` removes.
    """

    def __init__(self, config: ConnectorConfig | Path | str, *, partitions: int = 1,
                 restore: DriverSnapshot | None = None) -> None:
        loaded = config if isinstance(config, ConnectorConfig) else load_config(config)
        self._state_dir = Path(tempfile.mkdtemp(prefix="epochline-driver-"))
        self.config = _with_state_dir(loaded, self._state_dir)
        self._kafka = _MemoryKafka(self.config.source.topic, partitions)
        self._topic = self._kafka.topics[self.config.source.topic]
        if restore is not None:
            self._kafka.topics = {name: topic.copy() for name, topic in restore.topics.items()}
            self._kafka.changelogs = {name: dict(parts) for name, parts in restore.changelogs.items()}
            self._topic = self._kafka.topics[self.config.source.topic]
        self._source_format = source_format(self.config)
        self._sink = _MemorySink(self.config, self._kafka)
        self.metrics = Metrics()
        pipeline = KafkaPipeline(self.config, "in-memory", self.metrics,
                                 instance=Instance(self.config.name, "driver", self._state_dir),
                                 open_source=lambda source: _MemorySource(source, self._kafka.topic(source.topic)),
                                 sink=self._sink, changelog=_MemoryChangelog(self._kafka))
        self._loop = EpochLoop(pipeline, EpochLoopSettings(checkpoint_interval_s=0, poll_timeout_s=0))
        self._loop.start()

    # -- input -----------------------------------------------------------------------------------------

    def send(self, rows: Sequence[Mapping[str, Any]] | pa.Table, *, partition: int = 0, key: bytes | None = None,
             timestamp_ms: int | None = None) -> None:
        """Rows encoded in the source's format, as a producer upstream would have written them."""
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows))
        values = [value for batch in table.to_batches() for value in self._source_format.encode(batch)]
        self.send_raw(values, partition=partition, key=key, timestamp_ms=timestamp_ms)

    def send_raw(self, values: Sequence[bytes | None], *, partition: int = 0, key: bytes | None = None,
                 timestamp_ms: int | None = None) -> None:
        """Records exactly as they would sit in the topic (malformed ones included)."""
        if partition not in self._topic.records:
            raise ValueError(f"partition {partition} is not one of the driver's {len(self._topic.records)}")
        stamp = NO_TIMESTAMP if timestamp_ms is None else timestamp_ms
        self._topic.records[partition] += [_Record(key, value, stamp) for value in values]

    def advance_event_time(self, to_ms: int) -> None:
        """Process what is queued, then move event time on every partition to ``to_ms`` (as if each had
        delivered a record that late), so windows the watermark now passes are emitted and committed."""
        self._process()
        for source in self._pipeline_sources():
            for partition in source.partitions():
                source.watermarks.observe(partition, to_ms)
        self._loop.run_cycle()
        self._commit()
        self._process()

    # -- output ----------------------------------------------------------------------------------------

    def output(self) -> list[DriverRecord]:
        """Every record the sink topic holds for a ``read_committed`` reader, in order."""
        self._process()
        return list(self._sink.output)

    def output_rows(self) -> list[dict[str, Any]]:
        """``output`` decoded with the sink's format."""
        records = self.output()
        decoded = kafka_sink_format(self.config).decode([record.value for record in records])
        if decoded.failures:
            raise ValueError(f"the sink's own output did not decode: {decoded.failures[:3]}")
        return decoded.batch.to_pylist()

    def dead_letters(self) -> list[DriverRecord]:
        """Every record the dead-letter topic holds, with its ``epochline.*`` headers (reason, stage, ...)."""
        self._process()
        return list(self._sink.dead_letters)

    # -- checkpoints -----------------------------------------------------------------------------------

    def snapshot(self) -> DriverSnapshot:
        """Commit what is queued, and hand back what a restarted instance would find in Kafka."""
        self._process()
        return DriverSnapshot({name: topic.copy() for name, topic in self._kafka.topics.items()},
                              {name: dict(parts) for name, parts in self._kafka.changelogs.items()})

    def close(self) -> None:
        self._loop.close()
        shutil.rmtree(self._state_dir, ignore_errors=True)

    def __enter__(self) -> TransformTestDriver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the loop ----------------------------------------------------------------------------------------

    def _process(self) -> None:
        """Cycles until nothing is left, and the commit; again while a commit made repartitioned rows
        readable (they go through the repartition topic, as on a broker)."""
        while True:
            appended = self._kafka.appended
            while self._loop.run_cycle():
                pass
            self._commit()
            if self._kafka.appended == appended:
                return

    def _commit(self) -> None:
        self._loop.checkpoint()

    def _pipeline_sources(self) -> list[_MemorySource]:
        return [source for source in self._loop.sources.values() if isinstance(source, _MemorySource)]


def _with_state_dir(config: ConnectorConfig, directory: Path) -> ConnectorConfig:
    checkpoint = config.checkpoint.model_copy(update={"dir": directory})
    copied = config.model_copy(update={"checkpoint": checkpoint})
    copied._base_dir = config.base_dir
    return copied
