"""One item of a batch: read its range with ``read_committed``, transform it, commit it in one transaction.

The item's output, dead letters and the partition's offset at the range end commit together; the offset's
metadata names the item and its run id (``connectors.offset_metadata``), which is what a resume reads to
learn that an item committed before the store heard of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import TopicPartition

from connectors import offset_metadata
from connectors.batch import SourceBatch
from connectors.checkpoint import SourceCheckpoint
from connectors.dead_letter import DeadLetter, unwritten_dead_letters
from connectors.metadata import OFFSET
from connectors.source import KafkaSource, SourceSettings
from engine.batch.errors import BatchHalted, BatchJobError
from engine.batch.options import BatchOptions, kafka_id
from engine.batch.plan import BatchItem
from engine.batch.store import Outcome, Spend
from engine.config import ConfigError, ConnectorConfig, SinkConfig
from engine.transforms import OperatorRuntimeError
from engine.wiring import (
    SOURCE_NAME,
    build_chain,
    build_sink,
    check_sink_types,
    input_schema,
    sink_format,
    source_format,
    source_settings,
)
from sinks import EpochAborted, OffsetCommit

log = logging.getLogger(__name__)

MAX_ITEM_ATTEMPTS = 3
"""Attempts per item when Kafka demands an abort (``txn_requires_abort``): the item is simply run again."""


ITEM_FIELDS = ("batch", "item", "run", "records", "bytes", "seconds")


def item_metadata(batch_id: str, item: BatchItem, run_id: str, spend: Spend) -> str:
    """The committed offset's metadata: names the item and run, and carries the spend for reconciliation."""
    return offset_metadata.encode(dict(zip(ITEM_FIELDS, (batch_id, item.key, run_id, spend.records, spend.bytes,
                                                         f"{spend.seconds:.3f}"), strict=True)))


@dataclass(frozen=True)
class CommittedItem:
    """What a committed offset's metadata says about the item whose transaction committed it."""

    batch_id: str
    key: str
    run_id: str
    spend: Spend


def parse_item_metadata(metadata: str | None) -> CommittedItem | None:
    """The inverse of ``item_metadata``; None for anything else (e.g. a streaming checkpoint id). Only the
    spend is read from it: whether the item committed is decided by the committed offset itself."""
    try:
        fields = offset_metadata.decode(metadata)
        if fields is None or not set(ITEM_FIELDS) <= set(fields):
            return None
        return CommittedItem(fields["batch"], fields["item"], fields["run"],
                             Spend(int(fields["records"]), int(fields["bytes"]), float(fields["seconds"])))
    except (offset_metadata.MalformedOffsetMetadata, ValueError):
        return None


_ITEM_CONSUMER_DEFAULTS = {"fetch.wait.max.ms": "10"}
"""Every item starts with a re-assign, which waits for the fetch in flight; at a partition's end that fetch
is a long poll of ``fetch.wait.max.ms`` (default 500 ms), which would otherwise be paid once per item.
``auto.offset.reset`` is set to ``error`` on top of the user's settings: an item whose records retention
deleted must fail loudly, not silently restart at the log start."""


class _PartitionSource(KafkaSource):
    """A ``KafkaSource`` over one partition: a partition's items are read in order by one consumer."""

    def __init__(self, settings: SourceSettings, bootstrap: str, group: str, partition: int) -> None:
        super().__init__(settings, bootstrap, group)
        self.partition = partition

    def partitions(self) -> list[int]:
        return [self.partition]


@dataclass(frozen=True)
class ItemResult:
    outcome: Outcome
    spend: Spend
    reason: str | None = None


def _within(batch: SourceBatch, end: int) -> SourceBatch:
    """The part of a poll below ``end``: the consumer may have fetched records of the next item."""
    offsets = batch.batch.column(OFFSET)
    letters = [letter for letter in batch.dead_letters if letter.offset < end]
    if len(offsets) and pc.max(offsets).as_py() >= end:
        return SourceBatch(batch.source, batch.batch.filter(pc.less(offsets, pa.scalar(end, pa.int64()))), letters)
    return SourceBatch(batch.source, batch.batch, letters)


