"""What a failed producer call demands, following librdkafka's error classes.

``retriable()`` retries the same call; ``txn_requires_abort()`` is ``EpochAborted`` (the caller aborts,
rewinds to the last committed cut and goes on); fenced is ``ProducerFenced`` and other fatal errors are
``SinkFatal`` (the caller stops, clearly).
"""

from __future__ import annotations

from confluent_kafka import KafkaError

_FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
NOT_AUTHORIZED_CODES = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "WRITE on the topic",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "WRITE on the transactional id",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "READ on the consumer group",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "IDEMPOTENT_WRITE on the cluster",
}
"""What the principal lacks when the broker answers with each authorization error."""


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


class SinkNotAuthorized(SinkFatal):
    """The principal lacks a permission the sink needs: permanent until an operator grants it."""


class SinkTopicMissing(SinkFatal):
    """A topic the sink writes (output or dead letters) does not exist, and the broker does not create topics
    on demand: permanent until an operator creates it."""


class SinkMisconfigured(SinkFatal):
    """An external sink's target cannot take the connector's rows as configured (a server setting, a missing
    table or privilege): permanent until an operator changes it; the message names what to change."""


class CallInterrupted(SinkError):
    """A stop was requested while a call was being retried: nothing was committed by it."""


class CallAbandoned(CallInterrupted):
    """A stop was requested while a librdkafka call was in flight: the call is left to finish on its own
    thread and the producer is not used again. Whether a commit in flight went through, Kafka says at the
    next start (the transaction is the commit point); an open epoch is aborted by its ``init_transactions``."""


def not_authorized(what: str, error: KafkaError) -> SinkNotAuthorized:
    return SinkNotAuthorized(f"{what}: not authorized, the principal needs {NOT_AUTHORIZED_CODES[error.code()]} "
                             f"({error.name()}: {error.str()})")


def classify(error: KafkaError, what: str) -> SinkError | None:
    """Map a librdkafka error to the action it demands; None means retry the same call."""
    if error.code() in NOT_AUTHORIZED_CODES:
        return not_authorized(what, error)
    if error.code() in _FENCED_CODES:
        return ProducerFenced(
            f"{what}: this instance was fenced by a newer one with the same transactional.id ({error.str()}); "
            "stopping so that only one instance writes"
        )
    if error.code() == KafkaError._PREV_IN_PROGRESS:
        return ProducerWedged(f"{what}: the previous attempt of this call never finished inside the producer "
                              f"({error.str()}); restarting with a new producer")
    if error.fatal():
        return SinkFatal(f"{what}: fatal producer error: {error.str()}")
    if error.txn_requires_abort():
        return EpochAborted(f"{what}: the transaction must be aborted: {error.str()}")
    if error.retriable():
        return None
    return SinkError(f"{what}: {error.str()}")
