"""The Kafka metadata columns every source batch carries beside the decoded value columns.

One place names them: the source adds them, watermarks and windows read the partition and timestamp, the
engine turns rows back into dead letters with them, and sinks drop them unless a config keeps them. Per
partition maxima over a batch (``maxima_by_partition``: a fetch's next offsets, its largest event times) are
computed here once for both.
"""

from __future__ import annotations

from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc

PREFIX = "__kafka_"
PARTITION = "__kafka_partition"
OFFSET = "__kafka_offset"
TIMESTAMP = "__kafka_timestamp"
KEY = "__kafka_key"

METADATA_FIELDS = (
    pa.field(PARTITION, pa.int32(), nullable=False),
    pa.field(OFFSET, pa.int64(), nullable=False),
    pa.field(TIMESTAMP, pa.timestamp("ms", tz="UTC")),
    pa.field(KEY, pa.binary()),
)
METADATA_COLUMNS = tuple(field.name for field in METADATA_FIELDS)


def is_metadata_column(name: str) -> bool:
    return name.startswith(PREFIX)


def value_columns(names: list[str]) -> list[str]:
    """The column names that are not Kafka metadata, in their order."""
    return [name for name in names if not is_metadata_column(name)]


def with_metadata_fields(value_schema: pa.Schema) -> pa.Schema:
    """The schema of the rows a cycle sees: the value columns, then the metadata columns."""
    schema = pa.schema([*value_schema, *METADATA_FIELDS])
    return schema.with_metadata(value_schema.metadata) if value_schema.metadata else schema


MASKED_MAXIMA_LIMIT = 32
"""Up to this many partitions in one batch, ``maxima_by_partition`` takes one numpy mask per partition; above
it, Arrow's grouped aggregation (Acero), whose cost does not grow with the partitions."""


def maxima_by_partition(partitions: pa.Array[Any], values: pa.Array[Any]) -> dict[int, int]:
    """Per partition, the largest non-null integer of ``values`` on its rows (``partitions[i]`` is row i's);
    a partition whose values are all null is left out.

    Why masks: with up to 32 partitions in a batch, a numpy mask per partition costs 0.2-0.8 ms at 25,000
    rows against Acero's 1.0-1.1 ms (1.9 against 2.4 ms at 100,000 rows and 32 partitions), and needs no
    import: ``pyarrow.acero`` loads at its first use, 20-30 ms of a connector's first cycle, and
    ``numpy.unique`` loads ``numpy.ma`` (18-48 ms). Above that many partitions the masks lose (6.3 against
    3.1 ms at 100,000 rows and 128 partitions), so Acero counts them (bench/README.md, "Start-up, phase by phase").
    """
    present = cast(list[int], pc.unique(partitions).to_pylist())
    if len(present) > MASKED_MAXIMA_LIMIT:
        table = pa.table({"partition": partitions, "value": values})
        maxima = table.group_by("partition").aggregate([("value", "max")])
        grouped = cast(list[int], maxima["partition"].to_pylist())
        return {p: v for p, v in zip(grouped, cast(list[int | None], maxima["value_max"].to_pylist()))
                if v is not None}
    keys = partitions.to_numpy(zero_copy_only=False)
    numbers = values.fill_null(pa.scalar(0, values.type)).to_numpy(zero_copy_only=False)
    valid = values.is_valid().to_numpy(zero_copy_only=False) if values.null_count else None
    result: dict[int, int] = {}
    for partition in present:
        rows = keys == partition
        if valid is not None:
            rows &= valid
        if rows.any():
            result[partition] = int(numbers[rows].max())
    return result
