"""The batch store on PostgreSQL (the ``epochline[postgres]`` extra: psycopg 3)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from engine.batch.sql_store import POSTGRES_SCHEMA, POSTGRES_SCHEMA_LOCK, SqlBatchStore
from engine.batch.store import BatchStoreError


class PostgresBatchStore(SqlBatchStore):
    """The store on PostgreSQL (psycopg 3), for jobs whose ledger must outlive the machine running them.

    The connection is in autocommit mode: each read is one statement (one snapshot) and writes run in
    explicit transactions at READ COMMITTED, which is enough because each write is a single-row insert
    with ``ON CONFLICT DO NOTHING`` or a single-row update, re-read in the same transaction. Keys are
    ``COLLATE "C"`` so their order is byte order, whatever the database's default collation.
    """

    def __init__(self, dsn: str, tenant: str = "default", connect_timeout: int = 10) -> None:
        super().__init__(tenant)
        self.location = _describe_dsn(dsn)
        try:
            self._connection = psycopg.connect(dsn, autocommit=True, connect_timeout=connect_timeout)
        except psycopg.OperationalError as error:
            raise BatchStoreError(f"cannot connect to the batch store at {self.location}: {error}") from error
        with self._transaction():
            self._connection.execute("SELECT pg_advisory_xact_lock(%s)", (POSTGRES_SCHEMA_LOCK,))
            self._connection.execute(POSTGRES_SCHEMA)

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._connection.execute(sql.replace("?", "%s"), params).fetchall()

    def _changed(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        with self._lock:
            return self._connection.execute(sql.replace("?", "%s"), params).rowcount

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._lock, self._connection.transaction():
            yield

    def close(self) -> None:
        with self._lock:
            self._connection.close()


def _describe_dsn(dsn: str) -> str:
    """The DSN without its password, for error messages and logs."""
    parts = conninfo_to_dict(dsn)
    user = f"{parts['user']}@" if parts.get("user") else ""
    return f"postgresql://{user}{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"


