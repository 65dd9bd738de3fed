"""The engine's operators: SQL (DuckDB), Python functions, and the chain that runs them every cycle.

Every operator works on whole Arrow tables: one call to ``process`` per cycle, rows in and rows out. Operators
are checked once at start (``validate``) against the schema they will receive, so a bad query, a bad function
path or a bad window spec stops the connector before it reads anything instead of crashing mid-stream.

Stateful operators (windows, defined in ``engine.windows`` and importable from here too) expose an
``OperatorState``; the checkpoint coordinator snapshots it at each checkpoint and restores it on recovery.
SQL and Python operators are stateless: their output depends on the cycle's rows only, which is what makes
replaying an aborted epoch produce the same output.

Before an operator has seen a schema (no ``validate``, no rows yet), a cycle may carry a table without
columns (a watermark-only cycle): stateless operators pass it through unchanged, since there is nothing to
compute and no schema to bind a query or probe a function with.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import duckdb
import pyarrow as pa

log = logging.getLogger(__name__)

INPUT_VIEW = "input"
"""The name a SQL query reads the cycle's rows from."""


class OperatorConfigError(ValueError):
    """A query, function path or window spec cannot work: found at start, names the operator and the problem."""


class OperatorRuntimeError(RuntimeError):
    """A cycle failed inside an operator; the message names the operator."""


@runtime_checkable
class OperatorState(Protocol):
    """Checkpointable state: the same shape the checkpoint coordinator stores and restores."""

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


class Operator(Protocol):
    name: str

    def validate(self, input_schema: pa.Schema) -> pa.Schema:
        """Check the operator against the schema it will receive; return the schema it will emit."""
        ...

    def process(self, table: pa.Table, watermark: int | None) -> pa.Table:
        """One cycle: the cycle's rows in, the rows to emit out (possibly none). Watermark in epoch ms."""
        ...

    @property
    def state(self) -> OperatorState | None: ...


class SqlOperator:
    """Runs one DuckDB query over each cycle's rows, visible to the query as the table ``input``.

    One DuckDB connection per operator, and the query is bound once into a relation: DuckDB 2.0 relations
    run their query again on every read, resolving ``input`` to whatever is registered at that moment. So a
    cycle costs one ``register`` of the Arrow table (zero-copy) plus one run of the already bound query,
    not a parse and bind per cycle. The connection keeps a reference to the last cycle's table until the
    next cycle replaces it.
    """

    def __init__(self, query: str, name: str = "sql") -> None:
        self.name = name
        self.query = query
        self._connection = duckdb.connect()
        self._relation: duckdb.DuckDBPyRelation | None = None
        self._output_schema: pa.Schema | None = None

    def validate(self, input_schema: pa.Schema) -> pa.Schema:
        """Bind and run the query over an empty table of ``input_schema``: unknown columns, syntax errors
        and type errors surface here as ``OperatorConfigError`` carrying DuckDB's message."""
        self._connection.register(INPUT_VIEW, input_schema.empty_table())
        try:
            self._require_one_select()
            relation = self._connection.sql(self.query)
            self._output_schema = relation.to_arrow_table().schema
        except duckdb.Error as exc:
            raise OperatorConfigError(f"operator {self.name!r}: query {self.query!r} is invalid: {exc}") from exc
        self._relation = relation
        return self._output_schema

    def _require_one_select(self) -> None:
        """Only a single read-only query is re-runnable per cycle; DuckDB would run any other statement once."""
        statements = self._connection.extract_statements(self.query)
        if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
            kinds = [statement.type.name for statement in statements]
            raise OperatorConfigError(
                f"operator {self.name!r}: query {self.query!r} must be exactly one SELECT over {INPUT_VIEW!r}, "
                f"found statements {kinds}"
            )

    def process(self, table: pa.Table, watermark: int | None) -> pa.Table:
        if self._relation is None and table.num_columns == 0:
            return table
        relation = self._relation if self._relation is not None else self._bind_for(table.schema)
        self._connection.register(INPUT_VIEW, table)
        try:
            return relation.to_arrow_table()
        except duckdb.Error as exc:
            raise OperatorRuntimeError(f"operator {self.name!r}: query {self.query!r} failed: {exc}") from exc

    def _bind_for(self, schema: pa.Schema) -> duckdb.DuckDBPyRelation:
        self.validate(schema)
        assert self._relation is not None
        return self._relation

    @property
    def state(self) -> OperatorState | None:
        return None


def load_function(target: str, operator_name: str) -> Callable[..., object]:
    """Import ``"package.module:function"`` (the part after ':' may be dotted, e.g. ``Class.method``)."""
    module_name, sep, attribute_path = target.partition(":")
    if not sep or not module_name or not attribute_path:
        raise OperatorConfigError(
            f"operator {operator_name!r}: function path {target!r} must look like 'package.module:function'"
        )
    try:
        found: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise OperatorConfigError(
            f"operator {operator_name!r}: cannot import module {module_name!r} of {target!r}: {exc}"
        ) from exc
    for attribute in attribute_path.split("."):
        try:
            found = getattr(found, attribute)
        except AttributeError as exc:
            raise OperatorConfigError(
                f"operator {operator_name!r}: {target!r} has no attribute {attribute!r}"
            ) from exc
    if not callable(found):
        raise OperatorConfigError(
            f"operator {operator_name!r}: {target!r} is a {type(found).__name__}, not a callable"
        )
    return found


