"""Sinks: transactional Kafka producers, the commit point of every checkpoint epoch.

- ``transactional``: exactly-once, one Kafka transaction per epoch with the offsets inside it;
- ``at_least_once``: an idempotent producer, offsets committed after delivery;
- ``writer``: the ``Sink`` protocol, ``SinkSettings`` and the encoder/producer both share;
- ``errors`` and ``calls``: librdkafka's error classes and how blocking calls are retried and bounded;
- ``produce``: producing without dropping a record when the client's queue is full;
- ``api``: the public API of sinks beyond Kafka (``ExternalSink``, two-phase commit behind the Kafka
  transaction) and how their plugins are found; ``postgres``: the PostgreSQL one.

Nothing here imports the engine; what the engine wants run inside the commit (a crash-test hook) is
passed in (``before_commit``).
"""

from sinks.api import ExternalSink, Guarantee, RefusedRow, SinkAssignment, SinkPlugin, SinkSettingsError, sink_plugin
from sinks.at_least_once import AtLeastOnceKafkaSink
from sinks.errors import (
    CallAbandoned,
    CallInterrupted,
    EpochAborted,
    ProducerFenced,
    ProducerWedged,
    SinkError,
    SinkFatal,
    SinkMisconfigured,
    SinkNotAuthorized,
    SinkTopicMissing,
)
from sinks.produce import produce_all, produce_waiting
from sinks.transactional import TransactionalKafkaSink
from sinks.writer import (
    EncodedRows,
    KafkaWriter,
    OffsetCommit,
    OutgoingRecord,
    Produced,
    Sink,
    SinkSettings,
    Unwritten,
    encode_rows,
)

__all__ = [
    "AtLeastOnceKafkaSink",
    "CallAbandoned",
    "CallInterrupted",
    "EncodedRows",
    "EpochAborted",
    "ExternalSink",
    "Guarantee",
    "KafkaWriter",
    "OffsetCommit",
    "OutgoingRecord",
    "Produced",
    "ProducerFenced",
    "ProducerWedged",
    "RefusedRow",
    "Sink",
    "SinkAssignment",
    "SinkError",
    "SinkFatal",
    "SinkMisconfigured",
    "SinkNotAuthorized",
    "SinkPlugin",
    "SinkSettings",
    "SinkSettingsError",
    "SinkTopicMissing",
    "TransactionalKafkaSink",
    "Unwritten",
    "encode_rows",
    "produce_all",
    "produce_waiting",
    "sink_plugin",
]
