"""Re-keying rows through a repartition topic, so each window key meets in one partition and one instance.

Why: keyed state lives with its source partition (``engine.state.KeyedState``), and rows of one Kafka key
share a partition, but a window keyed by other columns sees its keys spread over every partition, and so
over every instance of the connector. Such a connector runs in two stages, like a Kafka Streams topology
with a ``groupBy``: the steps before the window run on the source's rows; their output is written, keyed by
the window key, to ``<connector>-repartition`` inside the epoch's transaction; the same group reads that
topic as a second source, and the window (and what follows it) runs on those rows.

- **Which partition:** DuckDB's ``hash`` of the window key columns modulo the partition count (the
  source's), computed for a whole batch at once. Every instance of a connector must run the same epochline
  version, so that one key always lands on one partition.
- **What a record holds:** one Arrow IPC stream of the rows for one partition per cycle (``arrow-ipc``),
  with the Kafka timestamp and key of each row carried in two internal columns and put back on the other
  side, so event time and ``__kafka_key`` mean what they meant in the source. ``__kafka_partition`` and
  ``__kafka_offset`` after the repartition are those of the repartition topic: window state is keyed by it.
- **Event time:** the repartition source has a watermark of its own, with the source's allowed lateness and
  idle timeout, and the window judges its rows by it: per repartition partition, its largest event time
  minus the allowed lateness (``connectors.watermarks``). Rows of many source partitions interleave there,
  so the source's partitions are read aligned by event time (``connectors.alignment``): with one instance
  they arrive in order. Instances of a group read at their own speeds, so their rows do not: allow lateness
  for it. A row behind it is late (dead-lettered as the ``arrow-ipc`` record of that row, or dropped, as
  ``late_rows`` says).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from connectors.metadata import KEY, TIMESTAMP, is_metadata_column, with_metadata_fields
from engine.transforms.chain import OperatorChain
from engine.transforms.database import duckdb_connection, open_database_soon
from engine.transforms.operator import Operator, OperatorConfigError
from engine.transforms.windows import WindowOperator
from schemas.arrow_ipc import ArrowIpcFormat

CARRIED_TIMESTAMP = "__epochline_kafka_timestamp"
CARRIED_KEY = "__epochline_kafka_key"
_PARTITION = "__epochline_partition"


@dataclass(frozen=True)
class Stages:
    """The chain split where rows must be re-keyed: ``before`` runs on the source's rows, ``after`` (the
    window first) on the repartitioned ones."""

    before: OperatorChain
    after: OperatorChain
    key: list[str]


def split_for_repartition(chain: OperatorChain) -> Stages | None:
    """The stages of a chain whose first window is keyed by something other than the Kafka key; None when
    every keyed operator already sees each of its keys in one partition."""
    windows = [index for index, step in enumerate(chain.steps) if isinstance(step, WindowOperator)]
    if not windows:
        return None
    first = chain.steps[windows[0]]
    assert isinstance(first, WindowOperator)
    if KEY in first.spec.key:
        return None
    _refuse_later_windows(chain.steps[windows[0] + 1:], first)
    open_database_soon()  # every cycle's split hashes the key in DuckDB
    return Stages(OperatorChain(chain.steps[:windows[0]]), OperatorChain(chain.steps[windows[0]:]),
                  list(first.spec.key))


def _refuse_later_windows(steps: Sequence[Operator], first: WindowOperator) -> None:
    for step in steps:
        if isinstance(step, WindowOperator):
            raise OperatorConfigError(
                f"operator {step.name!r}: a second window after the repartitioned {first.name!r} would need its "
                "own repartition; epochline repartitions once per connector: chain a second connector instead")


def carried(table: pa.Table) -> pa.Table:
    """Rows as they go into the repartition topic: value columns, plus each row's Kafka timestamp and key
    under internal names (the other Kafka metadata columns belong to the source record and are dropped)."""
    values = table.select([name for name in table.column_names if not is_metadata_column(name)])
    if TIMESTAMP in table.column_names:
        values = values.append_column(CARRIED_TIMESTAMP, table.column(TIMESTAMP))
    if KEY in table.column_names:
        values = values.append_column(CARRIED_KEY, table.column(KEY))
    return values


def restored(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A repartitioned batch with each row's source timestamp and key back in ``__kafka_timestamp`` and
    ``__kafka_key`` (the repartition record's own are replaced)."""
    names = batch.schema.names
    columns = {name: batch.column(name) for name in names}
    for carried_name, metadata_name in ((CARRIED_TIMESTAMP, TIMESTAMP), (CARRIED_KEY, KEY)):
        if carried_name in columns:
            original = columns.pop(carried_name)
            columns[metadata_name] = original.cast(batch.schema.field(metadata_name).type)
    return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))


def repartitioned_schema(before_output: pa.Schema) -> pa.Schema:
    """What the ``after`` stage receives when ``before`` emits ``before_output``."""
    values = pa.schema([field for field in before_output if not is_metadata_column(field.name)])
    return with_metadata_fields(values)


def ipc_record(table: pa.Table) -> bytes:
    """One repartition record: the rows as one Arrow IPC stream (``schemas.arrow_ipc``)."""
    [payload] = ArrowIpcFormat().encode(table.combine_chunks().to_batches()[0])
    assert payload is not None
    return payload


def split_by_key(table: pa.Table, key: list[str], partitions: int) -> dict[int, pa.Table]:
    """Rows grouped by the repartition partition their key hashes to."""
    missing = [column for column in key if column not in table.column_names]
    if missing:
        raise OperatorConfigError(f"repartition: the rows before the window have no column(s) {missing} "
                                  f"of the window key; they have {table.column_names}")
    expression = ", ".join(f'"{column}"' for column in key)
    connection = duckdb_connection()
    try:
        connection.register("keys", table.select(key))
        hashed = connection.sql(f"SELECT (hash({expression}) % {partitions})::INTEGER AS {_PARTITION} "
                                "FROM keys").to_arrow_table()
    finally:
        connection.close()
    target = hashed.column(_PARTITION)
    split: dict[int, pa.Table] = {}
    for partition in pc.unique(target).to_pylist():
        split[int(partition)] = table.filter(pc.equal(target, pa.scalar(partition, pa.int32())))
    return split
