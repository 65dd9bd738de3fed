"""Python steps: a user function ``package.module:function`` called with each cycle's rows."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pyarrow as pa

from engine.state import KeyedState
from engine.transforms.operator import OperatorConfigError, OperatorRuntimeError, Watermark


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
                f"operator {self.name!r}: {self.target!r} fails on an empty batch of the input schema: "
                f"{exc.__cause__ or exc}"
            ) from exc
        self._output_schema = result.schema
        return result.schema

    def process(self, table: pa.Table, watermark: Watermark) -> pa.Table:
        expected = self._output_schema
        if expected is None:
            if table.num_columns == 0:
                return table
            expected = self.validate(table.schema)
        result = self._call(table)
        if not result.schema.equals(expected):
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
    def state(self) -> KeyedState | None:
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
