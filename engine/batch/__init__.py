"""Bounded exactly-once batch jobs: "copy and transform this topic up to now, exactly once".

- ``plan``: the frozen plan (ranges per partition, split into items, digest);
- ``items``: one item read, transformed and committed in its own Kafka transaction;
- ``job``: the job from open (or resume, with reconciliation) to the last item; how it works is in its
  module docstring;
- ``store``, ``sql_store``, ``postgres_store``: the ledger (SQLite by default, PostgreSQL with the
  ``epochline[postgres]`` extra);
- ``reports``: census, attention and list reports (the terminal progress bar is ``engine.cli.progress``).
"""

from engine.batch.errors import BatchHalted, BatchJobError, BatchNotFound, PlanFileMissing
from engine.batch.job import BatchJob, BatchProgress, BatchSummary, run_batch
from engine.batch.options import BatchOptions, kafka_id, store_url_for
from engine.batch.plan import BatchItem, BatchPlan, split_into_items
from engine.batch.store import BatchStore, BatchStoreError, Outcome, Spend, open_batch_store

__all__ = [
    "BatchHalted",
    "BatchItem",
    "BatchJob",
    "BatchJobError",
    "BatchNotFound",
    "BatchOptions",
    "BatchPlan",
    "BatchProgress",
    "BatchStore",
    "BatchStoreError",
    "BatchSummary",
    "Outcome",
    "PlanFileMissing",
    "Spend",
    "kafka_id",
    "open_batch_store",
    "run_batch",
    "split_into_items",
    "store_url_for",
]