class ItemProcessor:
    """One transactional producer, one consumer per partition and the transform chain of a batch job.

    ``start`` must run before anything else: ``init_transactions`` fences an earlier instance of the job
    and settles its open transaction, so the committed offsets read afterwards are final.
    """

    def __init__(self, config: ConnectorConfig, options: BatchOptions, topic: str) -> None:
        self.config = config
        self.options = options
        self.topic = topic
        self.on_error = config.source.on_error
        # Poison records are always handed over as dead letters; this class applies on_error per item.
        source = config.source.model_copy(update={
            "on_error": "dead-letter",
            "max_batch_records": min(config.source.max_batch_records, config.batch.item_records),
            "consumer": {**_ITEM_CONSUMER_DEFAULTS, **config.source.consumer, "auto.offset.reset": "error"},
        })
        self.settings = source_settings(config, source, SOURCE_NAME)
        self.group = kafka_id(config, options.tenant, options.batch_id)
        self.chain = build_chain(config)
        self._source_format = source_format(config)
        schema = input_schema(self._source_format)
        kafka_sink, value_format = config.kafka_sink, sink_format(config)
        if kafka_sink is None or value_format is None:  # the config's batch rules refuse it first
            raise ConfigError(f"{config.name}: a batch job writes to a Kafka topic, not to sink type "
                              f"{config.sink.type}")
        self._sink_config: SinkConfig = kafka_sink
        if schema is not None:
            check_sink_types(kafka_sink, self.chain.validate(schema), value_format)
        else:
            self.chain.check_without_schema()
        crash_point = options.crash_point
        before_commit = (lambda: crash_point("between-flush-and-commit")) if crash_point is not None else None
        self.sink = build_sink(config, options.bootstrap, transactional_id=self.group, group_id=self.group,
                               before_commit=before_commit, value_format=value_format)
        self._sources: dict[int, _PartitionSource] = {}

    def start(self) -> None:
        self.sink.start()

    def close(self) -> None:
        try:
            self.sink.close()
        finally:
            for source in self._sources.values():
                source.close()

    def _source(self, partition: int) -> _PartitionSource:
        if partition not in self._sources:
            self._sources[partition] = _PartitionSource(self.settings, self.options.bootstrap, self.group, partition)
        return self._sources[partition]

    def committed(self, partition: int) -> tuple[int | None, CommittedItem | None]:
        """The group's committed offset for ``partition`` and the item its metadata names."""
        cut, metadata = self._source(partition).committed()
        if cut is None:
            return None, None
        return cut.offsets[partition], parse_item_metadata(metadata)

    def run(self, item: BatchItem, run_id: str) -> ItemResult:
        """Process the item in its own transaction; retried when Kafka demands an abort."""
        attempt = 1
        while True:
            try:
                return self._attempt(item, run_id)
            except EpochAborted as error:
                self.sink.abort_epoch()
                log.warning("item transaction aborted", extra={"item": item.key, "attempt": attempt,
                                                               "error": str(error)})
                if attempt == MAX_ITEM_ATTEMPTS:
                    raise BatchJobError(f"{item.describe(self.topic)}: its transaction was aborted "
                                        f"{MAX_ITEM_ATTEMPTS} times, last: {error}") from error
                attempt += 1

    def _attempt(self, item: BatchItem, run_id: str) -> ItemResult:
        started = time.monotonic()
        records = bytes_ = 0
        self.sink.begin_epoch()
        try:
            for batch in self._read(item):
                records += batch.batch.num_rows + len(batch.dead_letters)
                bytes_ += batch.batch.nbytes + sum(len(letter.value or b"") for letter in batch.dead_letters)
                if batch.dead_letters and self.on_error != "dead-letter":
                    return self._stop_item(item, batch.dead_letters[0].describe(), "poison record",
                                           Spend(records, bytes_, time.monotonic() - started))
                letters = batch.dead_letters
                if batch.batch.num_rows:
                    letters = letters + self._write(self.chain.process(pa.Table.from_batches([batch.batch]), None))
                if letters and self.on_error != "dead-letter":
                    return self._stop_item(item, letters[0].describe(), "record the sink format cannot write",
                                           Spend(records, bytes_, time.monotonic() - started))
                self.sink.write_dead_letters(letters)
        except OperatorRuntimeError as error:
            return self._stop_item(item, str(error), "transform failed",
                                   Spend(records, bytes_, time.monotonic() - started))
        spend = Spend(records, bytes_, time.monotonic() - started)
        self._commit(item, run_id, spend)
        return ItemResult(Outcome.SUCCEEDED, spend)

    def _write(self, output: pa.Table) -> list[DeadLetter]:
        """Write the item's output rows; the ones the sink's format refused come back as dead letters."""
        written = self.sink.write(output)
        if not written.unwritten:
            return []
        return unwritten_dead_letters(output, written.unwritten, source_topic=self.topic,
                                      source_format=self._source_format, sink_topic=self._sink_config.topic)

    def _stop_item(self, item: BatchItem, problem: str, what: str, spend: Spend) -> ItemResult:
        """Abort the item's transaction; fail the item (``fail-item``) or halt the job (``halt``)."""
        self.sink.abort_epoch()
        reason = f"{what} in {item.describe(self.topic)}: {problem}"
        if self.on_error == "fail-item":
            return ItemResult(Outcome.FAILED, spend, reason)
        raise BatchHalted(f"{reason}; halting without committing the item (source.on_error: {self.on_error})")

    def _read(self, item: BatchItem) -> Iterator[SourceBatch]:
        """The item's records, until the consumer's position reaches the range end. Positions move past
        transaction markers and aborted records through later records or the partition EOF event, so a
        range ending on a marker finishes too."""
        source = self._source(item.partition)
        source.restore(SourceCheckpoint(SOURCE_NAME, self.topic, {item.partition: item.start}))
        last_progress = time.monotonic()
        position = item.start
        while position < item.end:
            batch = source.poll_batch(0.5)
            moved = source.position().offsets[item.partition]
            if moved > position:
                position, last_progress = moved, time.monotonic()
            elif time.monotonic() - last_progress > self.options.read_timeout_s:
                raise BatchJobError(
                    f"{item.describe(self.topic)}: no progress at offset {position} for "
                    f"{self.options.read_timeout_s:.0f}s (broker unreachable, or records deleted by retention?)")
            if batch is not None:
                yield _within(batch, item.end)

    def _commit(self, item: BatchItem, run_id: str, spend: Spend) -> None:
        """The commit point: the item's offset (metadata naming item and run) and output, in one transaction."""
        source = self._source(item.partition)
        metadata = item_metadata(self.options.batch_id, item, run_id, spend)
        offsets = [TopicPartition(self.topic, item.partition, item.end, metadata=metadata)]
        self.sink.commit_epoch([OffsetCommit(offsets, source.consumer_group_metadata())])
