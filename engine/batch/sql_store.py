"""The ``BatchStore`` semantics in SQL that SQLite and PostgreSQL both accept, and the SQLite store."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from engine.batch.store import (
    RESERVED,
    BatchInfo,
    BatchPlanChanged,
    BatchStoreError,
    Census,
    ItemRecord,
    NotFound,
    Outcome,
    Spend,
)

log = logging.getLogger(__name__)

UNSETTLED = "outcome IS NULL"
"""Items that hold the cursor back: reserved but not yet recorded."""

NEEDS_ATTENTION = "outcome = 'failed'"
"""Items an operator must look at."""

_ITEM_COLUMNS = "batch_id, key, run_id, outcome, reason, records, bytes, seconds, reserved_at, finished_at"


def _item_from_row(row: tuple[Any, ...]) -> ItemRecord:
    batch_id, key, run_id, outcome, reason, records, bytes_, seconds, reserved_at, finished_at = row
    return ItemRecord(
        batch_id=batch_id,
        key=key,
        run_id=run_id,
        outcome=None if outcome is None else Outcome(outcome),
        reason=reason,
        spend=Spend(records=int(records), bytes=int(bytes_), seconds=float(seconds)),
        reserved_at=float(reserved_at),
        finished_at=None if finished_at is None else float(finished_at),
    )


def _check_limit(limit: int) -> None:
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")


class SqlBatchStore(ABC):
    """The BatchStore semantics in SQL that SQLite and PostgreSQL both accept.

    Subclasses provide the connection (``_rows``, ``_changed``), write transactions (``_transaction``),
    the schema and ``location`` (named in error messages). The SQL here uses ``?`` placeholders and no
    literal ``?`` or ``%``, so a backend speaking another placeholder style can translate it mechanically.
    A store object holds one connection; ``_lock`` keeps threads sharing it from interleaving statements
    inside another thread's transaction.
    """

    location: str

    def __init__(self, tenant: str) -> None:
        if not tenant:
            raise ValueError("tenant must be a non-empty string")
        self.tenant = tenant
        self._lock = threading.RLock()

    # --- backend hooks -------------------------------------------------------------------------------
    @abstractmethod
    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement and return all its rows."""

    @abstractmethod
    def _changed(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        """Run one insert or update and return how many rows it changed."""

    @abstractmethod
    def _transaction(self) -> AbstractContextManager[None]:
        """A write transaction around the statements run inside it: committed on exit, rolled back on error."""

    # --- helpers -------------------------------------------------------------------------------------
    def _where(self, batch_id: str) -> str:
        return f"batch {batch_id!r} of tenant {self.tenant!r} in {self.location}"

    def _batch_row(self, batch_id: str) -> tuple[Any, ...] | None:
        rows = self._rows(
            "SELECT batch_id, plan_digest, exhausted, opened_at FROM epochline_batches"
            " WHERE tenant = ? AND batch_id = ?",
            (self.tenant, batch_id),
        )
        return rows[0] if rows else None

    def _require_batch(self, batch_id: str) -> tuple[Any, ...]:
        row = self._batch_row(batch_id)
        if row is None:
            raise NotFound(f"{self._where(batch_id)} was never opened")
        return row

    def _item(self, batch_id: str, key: str) -> ItemRecord:
        """The item's row, read inside the transaction that just inserted or updated it."""
        rows = self._rows(
            f"SELECT {_ITEM_COLUMNS} FROM epochline_batch_items WHERE tenant = ? AND batch_id = ? AND key = ?",
            (self.tenant, batch_id, key),
        )
        if not rows:
            raise BatchStoreError(f"item {key!r} of {self._where(batch_id)} is missing right after writing it")
        return _item_from_row(rows[0])

    # --- BatchStore ----------------------------------------------------------------------------------
    def open(self, batch_id: str, plan_digest: str) -> None:
        with self._transaction():
            created = self._changed(
                "INSERT INTO epochline_batches (tenant, batch_id, plan_digest, exhausted, opened_at)"
                " VALUES (?, ?, ?, FALSE, ?) ON CONFLICT DO NOTHING",
                (self.tenant, batch_id, plan_digest, time.time()),
            )
            stored = self._require_batch(batch_id)[1]
        if stored != plan_digest:
            raise BatchPlanChanged(
                f"{self._where(batch_id)} was opened with plan digest {stored!r}, "
                f"now asked to open with {plan_digest!r}: the plan changed, so this batch cannot be resumed"
            )
        log.info(
            "batch opened" if created else "batch reopened",
            extra={"tenant": self.tenant, "batch_id": batch_id, "store": self.location},
        )

    def plan_digest(self, batch_id: str) -> str | None:
        row = self._batch_row(batch_id)
        return None if row is None else row[1]

    def mark_exhausted(self, batch_id: str) -> None:
        updated = self._changed(
            "UPDATE epochline_batches SET exhausted = TRUE WHERE tenant = ? AND batch_id = ?",
            (self.tenant, batch_id),
        )
        if updated != 1:
            raise NotFound(f"cannot mark {self._where(batch_id)} exhausted: it was never opened")

    def is_exhausted(self, batch_id: str) -> bool:
        return bool(self._require_batch(batch_id)[2])

    def reserve(self, batch_id: str, key: str, run_id: str) -> ItemRecord:
        with self._transaction():
            self._require_batch(batch_id)
            self._changed(
                "INSERT INTO epochline_batch_items (tenant, batch_id, key, run_id, reserved_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (self.tenant, batch_id, key, run_id, time.time()),
            )
            return self._item(batch_id, key)

    def record(
        self, batch_id: str, key: str, outcome: Outcome, spend: Spend, reason: str | None = None
    ) -> ItemRecord:
        outcome = Outcome(outcome)
        with self._transaction():
            updated = self._changed(
                "UPDATE epochline_batch_items"
                " SET outcome = ?, reason = ?, records = ?, bytes = ?, seconds = ?, finished_at = ?"
                " WHERE tenant = ? AND batch_id = ? AND key = ?",
                (outcome.value, reason, spend.records, spend.bytes, spend.seconds, time.time(),
                 self.tenant, batch_id, key),
            )
            if updated != 1:
                self._require_batch(batch_id)
                raise NotFound(f"cannot record item {key!r} of {self._where(batch_id)}: it was never reserved")
            return self._item(batch_id, key)

    def cursor(self, batch_id: str) -> str | None:
        # One statement, so one snapshot: the first unsettled key and the highest key below it are read
        # together. Written as ORDER BY ... LIMIT 1 so each part is an index probe (the unsettled index,
        # then the primary key backwards) whatever the planner's statistics say.
        rows = self._rows(
            "SELECT CASE WHEN u.first_key IS NULL"
            "  THEN (SELECT key FROM epochline_batch_items WHERE tenant = ? AND batch_id = ?"
            "        ORDER BY key DESC LIMIT 1)"
            "  ELSE (SELECT key FROM epochline_batch_items WHERE tenant = ? AND batch_id = ? AND key < u.first_key"
            "        ORDER BY key DESC LIMIT 1)"
            " END FROM (SELECT (SELECT key FROM epochline_batch_items"
            f"  WHERE tenant = ? AND batch_id = ? AND {UNSETTLED}"
            "  ORDER BY key LIMIT 1) AS first_key) u",
            (self.tenant, batch_id) * 3,
        )
        highest: str | None = rows[0][0]
        return highest

    def census(self, batch_id: str) -> Census:
        rows = self._rows(
            "SELECT outcome, COUNT(*), COALESCE(SUM(records), 0), COALESCE(SUM(bytes), 0),"
            " COALESCE(SUM(seconds), 0) FROM epochline_batch_items"
            " WHERE tenant = ? AND batch_id = ? GROUP BY outcome",
            (self.tenant, batch_id),
        )
        counts = {outcome.value: 0 for outcome in Outcome} | {RESERVED: 0}
        records = bytes_ = 0
        seconds = 0.0
        for outcome, count, row_records, row_bytes, row_seconds in rows:
            counts[RESERVED if outcome is None else outcome] = int(count)
            records += int(row_records)
            bytes_ += int(row_bytes)
            seconds += float(row_seconds)
        return Census(counts=counts, spend=Spend(records, bytes_, seconds), total=sum(counts.values()))

    def items(self, batch_id: str, limit: int = 100) -> list[ItemRecord]:
        _check_limit(limit)
        rows = self._rows(
            f"SELECT {_ITEM_COLUMNS} FROM epochline_batch_items WHERE tenant = ? AND batch_id = ?"
            " ORDER BY key LIMIT ?",
            (self.tenant, batch_id, limit),
        )
        return [_item_from_row(row) for row in rows]

    def items_needing_attention(self, batch_id: str, limit: int = 100) -> list[ItemRecord]:
        _check_limit(limit)
        rows = self._rows(
            f"SELECT {_ITEM_COLUMNS} FROM epochline_batch_items WHERE tenant = ? AND batch_id = ?"
            f" AND {NEEDS_ATTENTION} ORDER BY key LIMIT ?",
            (self.tenant, batch_id, limit),
        )
        return [_item_from_row(row) for row in rows]

    def batches(self) -> list[BatchInfo]:
        rows = self._rows(
            "SELECT batch_id, plan_digest, exhausted, opened_at FROM epochline_batches WHERE tenant = ?"
            " ORDER BY opened_at, batch_id",
            (self.tenant,),
        )
        return [BatchInfo(batch_id, digest, bool(exhausted), float(opened_at))
                for batch_id, digest, exhausted, opened_at in rows]


# The key column compares bytes (BINARY in SQLite, "C" in PostgreSQL), so both backends order keys alike. The
# unsettled and attention indexes are partial, so the cursor and the attention list stay index probes when
# a batch holds a million settled items; queries repeat their predicates literally (not as parameters),
# which is what lets SQLite's planner use a partial index. The foreign key keeps orphan items out.
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS epochline_batches (
    tenant      TEXT NOT NULL,
    batch_id    TEXT NOT NULL,
    plan_digest TEXT NOT NULL,
    exhausted   {{boolean}} NOT NULL DEFAULT FALSE,
    opened_at   {{real}} NOT NULL,
    PRIMARY KEY (tenant, batch_id)
);
CREATE TABLE IF NOT EXISTS epochline_batch_items (
    tenant      TEXT NOT NULL,
    batch_id    TEXT NOT NULL,
    key         TEXT COLLATE {{byte_order}} NOT NULL,
    run_id      TEXT NOT NULL,
    outcome     TEXT CHECK (outcome IN ({', '.join(repr(o.value) for o in Outcome)})),
    reason      TEXT,
    records     {{integer}} NOT NULL DEFAULT 0,
    bytes       {{integer}} NOT NULL DEFAULT 0,
    seconds     {{real}} NOT NULL DEFAULT 0,
    reserved_at {{real}} NOT NULL,
    finished_at {{real}},
    PRIMARY KEY (tenant, batch_id, key),
    FOREIGN KEY (tenant, batch_id) REFERENCES epochline_batches (tenant, batch_id)
);
CREATE INDEX IF NOT EXISTS epochline_batch_items_unsettled ON epochline_batch_items (tenant, batch_id, key)
    WHERE {UNSETTLED};
CREATE INDEX IF NOT EXISTS epochline_batch_items_attention ON epochline_batch_items (tenant, batch_id, key)
    WHERE {NEEDS_ATTENTION};
"""
_SQLITE_SCHEMA = _SCHEMA.format(boolean="INTEGER", real="REAL", integer="INTEGER", byte_order="BINARY")
POSTGRES_SCHEMA = _SCHEMA.format(boolean="BOOLEAN", real="DOUBLE PRECISION", integer="BIGINT", byte_order='"C"')

# Concurrent "CREATE TABLE IF NOT EXISTS" races in PostgreSQL (both see no table, one fails on the
# catalog's unique index), so schema creation is serialised by a transaction-scoped advisory lock.
POSTGRES_SCHEMA_LOCK = 0x6570_6F63_6800_0001


class SqliteBatchStore(SqlBatchStore):
    """The default store: one SQLite file in WAL mode, so census readers never block the job's writes.

    Durability: ``synchronous=FULL`` makes every committed reserve/record survive power loss, not only a
    crash of the process. Writes take the write lock up front (``BEGIN IMMEDIATE``), so two writers
    queue on ``busy_timeout`` instead of failing on a lock upgrade.
    """

    def __init__(self, path: Path | str, tenant: str = "default", busy_timeout: float = 30.0) -> None:
        super().__init__(tenant)
        self.path = Path(path)
        self.location = str(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._connection = sqlite3.connect(
            self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        self._connection.execute("PRAGMA journal_mode = WAL")
        self._connection.execute("PRAGMA synchronous = FULL")
        self._connection.execute("PRAGMA foreign_keys = ON")
        with self._transaction():
            for statement in _SQLITE_SCHEMA.split(";"):
                if statement.strip():
                    self._connection.execute(statement)

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._connection.execute(sql, params).fetchall()

    def _changed(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        with self._lock:
            return self._connection.execute(sql, params).rowcount

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._lock:
            self._connection.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                if self._connection.in_transaction:  # SQLite itself rolls back after some errors
                    self._connection.execute("ROLLBACK")
                raise
            self._connection.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._connection.close()


