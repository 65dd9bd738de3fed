"""What every transform step is: an ``Operator`` over whole Arrow tables, and the errors it may raise.

Every operator works on whole Arrow tables: one call to ``process`` per cycle, rows in and rows out. Operators
are checked once at start (``validate``) against the schema they will receive, so a bad query, a bad function
path or a bad window spec stops the connector before it reads anything instead of crashing mid-stream.

Stateful operators (windows) expose a ``KeyedState`` (``engine.state``), kept per source partition: each
checkpoint writes the changed partitions to the operator's changelog topic, and a partition's next owner
restores it from there. SQL and Python operators are stateless: their
output depends on the cycle's rows only, which is what makes replaying an aborted epoch produce the same
output.

Before an operator has seen a schema (no ``validate``, no rows yet), a cycle may carry a table without
columns (a watermark-only cycle): stateless operators pass it through unchanged, since there is nothing to
compute and no schema to bind a query or probe a function with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import pyarrow as pa

from engine.state import KeyedState

Watermark = int | Mapping[int, int] | None
"""Event time in epoch ms that has surely passed: one for every partition (an int, e.g. the end-of-input
flush), or per source partition (what a running connector passes: each partition's own progress), or None
before any is known."""


class OperatorConfigError(ValueError):
    """A query, function path or window spec cannot work: found at start, names the operator and the problem."""


class OperatorRuntimeError(RuntimeError):
    """A cycle failed inside an operator; the message names the operator."""


class Operator(Protocol):
    name: str

    def validate(self, input_schema: pa.Schema) -> pa.Schema:
        """Check the operator against the schema it will receive; return the schema it will emit."""
        ...

    def process(self, table: pa.Table, watermark: Watermark) -> pa.Table:
        """One cycle: the cycle's rows in, the rows to emit out (possibly none). Watermark in epoch ms."""
        ...

    @property
    def state(self) -> KeyedState | None: ...
