"""The chain that runs a connector's transform steps in order, every cycle."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from engine.state import KeyedState
from engine.transforms.operator import Operator, OperatorConfigError, OperatorRuntimeError, Watermark
from engine.transforms.sql import SqlOperator


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

    def check_without_schema(self) -> None:
        """What can be checked while the input's schema is unknown (a source that infers it from the
        records): each SQL step's query parses as one SELECT. Without this a typo would pass the start and
        fail every cycle's first rows, restarting the connector until it gave up on a "poison input"."""
        for step in self.steps:
            if isinstance(step, SqlOperator):
                step.check_query()

    def empty_input(self) -> pa.Table:
        """The table for a cycle without rows (watermark only, or the end-of-input flush): no rows of the
        input schema, or no columns while the schema is still unknown."""
        return self.input_schema.empty_table() if self.input_schema is not None else pa.table({})

    def process(self, table: pa.Table, watermark: Watermark) -> pa.Table:
        if self.input_schema is None and table.num_columns:
            self.input_schema = table.schema
        for step in self.steps:
            started = time.perf_counter_ns()
            table = run_step(step, table, watermark)
            self.last_cycle_ns[step.name] = time.perf_counter_ns() - started
        return table

    @property
    def states(self) -> dict[str, KeyedState]:
        """Stateful operators' state by operator name (their names key the changelog topics)."""
        return {step.name: step.state for step in self.steps if step.state is not None}


def run_step(step: Operator, table: pa.Table, watermark: Watermark) -> pa.Table:
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
