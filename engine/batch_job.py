"""Bounded exactly-once batch jobs: "copy and transform this topic up to now, exactly once" (issue 6).

``epochline batch run CONFIG --batch-id ID`` takes the same connector config as ``epochline run`` and:

1. **Freezes a plan at open.** Per partition, the log start and the ``read_committed`` end (the last stable
   offset) are read once and split into items of about ``batch.item_records`` offsets. Item keys are
   zero-padded (``p0003:00000000000000001000``) so byte order is processing order. The plan is written
   atomically to ``<checkpoint dir>/batches/<tenant>/<batch id>.plan.json``; a resume reads it back, so it
   processes the *same* ranges however much the topic grew since. The plan digest (sha256 over the
   canonical config and the ranges) is given to ``BatchStore.open``, which refuses a resume whose config
   was edited (``BatchPlanChanged``).
2. **Runs every item in its own Kafka transaction.** The item's range is read with ``read_committed``
   (records of aborted transactions never appear; the range is finished when the consumer's position
   reaches its end, judged by the records handed out and partition EOF, never by "last offset + 1",
   because transaction markers occupy offsets), transformed by the SQL/Python steps, and its output and
   dead letters are written in the transaction together with the partition's offset at the range end,
   whose metadata names the item and its run id (``epochline:batch=…;item=…;run=…``). **The commit of
   that transaction is the item's commit point**; the store's ``record(SUCCEEDED)`` only reports it.
3. **Reconciles on resume.** ``init_transactions`` on the job's stable transactional id fences any earlier
   instance and settles its open transaction first. Then an item the store shows reserved but unfinished
   is recorded SUCCEEDED without running again when the job's consumer group has committed an offset at or
   past its end (the commit happened, the crash came before the store heard of it), and is re-run under its
   first run id otherwise. This witness is sound because the items of a partition run in key order, one at
   a time, each recorded before the next is reserved: a partition has at most one unfinished item, and
   only that item's transaction can have moved the partition's committed offset past its start.

Poison records follow ``source.on_error``: ``dead-letter`` writes them to the dead-letter topic in the
item's transaction; ``fail-item`` aborts the item's transaction and records it FAILED with a reason naming
partition, offset and problem (the job goes on with the other items); ``halt`` stops the job non-zero
without committing the item. A transform error fails the item under ``fail-item`` and halts otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from connectors.admin import TopicAdminError, end_offsets
from connectors.checkpoint import SourceCheckpoint
from connectors.source import KafkaSource, SourceBatch, SourceError, SourceSettings
from engine import faults
from engine.batch_store import (
    POSTGRES_PREFIXES,
    SQLITE_PREFIX,
    BatchStore,
    ItemRecord,
    Outcome,
    Spend,
    open_batch_store,
)
from engine.checkpoints import write_atomically
from engine.config import ConnectorConfig, load_config
from engine.operators import OperatorRuntimeError
from engine.pipeline import SOURCE_NAME, build_chain_for, input_schema, sink_settings, source_settings
from engine.runner import bootstrap_from
from schemas import make_format
from sinks.kafka import EpochAborted, SinkError, TransactionalKafkaSink

log = logging.getLogger(__name__)

PLAN_FORMAT = 1
ITEM_METADATA_PREFIX = "epochline:batch="
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
MAX_ITEM_ATTEMPTS = 3
"""Attempts per item when Kafka demands an abort (``txn_requires_abort``): the item is simply run again."""


class BatchJobError(RuntimeError):
    """A batch job cannot go on; the message names the batch, item, topic or file involved."""


class PlanFileMissing(BatchJobError):
    """The store knows the batch but its frozen plan file is gone: re-planning would change the ranges."""


class BatchHalted(BatchJobError):
    """A poison record or transform error with ``on_error: halt``: the job stopped without committing the item."""


class BatchNotFound(BatchJobError):
    """A census or attention list was asked for a batch id the store never opened (mistyped id?)."""


# -- the plan ----------------------------------------------------------------------------------------------


def item_key(partition: int, start: int) -> str:
    """``p0003:00000000000000001000``: zero-padded, so byte order (the store's order) is processing order."""
    if not 0 <= partition <= 9999 or start < 0:
        raise ValueError(f"cannot key partition {partition} offset {start}: outside p0000..p9999 / offset >= 0")
    return f"p{partition:04d}:{start:020d}"


@dataclass(frozen=True)
class BatchItem:
    """Offsets ``[start, end)`` of one partition, processed in one Kafka transaction."""

    partition: int
    start: int
    end: int

    @property
    def key(self) -> str:
        return item_key(self.partition, self.start)

    def describe(self, topic: str) -> str:
        return f"item {self.key} (topic {topic!r} partition {self.partition} offsets [{self.start}, {self.end}))"


@dataclass(frozen=True)
class BatchPlan:
    """The frozen ranges of one batch, in key order."""

    batch_id: str
    topic: str
    items: tuple[BatchItem, ...]

    def to_json(self) -> bytes:
        return orjson.dumps({"format": PLAN_FORMAT, "batch_id": self.batch_id, "topic": self.topic,
                             "items": [[i.partition, i.start, i.end] for i in self.items]})

    @classmethod
    def from_json(cls, data: bytes, where: Path) -> BatchPlan:
        try:
            raw = orjson.loads(data)
            if raw["format"] != PLAN_FORMAT:
                raise ValueError(f"format {raw['format']!r}, expected {PLAN_FORMAT}")
            return cls(raw["batch_id"], raw["topic"], tuple(BatchItem(*map(int, i)) for i in raw["items"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise BatchJobError(f"batch plan file {where} is unreadable: {error}") from error


def split_into_items(starts: dict[int, int], ends: dict[int, int], item_records: int) -> tuple[BatchItem, ...]:
    """Per partition, ``[start, end)`` cut into consecutive ranges of ``item_records`` offsets, in key order."""
    items = [BatchItem(partition, offset, min(offset + item_records, ends[partition]))
             for partition in sorted(ends)
             for offset in range(min(starts.get(partition, 0), ends[partition]), ends[partition], item_records)]
    return tuple(sorted(items, key=lambda item: item.key))


def plan_digest(config: ConnectorConfig, plan: BatchPlan) -> str:
    """sha256 over the canonical config and the ranges: any edit to either changes it."""
    digest = hashlib.sha256(config.model_dump_json().encode())
    digest.update(orjson.dumps([plan.topic, [[i.partition, i.start, i.end] for i in plan.items]]))
    return f"sha256:{digest.hexdigest()}"


def log_start_offsets(bootstrap: str, topic: str, partitions: list[int], timeout: float = 30.0) -> dict[int, int]:
    """Per partition, the first offset still in the log (retention may have deleted older ones)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    asked = {TopicPartition(topic, partition): OffsetSpec.earliest() for partition in partitions}
    futures = admin.list_offsets(asked, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=timeout)
    try:
        return {tp.partition: future.result(timeout).offset for tp, future in futures.items()}
    except KafkaException as error:
        raise TopicAdminError(f"log start offsets of topic {topic!r} unavailable on {bootstrap}: {error}") from error


def freeze_plan(config: ConnectorConfig, bootstrap: str, batch_id: str) -> BatchPlan:
    """The ranges from the log start to the current ``read_committed`` end of every partition."""
    topic = config.source.topic
    ends = end_offsets(bootstrap, topic)
    starts = log_start_offsets(bootstrap, topic, sorted(ends))
    return BatchPlan(batch_id, topic, split_into_items(starts, ends, config.batch.item_records))


class PlanFile:
    """The frozen plan on disk, written atomically (temp file, fsync, rename, fsync dir)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> BatchPlan | None:
        try:
            return BatchPlan.from_json(self.path.read_bytes(), self.path)
        except FileNotFoundError:
            return None

    def write(self, plan: BatchPlan) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(self.path, [plan.to_json()])


# -- names, store, offset metadata -------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchOptions:
    batch_id: str
    bootstrap: str
    store_url: str | None = None  # overrides batch.store of the config
    tenant: str = "default"
    read_timeout_s: float = 60.0  # no record and no partition end within this while reading an item: error


def _checked_name(value: str, what: str) -> str:
    """Batch ids and tenants name files and Kafka ids, so they are restricted to a safe alphabet."""
    if not _NAME.match(value):
        raise BatchJobError(f"{what} {value!r} may contain only letters, digits, '.', '_' and '-'")
    return value


def kafka_id(config: ConnectorConfig, tenant: str, batch_id: str) -> str:
    """The job's transactional id and consumer group, stable per (tenant, connector, batch): a resumed job
    fences the one it replaces at ``init_transactions``, and the group's committed offsets witness which
    items committed. ``:`` cannot occur in the parts, so distinct triples never share an id."""
    return f"epochline-batch:{tenant}:{config.name}:{batch_id}"


def store_url_for(config: ConnectorConfig, override: str | None = None) -> str:
    """``--store``, else ``batch.store`` (a relative SQLite path is relative to the config file), else the
    SQLite file ``<checkpoint dir>/batches.db``."""
    url = override or config.batch.store
    if url is None:
        return str(config.state_dir / "batches.db")
    if url.startswith(POSTGRES_PREFIXES) or override is not None:
        return url
    path = Path(url.removeprefix(SQLITE_PREFIX))
    return str(path if path.is_absolute() else config.base_dir / path)


def item_metadata(batch_id: str, item: BatchItem, run_id: str, spend: Spend) -> str:
    """The committed offset's metadata: names the item and run, and carries the spend for reconciliation."""
    return (f"{ITEM_METADATA_PREFIX}{batch_id};item={item.key};run={run_id};records={spend.records};"
            f"bytes={spend.bytes};seconds={spend.seconds:.3f}")


@dataclass(frozen=True)
class CommittedItem:
    """What a committed offset's metadata says about the item whose transaction committed it."""

    batch_id: str
    key: str
    run_id: str
    spend: Spend


def parse_item_metadata(metadata: str | None) -> CommittedItem | None:
    """The inverse of ``item_metadata``; None for anything else (e.g. a streaming checkpoint id)."""
    if not metadata or not metadata.startswith(ITEM_METADATA_PREFIX):
        return None
    fields = dict(part.partition("=")[::2] for part in metadata[len("epochline:"):].split(";"))
    try:
        return CommittedItem(fields["batch"], fields["item"], fields["run"],
                             Spend(int(fields["records"]), int(fields["bytes"]), float(fields["seconds"])))
    except (KeyError, ValueError):
        return None


# -- the Kafka side: reading, transforming and committing one item ------------------------------------------


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
    offsets = batch.batch.column("__kafka_offset")
    letters = [letter for letter in batch.dead_letters if letter.offset < end]
    if len(offsets) and pc.max(offsets).as_py() >= end:
        return SourceBatch(batch.source, batch.batch.filter(pc.less(offsets, end)), letters)
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
        self.chain = build_chain_for(config)
        schema = input_schema(make_format(self.settings.format))
        if schema is not None:
            self.chain.validate(schema)
        self.sink = TransactionalKafkaSink(sink_settings(config, self.group, self.group), options.bootstrap,
                                           make_format(config.sink.format_spec(config.base_dir)))
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
                if batch.batch.num_rows:
                    self.sink.write(self.chain.process(pa.Table.from_batches([batch.batch]), None))
                self.sink.write_dead_letters(batch.dead_letters)
        except OperatorRuntimeError as error:
            return self._stop_item(item, str(error), "transform failed",
                                   Spend(records, bytes_, time.monotonic() - started))
        spend = Spend(records, bytes_, time.monotonic() - started)
        self._commit(item, run_id, spend)
        return ItemResult(Outcome.SUCCEEDED, spend)

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
        offsets = [TopicPartition(self.topic, item.partition, item.end)]
        self.sink.commit_epoch(offsets, item_metadata(self.options.batch_id, item, run_id, spend),
                               source.consumer_group_metadata())


# -- the job -----------------------------------------------------------------------------------------------


class BatchProgress(Protocol):
    """Told how far the job is: the total at start, then each item as it settles."""

    def begin(self, total_items: int, settled_items: int) -> None: ...
    def settled(self, records: int) -> None: ...


class _NoProgress:
    def begin(self, total_items: int, settled_items: int) -> None:
        return None

    def settled(self, records: int) -> None:
        return None


@dataclass(frozen=True)
class BatchSummary:
    """How the batch stands after a run, and what this run did."""

    batch_id: str
    items: int
    succeeded: int
    failed: int
    records: int  # input records of all recorded items
    ran: int  # items processed by this run
    reconciled: int  # items this run found committed and recorded without running them
    records_this_run: int
    seconds: float

    @property
    def exit_code(self) -> int:
        return 0 if self.failed == 0 else 1

    def line(self) -> str:
        rate = (f"{self.ran / self.seconds:.1f} items/s, {self.records_this_run / self.seconds:,.0f} records/s"
                if self.seconds > 0 and self.ran else "nothing left to run")
        status = "done" if self.failed == 0 else (
            f"FAILED items: {self.failed} (see: epochline batch attention {self.batch_id})")
        return (f"batch {self.batch_id}: {status}; {self.succeeded}/{self.items} items succeeded, "
                f"{self.failed} failed, {self.records:,} records; this run: {self.ran} items run, "
                f"{self.reconciled} reconciled in {self.seconds:.1f}s ({rate})")


def _is_terminal(record: ItemRecord) -> bool:
    return record.outcome is not None and record.outcome.is_terminal


class BatchJob:
    """One batch of one connector: plan, store and Kafka, from open (or resume) to the last item."""

    def __init__(self, config: ConnectorConfig, options: BatchOptions, store: BatchStore) -> None:
        self.config = config
        self.options = options
        self.store = store
        self.batch_id = _checked_name(options.batch_id, "batch id")
        tenant = _checked_name(options.tenant, "tenant")
        self.plan_file = PlanFile(config.state_dir / "batches" / tenant / f"{self.batch_id}.plan.json")

    def open(self) -> BatchPlan:
        """Freeze the plan (or read the frozen one back) and open the batch in the store with its digest."""
        known = self.store.plan_digest(self.batch_id)
        plan = self.plan_file.load()
        if plan is None:
            if known is not None:
                raise PlanFileMissing(
                    f"batch {self.batch_id!r} was opened, but its plan file {self.plan_file.path} is missing: "
                    "planning again would cover different offsets, so the batch cannot be resumed")
            plan = freeze_plan(self.config, self.options.bootstrap, self.batch_id)
            self.plan_file.write(plan)
            log.info("batch plan frozen", extra={"batch_id": self.batch_id, "items": len(plan.items),
                                                 "plan_file": str(self.plan_file.path)})
        if plan.batch_id != self.batch_id or plan.topic != self.config.source.topic:
            raise BatchJobError(f"plan file {self.plan_file.path} is for batch {plan.batch_id!r} of topic "
                                f"{plan.topic!r}, not batch {self.batch_id!r} of topic {self.config.source.topic!r}")
        if known is None:
            self._require_unused_group(plan)
        self.store.open(self.batch_id, plan_digest(self.config, plan))
        return plan

    def _require_unused_group(self, plan: BatchPlan) -> None:
        """A batch new to the store must be new to Kafka too: offsets committed under its group mean the id
        was run before against another store (or a deleted one), and running its items again would
        duplicate their output."""
        group = kafka_id(self.config, self.options.tenant, self.batch_id)
        settings = source_settings(self.config, self.config.source, SOURCE_NAME)
        with KafkaSource(settings, self.options.bootstrap, group) as source:
            committed, _ = source.committed()
        if committed is not None:
            raise BatchJobError(
                f"batch {self.batch_id!r} is not in the store, but consumer group {group!r} already committed "
                f"offsets {dict(committed.offsets)} on topic {plan.topic!r}: it ran before against another (or a "
                "deleted) store; use that store, or a new batch id")

    def run(self, progress: BatchProgress | None = None) -> BatchSummary:
        progress = progress or _NoProgress()
        started = time.monotonic()
        plan = self.open()
        tally = {"ran": 0, "reconciled": 0, "records": 0}
        if not self.store.is_exhausted(self.batch_id):
            processor = ItemProcessor(self.config, self.options, plan.topic)
            try:
                processor.start()
                self._settle_all(plan, processor, progress, tally)
            except (SinkError, SourceError) as error:
                raise BatchJobError(f"batch {self.batch_id!r} stopped: {error} (run the same command again to "
                                    "resume; committed items are kept)") from error
            finally:
                processor.close()
            self.store.mark_exhausted(self.batch_id)
            log.info("batch exhausted", extra={"batch_id": self.batch_id})
        return self._summary(plan, tally, time.monotonic() - started)

    def _settle_all(self, plan: BatchPlan, processor: ItemProcessor, progress: BatchProgress,
                    tally: dict[str, int]) -> None:
        """Every item not yet terminal, in key order. The ledger is read through ``reserve`` item by item,
        after ``init_transactions``: a fenced predecessor may still have recorded an item a moment ago."""
        recorded = self.store.items(self.batch_id, limit=max(1, len(plan.items)))
        settled = {record.key for record in recorded if _is_terminal(record)}
        progress.begin(len(plan.items), len(settled))
        for item in plan.items:
            if item.key in settled:
                continue
            proposed = uuid.uuid4().hex
            record = self.store.reserve(self.batch_id, item.key, proposed)
            if _is_terminal(record):
                progress.settled(record.spend.records)
                continue
            reconciled = self._reconcile(processor, item, record) if record.run_id != proposed else None
            if reconciled is not None:
                tally["reconciled"] += 1
                progress.settled(reconciled.records)
                continue
            result = processor.run(item, record.run_id)
            faults.maybe_crash("batch-between-commit-and-record")
            self.store.record(self.batch_id, item.key, result.outcome, result.spend, result.reason)
            log.info("item settled", extra={"batch_id": self.batch_id, "item": item.key, "run_id": record.run_id,
                                            "outcome": result.outcome.value, "records": result.spend.records,
                                            "reason": result.reason})
            tally["ran"] += 1
            tally["records"] += result.spend.records
            progress.settled(result.spend.records)

    def _reconcile(self, processor: ItemProcessor, item: BatchItem, record: ItemRecord) -> Spend | None:
        """An unfinished item whose transaction committed is recorded SUCCEEDED instead of running again
        (returns its spend, from the committed metadata); None when it did not commit."""
        offset, committed = processor.committed(item.partition)
        if offset is None or offset < item.end:
            log.info("item did not commit: running it again", extra={
                "batch_id": self.batch_id, "item": item.key, "run_id": record.run_id, "committed_offset": offset})
            return None
        named = committed is not None and committed.key == item.key and committed.run_id == record.run_id
        spend = committed.spend if named and committed is not None else Spend()
        self.store.record(self.batch_id, item.key, Outcome.SUCCEEDED, spend)
        log.info("item reconciled: its transaction committed", extra={
            "batch_id": self.batch_id, "item": item.key, "run_id": record.run_id, "committed_offset": offset,
            "metadata_names_item": named})
        return spend

    def _summary(self, plan: BatchPlan, tally: dict[str, int], seconds: float) -> BatchSummary:
        census = self.store.census(self.batch_id)
        return BatchSummary(self.batch_id, len(plan.items), census.counts[Outcome.SUCCEEDED.value],
                            census.counts[Outcome.FAILED.value], census.spend.records, tally["ran"],
                            tally["reconciled"], tally["records"], seconds)


def run_batch(config: ConnectorConfig, options: BatchOptions, progress: BatchProgress | None = None) -> BatchSummary:
    """Open or resume the batch and run it until every item is settled."""
    store = open_batch_store(store_url_for(config, options.store_url), options.tenant)
    try:
        return BatchJob(config, options, store).run(progress)
    finally:
        store.close()


class _RichProgress:
    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task = progress.add_task("items", total=None, records=0)

    def begin(self, total_items: int, settled_items: int) -> None:
        self._progress.update(self._task, total=total_items, completed=settled_items)

    def settled(self, records: int) -> None:
        fields = self._progress.tasks[self._task].fields
        self._progress.update(self._task, advance=1, records=fields["records"] + records)


@contextmanager
def rich_progress() -> Iterator[BatchProgress]:
    """A progress bar of items and records on stderr; silent when stderr is not a terminal."""
    console = Console(stderr=True)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[records]:,} records"), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        yield _RichProgress(progress)


# -- reports: census, attention, list (human tables or JSON) -----------------------------------------------


def census_report(store: BatchStore, batch_id: str) -> dict[str, Any]:
    digest = store.plan_digest(batch_id)
    if digest is None:
        raise BatchNotFound(f"batch {batch_id!r} does not exist in this store and tenant (never opened; "
                            "mistyped id, or another --store/--tenant?)")
    census = store.census(batch_id)
    return {"batch_id": batch_id, "plan_digest": digest, "exhausted": store.is_exhausted(batch_id),
            "cursor": store.cursor(batch_id), "total": census.total, "counts": census.counts,
            "spend": {"records": census.spend.records, "bytes": census.spend.bytes,
                      "seconds": round(census.spend.seconds, 3)}}


def _item_report(record: ItemRecord) -> dict[str, Any]:
    return {"key": record.key, "run_id": record.run_id, "outcome": record.outcome and record.outcome.value,
            "reason": record.reason, "records": record.spend.records, "bytes": record.spend.bytes,
            "seconds": round(record.spend.seconds, 3)}


def attention_report(store: BatchStore, batch_id: str, limit: int) -> list[dict[str, Any]]:
    if store.plan_digest(batch_id) is None:
        raise BatchNotFound(f"batch {batch_id!r} does not exist in this store and tenant")
    return [_item_report(record) for record in store.items_needing_attention(batch_id, limit)]


def list_report(store: BatchStore) -> list[dict[str, Any]]:
    return [{"batch_id": info.batch_id, "plan_digest": info.plan_digest, "exhausted": info.exhausted,
             "opened_at": info.opened_at} for info in store.batches()]


def _print_census(report: dict[str, Any], console: Console) -> None:
    table = Table(title=f"batch {report['batch_id']}")
    table.add_column("outcome")
    table.add_column("items", justify="right")
    for outcome, count in report["counts"].items():
        table.add_row(outcome, str(count))
    table.add_row("total", str(report["total"]), style="bold")
    console.print(table)
    spend = report["spend"]
    console.print(f"exhausted: {report['exhausted']}  cursor: {report['cursor']}  records: {spend['records']:,}  "
                  f"bytes: {spend['bytes']:,}  seconds: {spend['seconds']:.1f}")


def _print_attention(batch_id: str, items: list[dict[str, Any]], console: Console) -> None:
    table = Table(title=f"batch {batch_id}: items needing attention ({len(items)} shown)")
    for column in ("key", "outcome", "reason", "run_id"):
        table.add_column(column, overflow="fold")
    for item in items:
        table.add_row(item["key"], item["outcome"], item["reason"] or "", item["run_id"])
    console.print(table)


def _print_list(batches: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="batches")
    for column in ("batch_id", "exhausted", "opened_at", "plan_digest"):
        table.add_column(column, overflow="fold")
    for batch in batches:
        opened = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(batch["opened_at"]))
        table.add_row(batch["batch_id"], str(batch["exhausted"]), opened, batch["plan_digest"][:19])
    console.print(table)


# -- command handlers (wired by engine.cli) ------------------------------------------------------------------


def run_command(args: argparse.Namespace) -> int:
    """``epochline batch run``: exit 0 when every item succeeded, 1 when some failed."""
    config = load_config(args.config, batch=True)
    options = BatchOptions(batch_id=args.batch_id, bootstrap=bootstrap_from(args.bootstrap_servers),
                           store_url=args.store, tenant=args.tenant)
    with rich_progress() as progress:
        summary = run_batch(config, options, progress)
    print(summary.line())
    return summary.exit_code


@contextmanager
def _store_from(args: argparse.Namespace) -> Iterator[BatchStore]:
    if args.store:
        url = args.store
    elif args.config:
        url = store_url_for(load_config(args.config, batch=True))
    else:
        raise BatchJobError("name the batch store: --store URL, or --config CONFIG to use the config's store")
    store = open_batch_store(url, args.tenant)
    try:
        yield store
    finally:
        store.close()


def _emit(args: argparse.Namespace, report: Any, human: Any) -> None:
    if args.json:
        print(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        human(Console())


def census_command(args: argparse.Namespace) -> int:
    with _store_from(args) as store:
        report = census_report(store, args.batch_id)
    _emit(args, report, lambda console: _print_census(report, console))
    return 0


def attention_command(args: argparse.Namespace) -> int:
    with _store_from(args) as store:
        items = attention_report(store, args.batch_id, args.limit)
    _emit(args, items, lambda console: _print_attention(args.batch_id, items, console))
    return 0


def list_command(args: argparse.Namespace) -> int:
    with _store_from(args) as store:
        batches = list_report(store)
    _emit(args, batches, lambda console: _print_list(batches, console))
    return 0

