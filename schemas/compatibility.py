"""Whether a sink format can write the columns a pipeline produces: checked on the schemas, before a record is
read, so a pairing that could never write a row is a config error naming the column, not a failure at the
first epoch.

What each format writes (the README's "Types across formats" table):

- ``json`` without a schema writes every Arrow type ``schemas.json_wire`` gives a JSON form (maps, bytes,
  decimals, dates, times and timestamps included); durations, intervals, unions and dictionaries are refused.
- a format with a schema (``json`` with one, ``avro``, ``avro-confluent``, ``protobuf-confluent``,
  ``json-confluent``) writes each column of its schema from the output column of the same name, converted
  as ``schemas.arrow_batches.conform_batch`` converts it (an Arrow cast): refused are a column the schema
  requires and the output lacks, and a column whose type Arrow cannot convert to the schema's at all
  (a struct to a string, a list to a number, ...). Conversions that depend on the value (a string to a
  number, an int64 to an Avro int, a name to an enum) are decided per record at run time: a record that
  does not fit is dead-lettered with the reason.
- ``raw`` writes the ``value`` column, which must be bytes or text.
- ``arrow-ipc`` writes any Arrow type.
- ``avro-confluent`` with neither a schema file nor a ``schema_id`` has nothing to write with.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from schemas.base import Format
from schemas.json_wire import unsupported_type
from schemas.raw import VALUE_COLUMN

_CAST_REFUSALS = (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError)


@dataclass(frozen=True)
class TypeProblem:
    """A column (``address.zip``, ``tags[]``, ``counts{value}``) the sink format cannot write, and why."""

    column: str
    reason: str

    def __str__(self) -> str:
        return f"column {self.column}: {self.reason}"


def sink_problems(columns: pa.Schema, sink: Format) -> list[TypeProblem]:
    """Every column of ``columns`` (what the sink is given to write) the ``sink`` format cannot write."""
    if sink.name == "raw":
        return _raw_problems(columns)
    target = sink.arrow_schema
    if target is None:
        if sink.name == "json":
            return _json_problems(columns)
        if sink.name == "arrow-ipc":
            return []
        return [TypeProblem("*", f"the {sink.name} format has no schema to write with: give it a schema file "
                                 "or a schema_id")]
    return _conform_problems(columns, target, sink.name)


def _raw_problems(columns: pa.Schema) -> list[TypeProblem]:
    if VALUE_COLUMN not in columns.names:
        return [TypeProblem(VALUE_COLUMN, f"the raw format writes the '{VALUE_COLUMN}' column, and the output has "
                                          f"none (it has {', '.join(columns.names) or 'no columns'})")]
    kind = columns.field(VALUE_COLUMN).type
    if not _is_bytes_or_text(kind):
        return [TypeProblem(VALUE_COLUMN, f"the raw format writes bytes or text, and the column is {kind}")]
    return []


def _is_bytes_or_text(kind: pa.DataType) -> bool:
    return (pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_string(kind)
            or pa.types.is_large_string(kind))


def _json_problems(columns: pa.Schema) -> list[TypeProblem]:
    problems = []
    for fld in columns:
        found = unsupported_type(fld.type, fld.name, writing=True)
        if found is not None:
            problems.append(TypeProblem(found.path, f"{found.arrow_type} has no JSON representation"))
    return problems


def _conform_problems(columns: pa.Schema, target: pa.Schema, fmt: str) -> list[TypeProblem]:
    problems = []
    for fld in target:
        if fld.name not in columns.names:
            if not fld.nullable:
                problems.append(TypeProblem(fld.name, f"the {fmt} schema requires it and the output has no such "
                                                      "column"))
            continue
        problem = _cast_problem(columns.field(fld.name).type, fld.type, fld.name, fmt)
        if problem is not None:
            problems.append(problem)
    return problems


def _cast_problem(source: pa.DataType, target: pa.DataType, path: str, fmt: str) -> TypeProblem | None:
    """Why no value of ``source`` converts to ``target`` (named at the deepest field that does not), or None
    when Arrow converts the type (each value may still not fit). Structs, lists and maps are followed into
    their fields here: Arrow checks a struct's fields only where it has values."""
    if source == target:
        return None
    if pa.types.is_struct(source) and pa.types.is_struct(target):
        names = [child.name for child in source]
        found = (_cast_problem(source.field(child.name).type, child.type, f"{path}.{child.name}", fmt)
                 for child in target if child.name in names)
        return next((problem for problem in found if problem is not None), None)
    if pa.types.is_map(source) and pa.types.is_map(target):
        return (_cast_problem(source.key_type, target.key_type, f"{path}{{key}}", fmt)
                or _cast_problem(source.item_type, target.item_type, f"{path}{{value}}", fmt))
    if pa.types.is_list(source) and pa.types.is_list(target):
        return _cast_problem(source.value_type, target.value_type, f"{path}[]", fmt)
    if _casts(source, target):
        return None
    return TypeProblem(path, f"{source} cannot be written as the {fmt} schema's {target}")


def _casts(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether Arrow has a conversion from ``source`` to ``target`` (tried on one null: a type check)."""
    try:
        pa.array([None], source).cast(target)
    except _CAST_REFUSALS:
        return False
    return True
