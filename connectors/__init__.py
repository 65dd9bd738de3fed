"""Kafka source connectors: a topic's partitions read into Arrow record batches, positions as SourceCheckpoints.

- ``source``: ``KafkaSource`` (read_committed batches, an exact cut, committed offsets);
- ``fetched``: what its consumer fetched as Arrow columns (``RecordColumns``), and the two ways to fetch;
- ``native_io`` (C: ``_native_io.c``): records moved between librdkafka and Arrow buffers with no Python object
  per record, used by sources and the exactly-once sink when it was built;
- ``checkpoint``: ``SourceCheckpoint``, a source's cut (partition -> next offset);
- ``metadata``: the ``__kafka_*`` columns every batch carries;
- ``offset_metadata``: what a committed offset's metadata string says (checkpoint id, batch item);
- ``batch``: ``SourceBatch``, what one poll hands the engine;
- ``watermarks``: event-time watermarks (stream time per partition) and late rows;
- ``alignment``: a backlog handed out in event-time order across a source's partitions;
- ``dead_letter``: records that could not be processed, with their reason;
- ``admin``: topics and partition offsets;
- ``changelog``: changelog topics of keyed state (one state record per source partition) and their reader.

Nothing here imports the engine: sources know Kafka, Arrow and the wire formats (``schemas``), not the
protocol that drives them.
"""

from connectors.admin import (
    KafkaUnreachable,
    TopicAdminError,
    TopicMismatch,
    TopicNotAuthorized,
    check_connection,
    create_topic,
    create_topics,
    end_offsets,
    ensure_topic,
    partitions_of,
)
from connectors.batch import SourceBatch
from connectors.changelog import (
    ChangelogEntry,
    ChangelogError,
    ChangelogReader,
    ChangelogRecordInvalid,
    ChangelogTimeout,
    RestoreRead,
    StateRecord,
    changelog_topic,
    repartition_topic,
    state_record,
)
from connectors.checkpoint import CheckpointFormatError, SourceCheckpoint
from connectors.dead_letter import DeadLetter, PoisonRecord
from connectors.offset_metadata import MalformedOffsetMetadata
from connectors.source import (
    KafkaSource,
    SourceError,
    SourceNotAuthorized,
    SourceSettings,
    SourceUnavailable,
    TopicMissing,
)
from connectors.watermarks import EventTimeError, EventTimeJudgement, WatermarkTracker, judge_event_time

__all__ = [
    "ChangelogEntry",
    "ChangelogError",
    "ChangelogReader",
    "ChangelogRecordInvalid",
    "ChangelogTimeout",
    "CheckpointFormatError",
    "DeadLetter",
    "EventTimeError",
    "EventTimeJudgement",
    "KafkaSource",
    "KafkaUnreachable",
    "MalformedOffsetMetadata",
    "PoisonRecord",
    "RestoreRead",
    "SourceBatch",
    "SourceCheckpoint",
    "SourceError",
    "SourceNotAuthorized",
    "SourceSettings",
    "SourceUnavailable",
    "StateRecord",
    "TopicAdminError",
    "TopicMismatch",
    "TopicMissing",
    "TopicNotAuthorized",
    "WatermarkTracker",
    "changelog_topic",
    "check_connection",
    "create_topic",
    "create_topics",
    "end_offsets",
    "ensure_topic",
    "judge_event_time",
    "partitions_of",
    "repartition_topic",
    "state_record",
]
