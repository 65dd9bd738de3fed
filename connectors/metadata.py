"""The Kafka metadata columns every source batch carries beside the decoded value columns.

One place names them: the source adds them, watermarks and windows read the partition and timestamp, the
engine turns rows back into dead letters with them, and sinks drop them unless a config keeps them.
"""

from __future__ import annotations

import pyarrow as pa

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
