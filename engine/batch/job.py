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

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Protocol

from connectors.source import KafkaSource, SourceError
from engine.batch.errors import BatchJobError, PlanFileMissing
from engine.batch.items import ItemProcessor
from engine.batch.options import BatchOptions, checked_name, kafka_id, store_url_for
from engine.batch.plan import BatchItem, BatchPlan, PlanFile, freeze_plan, plan_digest
from engine.batch.store import BatchStore, ItemRecord, Outcome, Spend, open_batch_store
from engine.config import ConnectorConfig
from engine.wiring import source_settings
from sinks import SinkError

log = logging.getLogger(__name__)


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


def _is_settled(record: ItemRecord) -> bool:
    return record.outcome is not None


class BatchJob:
    """One batch of one connector: plan, store and Kafka, from open (or resume) to the last item."""

    def __init__(self, config: ConnectorConfig, options: BatchOptions, store: BatchStore) -> None:
        self.config = config
        self.options = options
        self.store = store
        self.batch_id = checked_name(options.batch_id, "batch id")
        tenant = checked_name(options.tenant, "tenant")
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
        settings = source_settings(self.config)
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
        settled = {record.key for record in recorded if _is_settled(record)}
        progress.begin(len(plan.items), len(settled))
        for item in plan.items:
            if item.key in settled:
                continue
            proposed = uuid.uuid4().hex
            record = self.store.reserve(self.batch_id, item.key, proposed)
            if _is_settled(record):
                progress.settled(record.spend.records)
                continue
            reconciled = self._reconcile(processor, item, record) if record.run_id != proposed else None
            if reconciled is not None:
                tally["reconciled"] += 1
                progress.settled(reconciled.records)
                continue
            result = processor.run(item, record.run_id)
            if self.options.crash_point is not None:
                self.options.crash_point("batch-between-commit-and-record")
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
