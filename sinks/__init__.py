"""Sinks: transactional Kafka producers, the commit point of every checkpoint epoch.

- ``transactional``: exactly-once, one Kafka transaction per epoch with the offsets inside it;
- ``at_least_once``: an idempotent producer, offsets committed after delivery;
- ``writer``: the ``Sink`` protocol, ``SinkSettings`` and the encoder/producer both share;
- ``errors`` and ``calls``: librdkafka's error classes and how blocking calls are retried and bounded;
- ``produce``: producing without dropping a record when the client's queue is full.

Nothing here imports the engine; what the engine wants run inside the commit (a crash-test hook) is
passed in (``before_commit``).
"""

from sinks.at_least_once import AtLeastOnceKafkaSink
from sinks.errors import (
    CallAbandoned,
    CallInterrupted,
    EpochAborted,
    ProducerFenced,
    ProducerWedged,
    SinkError,
    SinkFatal,
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
    "KafkaWriter",
    "OffsetCommit",
    "OutgoingRecord",
    "Produced",
    "ProducerFenced",
    "ProducerWedged",
    "Sink",
    "SinkError",
    "SinkFatal",
    "SinkNotAuthorized",
    "SinkSettings",
    "SinkTopicMissing",
    "TransactionalKafkaSink",
    "Unwritten",
    "encode_rows",
    "produce_all",
    "produce_waiting",
]
