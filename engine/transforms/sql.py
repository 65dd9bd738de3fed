"""SQL steps: one DuckDB ``SELECT`` over the cycle's rows, visible to the query as the table ``input``."""

from __future__ import annotations

from functools import cached_property
from typing import cast

import duckdb
import pyarrow as pa

from engine.state import KeyedState
from engine.transforms.database import duckdb_connection, open_database_soon
from engine.transforms.operator import OperatorConfigError, OperatorRuntimeError, Watermark

INPUT_VIEW = "input"
"""The name a SQL query reads the cycle's rows from."""


class SqlOperator:
    """Runs one DuckDB query over each cycle's rows, visible to the query as the table ``input``.

    One DuckDB connection per operator (to the process's one database), and the query is bound once into a
    relation: DuckDB 2.0 relations run their query again on every read, resolving ``input`` to whatever is
    registered at that moment. So a cycle costs one ``register`` of the Arrow table (zero-copy) plus one run
    of the already bound query, not a parse and bind per cycle. The connection keeps a reference to the last
    cycle's table until the next cycle replaces it.
    """

    def __init__(self, query: str, name: str = "sql") -> None:
        self.name = name
        self.query = query
        self._relation: duckdb.DuckDBPyRelation | None = None
        self._output_schema: pa.Schema | None = None
        open_database_soon()

    @cached_property
    def _connection(self) -> duckdb.DuckDBPyConnection:
        """Made at first use (``validate``, while the pipeline's fence waits on the broker), to the process's
        database, whose opening began on a thread when the step was made (``engine.transforms.database``)."""
        return duckdb_connection()

    def validate(self, input_schema: pa.Schema) -> pa.Schema:
        """Bind and run the query over an empty table of ``input_schema``: unknown columns, syntax errors
        and type errors surface here as ``OperatorConfigError`` carrying DuckDB's message."""
        self.check_query()
        self._connection.register(INPUT_VIEW, input_schema.empty_table())
        try:
            relation = self._connection.sql(self.query)
            self._output_schema = relation.to_arrow_table().schema
        except duckdb.Error as exc:
            raise self._invalid(exc) from exc
        self._relation = relation
        return self._output_schema

    def check_query(self) -> None:
        """What can be checked without the input's schema (a source whose schema is inferred from its first
        records): the query parses and is exactly one SELECT. Only a single read-only query is re-runnable
        per cycle; DuckDB would run any other statement once."""
        try:
            statements = self._connection.extract_statements(self.query)
        except duckdb.Error as exc:
            raise self._invalid(exc) from exc
        if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
            kinds = [statement.type.name for statement in statements]
            raise OperatorConfigError(
                f"operator {self.name!r}: query {self.query!r} must be exactly one SELECT over {INPUT_VIEW!r}, "
                f"found statements {kinds}"
            )

    def _invalid(self, error: duckdb.Error) -> OperatorConfigError:
        """DuckDB's message on one line (it points at the error on lines of its own): error messages are
        one line in the CLI, the task's status and the REST API."""
        reason = " ".join(str(error).split())
        return OperatorConfigError(f"operator {self.name!r}: query {self.query!r} is invalid: {reason}")

    def process(self, table: pa.Table, watermark: Watermark) -> pa.Table:
        if self._relation is None and table.num_columns == 0:
            return table
        relation = self._relation if self._relation is not None else self._bind_for(table.schema)
        self._connection.register(INPUT_VIEW, table)
        try:
            # duckdb annotates DuckDBPyRelation.to_arrow_table as returning Any; it returns a pyarrow Table.
            return cast(pa.Table, relation.to_arrow_table())
        except duckdb.Error as exc:
            raise OperatorRuntimeError(f"operator {self.name!r}: query {self.query!r} failed: {exc}") from exc

    def _bind_for(self, schema: pa.Schema) -> duckdb.DuckDBPyRelation:
        self.validate(schema)
        assert self._relation is not None
        return self._relation

    @property
    def state(self) -> KeyedState | None:
        return None
