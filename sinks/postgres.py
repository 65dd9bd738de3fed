"""The PostgreSQL sink: rows into a table exactly once, by two-phase commit behind the Kafka transaction.

Each epoch's rows go into one database transaction (``COPY`` when appending, ``INSERT ... ON CONFLICT DO
UPDATE`` when upserting), which ``prepare`` turns into a prepared transaction named
``epochline:<connector>:<instance>:<checkpoint id>``. The epoch's Kafka transaction then commits (the offsets'
metadata names the checkpoint and the instance: that is the decision), and ``commit`` runs ``COMMIT
PREPARED``. At start, ``recover`` finds this instance's prepared transactions in ``pg_prepared_xacts`` and
commits the ones Kafka committed, rolls back the rest.

Why upserts are not staged in a temporary table: PostgreSQL refuses to ``PREPARE`` a transaction that touched
a temporary table, so the rows go one statement each, pipelined by psycopg's ``executemany``.

A row PostgreSQL refuses for its value (a data or constraint error) does not fail the epoch: the batch is
written again row by row, each in a savepoint, and the refused rows are returned to be dead-lettered.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from connectors.metadata import is_metadata_column
from sinks.api import ExternalSink, Guarantee, RefusedRow, SinkAssignment, SinkSettingsError
from sinks.errors import SinkError, SinkMisconfigured

log = logging.getLogger(__name__)

GID_PREFIX = "epochline"
MAX_GID_BYTES = 200
"""PostgreSQL's limit on a prepared transaction's id."""
CONNECT_TIMEOUT_S = 10
ROW_ERROR_CLASSES = ("22", "23")
"""SQLSTATE classes of errors a row causes by its values: data exceptions and integrity constraint violations."""
_CREDENTIALS = re.compile(r"://[^/@\s]+@")


class PostgresSinkError(SinkError):
    """A PostgreSQL call failed for a reason a restart may get past (a lost connection, a server restart)."""


@dataclass(frozen=True)
class PostgresSettings:
    """``sink: {type: postgres, ...}``, checked."""

    dsn: str
    table: str
    mode: Literal["append", "upsert"] = "append"
    key: tuple[str, ...] = ()
    create_table: bool = False


SETTING_NAMES = frozenset({"dsn", "table", "mode", "key", "create_table"})


def parse_settings(settings: Mapping[str, object]) -> PostgresSettings:
    """``settings`` as ``PostgresSettings``; ``SinkSettingsError`` names the first setting that is wrong."""
    unknown = sorted(set(settings) - SETTING_NAMES)
    if unknown:
        raise SinkSettingsError(f"unknown postgres sink settings {unknown} (known: {sorted(SETTING_NAMES)})")
    dsn, table, mode = settings.get("dsn"), settings.get("table"), settings.get("mode", "append")
    key, create_table = settings.get("key", []), settings.get("create_table", False)
    if not isinstance(dsn, str) or not dsn:
        raise SinkSettingsError("dsn: a postgresql:// connection string is required")
    if not isinstance(table, str) or not re.fullmatch(r"[^.\s]+(\.[^.\s]+)?", table):
        raise SinkSettingsError("table: a table name (or schema.table) is required")
    if mode not in ("append", "upsert"):
        raise SinkSettingsError(f"mode: {mode!r} is not append or upsert")
    if not isinstance(key, list) or not all(isinstance(column, str) for column in key):
        raise SinkSettingsError("key: a list of column names")
    if mode == "upsert" and not key:
        raise SinkSettingsError("key: mode upsert needs the key columns rows are matched by")
    if not isinstance(create_table, bool):
        raise SinkSettingsError("create_table: true or false")
    return PostgresSettings(dsn, table, mode, tuple(key), create_table)


def without_credentials(dsn: str) -> str:
    """The DSN as it may be shown: no user or password."""
    return _CREDENTIALS.sub("://", dsn)


def postgres_type(field_type: pa.DataType) -> str:
    """The PostgreSQL column type an Arrow type is created as (README: "Arrow to PostgreSQL types")."""
    if pa.types.is_boolean(field_type):
        return "boolean"
    if pa.types.is_int8(field_type) or pa.types.is_int16(field_type) or pa.types.is_uint8(field_type):
        return "smallint"
    if pa.types.is_int32(field_type) or pa.types.is_uint16(field_type):
        return "integer"
    if pa.types.is_int64(field_type) or pa.types.is_uint32(field_type):
        return "bigint"
    if pa.types.is_uint64(field_type):
        return "numeric(20, 0)"
    if pa.types.is_float16(field_type) or pa.types.is_float32(field_type):
        return "real"
    if pa.types.is_float64(field_type):
        return "double precision"
    if pa.types.is_decimal(field_type):
        decimal = field_type
        assert isinstance(decimal, pa.Decimal128Type | pa.Decimal256Type)
        return f"numeric({decimal.precision}, {decimal.scale})"
    if pa.types.is_string(field_type) or pa.types.is_large_string(field_type):
        return "text"
    if pa.types.is_binary(field_type) or pa.types.is_large_binary(field_type):
        return "bytea"
    if pa.types.is_timestamp(field_type):
        assert isinstance(field_type, pa.TimestampType)
        return "timestamptz" if field_type.tz else "timestamp"
    if pa.types.is_date(field_type):
        return "date"
    if pa.types.is_time(field_type):
        return "time"
    raise SinkMisconfigured(f"no PostgreSQL type for Arrow type {field_type}: create the table yourself "
                            "(create_table: false) with a column type psycopg can write it to")


def output_rows(batch: pa.Table) -> pa.Table:
    """The batch without Kafka's metadata columns: they describe where input came from, not table rows."""
    return batch.select([name for name in batch.column_names if not is_metadata_column(name)])


