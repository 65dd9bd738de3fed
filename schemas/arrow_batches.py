"""Arrow helpers shared by the formats: fitting a batch to a schema, converting nested values, empties."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias, cast

import pyarrow as pa
import pyarrow.compute as pc

from schemas.base import EncodeError

Leaf: TypeAlias = "Callable[[pa.Array[Any], pa.DataType], pa.Array[Any]]"  # quoted: pa.Array is not generic at runtime


def conform_batch(batch: pa.RecordBatch, schema: pa.Schema, *, fmt: str) -> pa.RecordBatch:
    """``batch``'s columns picked by name, in ``schema``'s order, cast (safely) to ``schema``'s types.

    Extra columns are dropped; a missing nullable column becomes all-null. A missing non-nullable column, a
    column name that appears twice, a cast that would lose information or a null in a non-nullable column
    raises ``EncodeError`` naming the column, so what is written always matches the schema.
    """
    columns = []
    for fld in schema:
        positions = batch.schema.get_all_field_indices(fld.name)
        if len(positions) > 1:
            raise EncodeError(f"{fmt} encode: column '{fld.name}' appears {len(positions)} times in the batch")
        if not positions:
            if not fld.nullable:
                raise EncodeError(f"{fmt} encode: the batch has no column '{fld.name}', which the schema requires")
            columns.append(pa.nulls(batch.num_rows, fld.type))
            continue
        column = batch.column(positions[0])
        if not fld.nullable and column.null_count:
            raise EncodeError(f"{fmt} encode: column '{fld.name}' has {column.null_count} null(s) but the "
                              "schema does not allow null")
        columns.append(_cast_column(column, fld, fmt))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _cast_column(column: pa.Array[Any], fld: pa.Field[pa.DataType], fmt: str) -> pa.Array[Any]:
    if column.type == fld.type:
        return column
    try:
        return column.cast(fld.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, ValueError) as exc:
        raise EncodeError(f"{fmt} encode: column '{fld.name}' of type {column.type} cannot be converted to the "
                          f"schema's {fld.type}: {exc}") from exc


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)


def table_to_batch(table: pa.Table) -> pa.RecordBatch:
    """One RecordBatch holding all of ``table``'s rows (Arrow readers return chunked tables)."""
    if table.num_rows == 0:
        return empty_batch(table.schema)
    batches = table.combine_chunks().to_batches()
    return batches[0]


def map_leaves(array: pa.Array[Any], target: pa.DataType, leaf: Leaf) -> pa.Array[Any]:
    """Rebuild ``array`` as type ``target``, converting every non-container child with ``leaf(child, type)``.

    Structs, lists and maps are rebuilt around the converted children with the same nulls, so conversions
    Arrow cannot cast through containers (strings to times, bytes to decimals) still run column-wise.
    """
    if pa.types.is_struct(target):
        struct_children = cast(pa.StructArray, array).flatten()
        children = [map_leaves(child, fld.type, leaf) for child, fld in zip(struct_children, target)]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=_null_mask(array))
    if pa.types.is_map(target):
        offsets, entries = _rebased_children(array)
        keys, items = cast(pa.StructArray, entries).flatten()
        # pyarrow-stubs want int64 offsets and no type= next to keys and items; pyarrow takes int32 and both
        rebuilt: pa.MapArray[Any, Any] = pa.MapArray.from_arrays(  # type: ignore[call-overload]
            offsets, map_leaves(keys, target.key_type, leaf), map_leaves(items, target.item_type, leaf),
            type=target, mask=_null_mask(array))
        return rebuilt
    if pa.types.is_list(target):
        offsets, values = _rebased_children(array)
        return pa.ListArray.from_arrays(offsets, map_leaves(values, target.value_type, leaf), type=target,
                                        mask=_null_mask(array))
    return leaf(array, target)


def map_batch_leaves(batch: pa.RecordBatch, schema: pa.Schema, leaf: Leaf) -> pa.RecordBatch:
    columns = [map_leaves(column, fld.type, leaf) for column, fld in zip(batch.columns, schema)]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def contains_map(arrow_type: pa.DataType) -> bool:
    if pa.types.is_map(arrow_type):
        return True
    if pa.types.is_struct(arrow_type):
        return any(contains_map(fld.type) for fld in arrow_type)
    if pa.types.is_list(arrow_type):
        return contains_map(arrow_type.value_type)
    return False


def _rebased_children(array: pa.Array[Any]) -> tuple[pa.Int32Array, pa.Array[Any]]:
    """Offsets starting at 0 and the child values they index (Arrow refuses sliced offsets with a mask)."""
    lists = cast("pa.ListArray[Any]", array)  # a list or a map column (MapArray is a ListArray)
    offsets = lists.offsets
    start = offsets[0].as_py()
    values = lists.values.slice(start, offsets[-1].as_py() - start)
    return pc.subtract(offsets, pa.scalar(start, offsets.type)), values


def _null_mask(array: pa.Array[Any]) -> pa.BooleanArray | None:
    return array.is_null() if array.null_count else None