class PythonOperator:
    """Calls a user function once per cycle with the cycle's rows as one ``pa.RecordBatch``.

    The function returns a ``pa.RecordBatch`` or a ``pa.Table`` (any number of rows). Its output schema is
    learned at start by calling it on an empty batch of the input schema, so the function must accept an
    empty batch; every later result must have that schema, or the cycle fails (the sink was set up for it).
    """

    def __init__(self, target: str, name: str = "python") -> None:
        self.name = name
        self.target = target
        self._function = load_function(target, name)
        self._output_schema: pa.Schema | None = None

    def validate(self, input_schema: pa.Schema) -> pa.Schema:
        empty = input_schema.empty_table()
        try:
            result = self._call(empty)
        except OperatorRuntimeError as exc:
            raise OperatorConfigError(
                f"operator {self.name!r}: {self.target!r} fails on an empty batch of the input schema: {exc.__cause__ or exc}"
            ) from exc
        self._output_schema = result.schema
        return result.schema

    def process(self, table: pa.Table, watermark: int | None) -> pa.Table:
        if self._output_schema is None:
            if table.num_columns == 0:
                return table
            self.validate(table.schema)
        result = self._call(table)
        if not result.schema.equals(self._output_schema):
            raise OperatorRuntimeError(
                f"operator {self.name!r}: {self.target!r} returned schema {result.schema} "
                f"but at start it returned {self._output_schema}"
            )
        return result

    def _call(self, table: pa.Table) -> pa.Table:
        batch = as_single_batch(table)
        try:
            result = self._function(batch)
        except Exception as exc:
            raise OperatorRuntimeError(
                f"operator {self.name!r}: {self.target!r} raised {type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(result, pa.RecordBatch):
            return pa.Table.from_batches([result])
        if isinstance(result, pa.Table):
            return result
        raise OperatorRuntimeError(
            f"operator {self.name!r}: {self.target!r} returned {type(result).__name__}, "
            "expected pyarrow.RecordBatch or pyarrow.Table"
        )

    @property
    def state(self) -> OperatorState | None:
        return None


def as_single_batch(table: pa.Table) -> pa.RecordBatch:
    """The table's rows as one record batch (a copy only when the table has several chunks)."""
    combined = table.combine_chunks()
    batches = combined.to_batches()
    if len(batches) == 1:
        return batches[0]
    return pa.RecordBatch.from_arrays(
        [pa.array([], type=column.type) for column in combined.schema], schema=combined.schema
    )


@dataclass
class OperatorChain:
    """Runs operators in order every cycle; each one's output is the next one's input.

    ``last_cycle_ns`` holds how long each operator took in the last ``process`` call, by operator name, for
    the per-phase metrics.
    """

    steps: tuple[Operator, ...]
    last_cycle_ns: dict[str, int] = field(default_factory=dict)
    input_schema: pa.Schema | None = None
    """The schema given to ``validate``, else that of the first table with columns ``process`` received."""

    def validate(self, input_schema: pa.Schema) -> pa.Schema:
        self.input_schema = input_schema
        schema = input_schema
        for step in self.steps:
            schema = step.validate(schema)
        return schema

    def empty_input(self) -> pa.Table:
        """The table for a cycle without rows (watermark only, or the end-of-input flush): no rows of the
        input schema, or no columns while the schema is still unknown."""
        return self.input_schema.empty_table() if self.input_schema is not None else pa.table({})

    def process(self, table: pa.Table, watermark: int | None) -> pa.Table:
        if self.input_schema is None and table.num_columns:
            self.input_schema = table.schema
        for step in self.steps:
            started = time.perf_counter_ns()
            table = run_step(step, table, watermark)
            self.last_cycle_ns[step.name] = time.perf_counter_ns() - started
        return table

    @property
    def states(self) -> dict[str, OperatorState]:
        return {step.name: step.state for step in self.steps if step.state is not None}


def run_step(step: Operator, table: pa.Table, watermark: int | None) -> pa.Table:
    """One operator's cycle; anything it raises leaves as ``OperatorRuntimeError`` naming the operator."""
    try:
        result = step.process(table, watermark)
    except OperatorRuntimeError:
        raise
    except Exception as exc:
        raise OperatorRuntimeError(f"operator {step.name!r} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(result, pa.Table):
        raise OperatorRuntimeError(
            f"operator {step.name!r} returned {type(result).__name__}, expected pyarrow.Table"
        )
    return result


def build_chain(steps: Sequence[Operator]) -> OperatorChain:
    """A chain over ``steps``; operator names must be unique because checkpointed state is keyed by them."""
    seen: set[str] = set()
    for step in steps:
        if step.name in seen:
            raise OperatorConfigError(
                f"operator name {step.name!r} is used twice; names key checkpointed state and must be unique"
            )
        seen.add(step.name)
    return OperatorChain(tuple(steps))
