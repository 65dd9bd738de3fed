"""BatchStore: the durable ledger of a bounded batch job, on SQLite (default) or PostgreSQL.

A bounded job ("copy this topic up to now, exactly once") is split into items, each named by a key. The
store answers the questions a resumed job and an operator ask:

- was this batch opened, and with which plan (``open`` refuses a resume whose plan digest changed)?
- which run id was an item bound to before it ran (``reserve`` hands the first run id back on resume, so a
  resumed item never forks into a second run)?
- how did each item end and what did it consume (``record``), which items need attention, what is the
  census, did the source produce its last item (``mark_exhausted``)?

Keys are ordered by their UTF-8 bytes in both backends (SQLite compares TEXT with ``BINARY``, PostgreSQL
with ``COLLATE "C"``), which is also Python's ``str`` order. The store never relies on a key format.

Every store is scoped to one tenant: all rows carry the tenant, and every statement filters on it.

Guarantees depend on each write being one database transaction: ``reserve`` inserts with
``ON CONFLICT DO NOTHING`` and then reads the row back, so two concurrent reservers of one key both get the
run id of whichever insert committed first. ``record`` updates exactly one row or raises ``NotFound``.
Reads are single statements, so each sees one consistent snapshot while a job writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol


class BatchStoreError(RuntimeError):
    """A batch store operation failed; the message names the store, tenant, batch and key involved."""


class NotFound(BatchStoreError):
    """The batch was never opened, or the item was never reserved, in this tenant."""


class BatchPlanChanged(BatchStoreError):
    """A batch was opened again with a plan digest different from the one it was first opened with."""


class Outcome(StrEnum):
    """How an item ended; both are final (an item reserved but not recorded has no outcome yet)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"


RESERVED = "reserved"
"""The census bucket of items reserved but not yet recorded."""


@dataclass(frozen=True)
class Spend:
    """What an item consumed: records and bytes moved and wall-clock seconds."""

    records: int = 0
    bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class ItemRecord:
    batch_id: str
    key: str
    run_id: str
    outcome: Outcome | None
    reason: str | None
    spend: Spend
    reserved_at: float
    finished_at: float | None


@dataclass(frozen=True)
class Census:
    """Item counts by outcome plus ``"reserved"`` (every bucket present, zeros included), spend totals."""

    counts: dict[str, int]
    spend: Spend
    total: int


@dataclass(frozen=True)
class BatchInfo:
    batch_id: str
    plan_digest: str
    exhausted: bool
    opened_at: float


class BatchStore(Protocol):
    """The durable ledger of bounded batch jobs of one tenant (see the module docstring)."""

    def open(self, batch_id: str, plan_digest: str) -> None:
        """Create the batch, or accept it when it exists with the same digest; else ``BatchPlanChanged``."""

    def plan_digest(self, batch_id: str) -> str | None:
        """The digest the batch was opened with, or None when it was never opened (the existence test)."""

    def mark_exhausted(self, batch_id: str) -> None:
        """Record durably that the source produced its last item. ``NotFound`` for an unknown batch."""

    def is_exhausted(self, batch_id: str) -> bool:
        """Whether ``mark_exhausted`` was called. ``NotFound`` for an unknown batch."""

    def reserve(self, batch_id: str, key: str, run_id: str) -> ItemRecord:
        """Bind ``key`` to ``run_id`` before it runs; an already reserved key keeps and returns its first."""

    def record(
        self, batch_id: str, key: str, outcome: Outcome, spend: Spend, reason: str | None = None
    ) -> ItemRecord:
        """Set how the item's latest attempt ended and what it consumed (replacing an earlier record).

        ``NotFound`` when the batch is unknown or the item was never reserved.
        """

    def cursor(self, batch_id: str) -> str | None:
        """The highest key of the contiguous (byte-ordered) prefix of items with a terminal outcome."""

    def census(self, batch_id: str) -> Census:
        """Counts by outcome and reserved-but-unfinished, with spend totals; all zero for an unknown batch."""

    def items(self, batch_id: str, limit: int = 100) -> list[ItemRecord]:
        """The first ``limit`` items, lowest key first; empty for an unknown batch."""

    def items_needing_attention(self, batch_id: str, limit: int = 100) -> list[ItemRecord]:
        """Failed and suspended items, lowest key first; empty for an unknown batch."""

    def batches(self) -> list[BatchInfo]:
        """This tenant's batches, oldest first."""

    def close(self) -> None:
        """Release the connection; the store object is unusable afterwards."""




SQLITE_PREFIX = "sqlite://"
POSTGRES_PREFIXES = ("postgresql://", "postgres://")


def open_batch_store(url: str, tenant: str = "default") -> BatchStore:
    """The store a URL names: ``postgresql://…`` (or ``postgres://…``) -> PostgreSQL;
    ``sqlite://PATH`` or a plain path -> SQLite (``sqlite:///tmp/b.db`` is ``/tmp/b.db``,
    ``sqlite://b.db`` is ``b.db`` relative to the working directory)."""
    from engine.batch.sql_store import SqliteBatchStore

    if url.startswith(POSTGRES_PREFIXES):
        return _postgres_store(url, tenant)
    if url.startswith(SQLITE_PREFIX):
        return SqliteBatchStore(Path(url[len(SQLITE_PREFIX):]), tenant)
    if "://" in url:
        raise BatchStoreError(
            f"unsupported batch store URL {url!r}: use sqlite:///path/to/file.db, a file path, or postgresql://..."
        )
    return SqliteBatchStore(Path(url), tenant)


def _postgres_store(dsn: str, tenant: str) -> BatchStore:
    """psycopg is an optional dependency: a PostgreSQL store without it says which extra to install."""
    try:
        from engine.batch.postgres_store import PostgresBatchStore
    except ImportError as error:
        raise BatchStoreError(
            f"a PostgreSQL batch store needs psycopg, which is not installed ({error}); "
            "install it with: pip install 'epochline[postgres]'"
        ) from error
    return PostgresBatchStore(dsn, tenant)
