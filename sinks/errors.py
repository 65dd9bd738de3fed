"""What a failed producer call demands, following librdkafka's error classes.

``retriable()`` retries the same call; ``txn_requires_abort()`` is ``EpochAborted`` (the caller aborts,
rewinds to the last committed cut and goes on); fenced is ``ProducerFenced`` and other fatal errors are
``SinkFatal`` (the caller stops, clearly).
"""

from __future__ import annotations

from confluent_kafka import KafkaError

_FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


class SinkError(RuntimeError):
    """The sink could not deliver; the message names the topic and the Kafka error."""


class EpochAborted(SinkError):
    """The open transaction must be aborted (librdkafka ``txn_requires_abort``); the epoch is abandoned."""


class ProducerFenced(SinkError):
    """Another instance with the same transactional.id took over; this one must stop."""


class SinkFatal(SinkError):
    """The producer hit a fatal error and cannot be used again."""


class ProducerWedged(SinkFatal):
    """A librdkafka call did not return in time; the producer is abandoned, not used again."""


def classify(error: KafkaError, what: str) -> SinkError | None:
    """Map a librdkafka error to the action it demands; None means retry the same call."""
    if error.code() in _FENCED_CODES:
        return ProducerFenced(
            f"{what}: this instance was fenced by a newer one with the same transactional.id ({error.str()}); "
            "stopping so that only one instance writes"
        )
    if error.fatal():
        return SinkFatal(f"{what}: fatal producer error: {error.str()}")
    if error.txn_requires_abort():
        return EpochAborted(f"{what}: the transaction must be aborted: {error.str()}")
    if error.retriable():
        return None
    return SinkError(f"{what}: {error.str()}")
