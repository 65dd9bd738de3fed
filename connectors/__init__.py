"""Kafka source connectors: a topic's partitions read into Arrow record batches, positions as SourceCheckpoints.

- ``source``: ``KafkaSource`` (read_committed batches, an exact cut, committed offsets);
- ``checkpoint``: ``SourceCheckpoint``, a source's cut (partition -> next offset);
- ``metadata``: the ``__kafka_*`` columns every batch carries;
- ``offset_metadata``: what a committed offset's metadata string says (checkpoint id, batch item);
- ``watermarks``: event-time watermarks and late rows;
- ``dead_letter``: records that could not be processed, with their reason;
- ``admin``: topics and partition offsets.

Nothing here imports the engine: sources know Kafka, Arrow and the wire formats (``schemas``), not the
protocol that drives them.
"""

from connectors.admin import (
    KafkaUnreachable,
    TopicAdminError,
    check_connection,
    create_topic,
    end_offsets,
    partitions_of,
)
from connectors.checkpoint import CheckpointFormatError, SourceCheckpoint
from connectors.dead_letter import DeadLetter, PoisonRecord
from connectors.offset_metadata import MalformedOffsetMetadata
from connectors.source import (
    KafkaSource,
    SourceBatch,
    SourceError,
    SourceNotAuthorized,
    SourceSettings,
    SourceUnavailable,
    TopicMissing,
)
from connectors.watermarks import EventTimeError, WatermarkTracker, filter_late_rows

__all__ = [
    "CheckpointFormatError",
    "DeadLetter",
    "EventTimeError",
    "KafkaSource",
    "KafkaUnreachable",
    "MalformedOffsetMetadata",
    "PoisonRecord",
    "SourceBatch",
    "SourceCheckpoint",
    "SourceError",
    "SourceNotAuthorized",
    "SourceSettings",
    "SourceUnavailable",
    "TopicAdminError",
    "TopicMissing",
    "WatermarkTracker",
    "check_connection",
    "create_topic",
    "end_offsets",
    "filter_late_rows",
    "partitions_of",
]
