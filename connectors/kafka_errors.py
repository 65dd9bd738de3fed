"""librdkafka's errors as sentences for people: what failed, on which broker, and what to do.

A ``KafkaException`` formatted as it is prints ``KafkaError{code=UNKNOWN_TOPIC_OR_PART,val=3,str="..."}``;
every message epochline shows that carries a Kafka error goes through ``kafka_error_text`` instead (and a
missing topic through ``missing_topic_text``), so the same failure reads the same wherever it surfaces.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

MISSING_TOPIC_ERRORS = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})
"""What Kafka (or librdkafka) answers for a topic that does not exist."""
AUTHORIZATION_ERRORS = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
                                  KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                                  KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED})
PERMANENT_CONNECT_ERRORS = {KafkaError._AUTHENTICATION: "authentication failed", KafkaError._SSL: "TLS failed"}
"""Connection failures waiting does not heal: the broker refused the client."""
CONNECT_ERRORS = {
    KafkaError._RESOLVE: "DNS lookup failed",
    KafkaError._ALL_BROKERS_DOWN: "all brokers are down",
    KafkaError._TIMED_OUT: "timed out",
    **PERMANENT_CONNECT_ERRORS,
}
UNREACHABLE_ERRORS = frozenset({KafkaError._TRANSPORT, *CONNECT_ERRORS})
"""The errors that mean Kafka did not answer (or would not let the client in), not that it refused a request."""


def describe_connect_error(error: KafkaError) -> str:
    """What went wrong, in a few words a user acts on (refused, DNS, authentication, TLS), plus librdkafka's."""
    text = error.str()
    if error.code() == KafkaError._TRANSPORT:
        what = "connection refused" if "refused" in text.lower() else "connection failed"
    else:
        what = CONNECT_ERRORS.get(error.code(), error.name())
    return f"{what} ({text})"


def missing_topic_text(topic: str, bootstrap: str) -> str:
    return (f"topic {topic!r} does not exist on {bootstrap}: create it (kafka-topics.sh --create, or "
            f"epochline run --create-topics), or correct the topic name")


def kafka_error_text(error: KafkaError | BaseException, bootstrap: str | None = None,
                     topic: str | None = None) -> str:
    """``error`` as one sentence: the topic it concerns (when given), the broker (when known) and, for the
    errors a person fixes (a missing topic, a permission, Kafka not answering), what to do. A
    ``KafkaException`` is read for the ``KafkaError`` it carries; another exception (``BufferError`` from a
    full producer queue) is its own message."""
    if isinstance(error, BaseException):
        cause = error.args[0] if isinstance(error, KafkaException) and error.args else None
        if not isinstance(cause, KafkaError):
            return str(error)
        error = cause
    kafka = f"Kafka at {bootstrap}" if bootstrap else "Kafka"
    code = error.code()
    if code in MISSING_TOPIC_ERRORS and topic is not None:
        return missing_topic_text(topic, bootstrap or "the cluster")
    subject = f"topic {topic!r}: " if topic is not None else ""
    if code in AUTHORIZATION_ERRORS:
        return (f"{subject}{kafka} refused the request, not authorized ({error.name()}): grant the principal the "
                f"ACL it needs")
    if code in UNREACHABLE_ERRORS:
        return f"{subject}cannot reach {kafka}: {describe_connect_error(error)}"
    return f"{subject}{kafka} answered {error.name()}: {error.str()}"