class PostgresSink(ExternalSink):
    """One connector instance's writer into one table; see the module docstring for the protocol."""

    guarantee = Guarantee.EXACTLY_ONCE

    def __init__(self, settings: PostgresSettings) -> None:
        from psycopg import sql

        self.settings = settings
        self._sql = sql
        self._table = sql.Identifier(*settings.table.split("."))
        self._connection: Any = None
        self._connector_prefix = ""
        self._gid_prefix = ""
        self._in_transaction = False
        self._prepared: str | None = None
        self._table_ready = False
        """Whether the table is known to exist outside any open epoch (created on first write otherwise)."""
        self._where = f"PostgreSQL table {settings.table!r}"

    # -- start -----------------------------------------------------------------------------------------
    def open(self, assignment: SinkAssignment) -> None:
        """Connect, then check what every epoch needs, each failure one line naming the setting, table or
        privilege: prepared transactions enabled, the table there (or allowed to be created), the right to
        write it."""
        import psycopg

        self._connector_prefix = f"{GID_PREFIX}:{assignment.connector}:"
        self._gid_prefix = f"{self._connector_prefix}{assignment.instance}:"
        if len(self._gid_prefix.encode()) + 20 > MAX_GID_BYTES:
            raise SinkMisconfigured(f"connector and instance names are too long for a PostgreSQL prepared "
                                    f"transaction id ({MAX_GID_BYTES} bytes at most): {self._gid_prefix!r}")
        try:
            self._connection = psycopg.connect(self.settings.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.OperationalError as error:
            raise PostgresSinkError(f"cannot connect to PostgreSQL at {without_credentials(self.settings.dsn)}: "
                                    f"{first_line(error)}") from error
        self._check_prepared_transactions()
        self._check_table()

    def _check_prepared_transactions(self) -> None:
        allowed = int(self._fetch_one("SHOW max_prepared_transactions"))
        if allowed == 0:
            raise SinkMisconfigured(
                f"PostgreSQL at {without_credentials(self.settings.dsn)} has max_prepared_transactions = 0: the "
                "postgres sink commits each epoch by PREPARE TRANSACTION; set max_prepared_transactions (e.g. 20) "
                "in postgresql.conf and restart the server")

    def _check_table(self) -> None:
        exists = self._fetch_one("SELECT to_regclass(%s) IS NOT NULL", (self.settings.table,))
        if not exists:
            if not self.settings.create_table:
                raise SinkMisconfigured(f"{self._where} does not exist: create it, or set create_table: true")
            if not self._fetch_one("SELECT has_schema_privilege(current_schema(), 'CREATE')"):
                raise SinkMisconfigured(f"{self._where} does not exist and the user lacks the CREATE privilege on "
                                        "the schema to create it")
            return
        self._table_ready = True
        needed = ["INSERT"] + (["UPDATE"] if self.settings.mode == "upsert" else [])
        for privilege in needed:
            if not self._fetch_one("SELECT has_table_privilege(%s, %s)", (self.settings.table, privilege)):
                raise SinkMisconfigured(f"{self._where}: the user lacks the {privilege} privilege on it "
                                        f"(GRANT {privilege} ON {self.settings.table} TO ...)")

    def recover(self, last_committed_checkpoint_id: int | None) -> None:
        """Commit this instance's prepared epochs up to the last committed checkpoint, roll back the rest.

        Another instance's prepared epochs are left to it (it may be alive and about to commit one), and
        named in a warning: one whose instance never starts again (its state directory, which keeps its
        name, was lost) holds its locks until an operator resolves it."""
        connector_gids = [row[0] for row in self._execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, %s)",
            (self._connector_prefix,)).fetchall()]
        others = [gid for gid in connector_gids if not gid.startswith(self._gid_prefix)]
        if others:
            log.warning("prepared epochs of other instances of this connector are left to them", extra={
                "gids": others})
        for gid in connector_gids:
            if gid not in others:
                self._resolve(gid, last_committed_checkpoint_id)

    def _resolve(self, gid: str, last_committed_checkpoint_id: int | None) -> None:
        checkpoint_id = int(gid.removeprefix(self._gid_prefix))
        committed = last_committed_checkpoint_id is not None and checkpoint_id <= last_committed_checkpoint_id
        self._execute(self._sql.SQL("COMMIT PREPARED {}" if committed else "ROLLBACK PREPARED {}").format(
            self._sql.Literal(gid)))
        log.info("prepared epoch resolved", extra={"gid": gid, "committed": committed})

    # -- one epoch -------------------------------------------------------------------------------------
    def write(self, batch: pa.Table) -> list[RefusedRow]:
        """The rows into the epoch's open transaction (begun by the first write); refused rows returned."""
        rows = output_rows(batch)
        if rows.num_rows == 0:
            return []
        if not self._in_transaction:
            self._execute("BEGIN")
            self._in_transaction = True
        if not self._table_ready:
            self._execute(self._create_table_statement(rows.schema))
        columns = rows.column_names
        values = list(zip(*(column.to_pylist() for column in rows.columns)))  # no dict per row: 2.5 times as fast
        try:
            with self._savepoint():
                self._write_rows(columns, values)
            return []
        except RowsRefused:
            return self._write_row_by_row(columns, values)

    def _write_row_by_row(self, columns: list[str], values: list[tuple[object, ...]]) -> list[RefusedRow]:
        """Each row in a savepoint of its own, so one refused row leaves the others in the epoch."""
        refused = []
        for index, row in enumerate(values):
            try:
                with self._savepoint():
                    self._write_rows(columns, [row])
            except RowsRefused as error:
                refused.append(RefusedRow(index, f"{self._where} refused the row: {error}"))
        return refused

    def _write_rows(self, columns: list[str], values: list[tuple[object, ...]]) -> None:
        """Append by ``COPY``, upsert by ``INSERT ... ON CONFLICT (key) DO UPDATE``; an error the rows' values
        caused is ``RowsRefused``, any other the ``PostgresSinkError``/``SinkMisconfigured`` it means."""
        sql = self._sql
        names = sql.SQL(", ").join(map(sql.Identifier, columns))
        with self._errors_named(rows_may_be_refused=True), self._connection.cursor() as cursor:
            if self.settings.mode == "append":
                with cursor.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(self._table, names)) as copy:
                    for row in values:
                        copy.write_row(row)
            else:
                cursor.executemany(self._upsert_statement(columns, names), values)

    def _upsert_statement(self, columns: list[str], names: Any) -> Any:
        sql = self._sql
        keys = sql.SQL(", ").join(map(sql.Identifier, self.settings.key))
        updates = [sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(name))
                   for name in columns if name not in self.settings.key]
        action = (sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(updates)) if updates
                  else sql.SQL("DO NOTHING"))
        placeholders = sql.SQL(", ").join(sql.Placeholder() * len(columns))
        return sql.SQL("INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) {}").format(
            self._table, names, placeholders, keys, action)

    def _create_table_statement(self, schema: pa.Schema) -> Any:
        sql = self._sql
        columns = [sql.SQL("{} {}").format(sql.Identifier(field.name), sql.SQL(postgres_type(field.type)))
                   for field in schema]
        if self.settings.key:
            columns.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier,
                                                                                        self.settings.key))))
        return sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(self._table, sql.SQL(", ").join(columns))

    def prepare(self, checkpoint_id: int) -> None:
        """``PREPARE TRANSACTION`` under the epoch's id; an epoch without rows has nothing to prepare."""
        if not self._in_transaction:
            return
        gid = f"{self._gid_prefix}{checkpoint_id}"
        self._execute(self._sql.SQL("PREPARE TRANSACTION {}").format(self._sql.Literal(gid)))
        self._in_transaction = False
        self._prepared = gid

    def commit(self, checkpoint_id: int) -> None:
        """``COMMIT PREPARED``: Kafka committed the epoch."""
        if self._prepared is None:
            return
        self._execute(self._sql.SQL("COMMIT PREPARED {}").format(self._sql.Literal(self._prepared)))
        self._prepared = None
        self._table_ready = True

    def abort(self, checkpoint_id: int | None) -> None:
        """Roll back the open transaction, or the prepared one whose Kafka transaction was aborted."""
        if self._in_transaction:
            self._execute("ROLLBACK")
            self._in_transaction = False
        if self._prepared is not None:
            self._execute(self._sql.SQL("ROLLBACK PREPARED {}").format(self._sql.Literal(self._prepared)))
            self._prepared = None

    def close(self) -> None:
        """Close the connection: an open transaction dies with it, a prepared one stays for ``recover``."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # -- calls -----------------------------------------------------------------------------------------
    @contextmanager
    def _savepoint(self) -> Iterator[None]:
        """A savepoint the block's rows are rolled back to when PostgreSQL refuses them."""
        self._execute("SAVEPOINT epochline_rows")
        try:
            yield
        except RowsRefused:
            self._execute("ROLLBACK TO SAVEPOINT epochline_rows")
            raise
        self._execute("RELEASE SAVEPOINT epochline_rows")

    def _execute(self, statement: Any, params: Sequence[object] | None = None) -> Any:
        with self._errors_named():
            return self._connection.execute(statement, params)

    def _fetch_one(self, statement: str, params: Sequence[object] | None = None) -> Any:
        row = self._execute(statement, params).fetchone()
        return row[0]

    @contextmanager
    def _errors_named(self, rows_may_be_refused: bool = False) -> Iterator[None]:
        """psycopg's errors as what they mean here, in one line naming the table. Only writing rows can have
        rows refused; the same error elsewhere (a deferred constraint failing at ``PREPARE``) fails the
        epoch."""
        import psycopg

        try:
            yield
        except psycopg.Error as error:
            state = error.sqlstate or ""
            if rows_may_be_refused and state.startswith(ROW_ERROR_CLASSES):
                raise RowsRefused(first_line(error)) from error
            if isinstance(error, psycopg.errors.InsufficientPrivilege | psycopg.errors.UndefinedTable
                          | psycopg.errors.UndefinedColumn | psycopg.errors.InvalidColumnReference):
                raise SinkMisconfigured(f"{self._where}: {first_line(error)}") from error
            raise PostgresSinkError(f"{self._where}: {first_line(error)}") from error


class RowsRefused(Exception):
    """PostgreSQL refused rows for their values (SQLSTATE class 22 or 23)."""


def first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


class PostgresPlugin:
    """The ``postgres`` entry of ``epochline.sinks``."""

    def check_settings(self, settings: Mapping[str, object]) -> None:
        parse_settings(settings)

    def create(self, settings: Mapping[str, object]) -> ExternalSink:
        return PostgresSink(parse_settings(settings))


PLUGIN = PostgresPlugin()
