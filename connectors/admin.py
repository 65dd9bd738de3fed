"""Kafka administration the connectors, batch jobs and tests share: check that Kafka answers, create and
describe topics, read partition offsets. Every partition start/end offset look-up in epochline goes through
``watermark_offsets``.

``client_config`` (security settings: ``security.protocol``, ``sasl.*``, ``ssl.*``) goes to every client made
here. librdkafka's own log lines go to the ``librdkafka`` logger (``CLIENT_LOGGER``), never raw to stderr.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic  # the class confluent_kafka.admin re-exports without declaring it

log = logging.getLogger(__name__)
CLIENT_LOGGER = logging.getLogger("librdkafka")
"""Where every client epochline makes sends librdkafka's log lines (its ``logger`` setting)."""

ClientConfig = Mapping[str, str]

_QUIET = 4  # librdkafka log level: warnings and worse

COORDINATOR_NOT_READY = frozenset({
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
})
"""A group's coordinator moves or loads right after the broker starts: librdkafka does not flag these as
retriable for ``committed()``, but they clear within seconds."""


class TopicAdminError(RuntimeError):
    """A topic could not be created or described, or its offsets could not be read."""


class KafkaUnreachable(TopicAdminError):
    """Kafka did not answer within the connect timeout, or refused the client (authentication, TLS)."""


_PERMANENT_CONNECT_ERRORS = {KafkaError._AUTHENTICATION: "authentication failed", KafkaError._SSL: "TLS failed"}
_CONNECT_ERRORS = {
    KafkaError._RESOLVE: "DNS lookup failed",
    KafkaError._ALL_BROKERS_DOWN: "all brokers are down",
    KafkaError._TIMED_OUT: "timed out",
    **_PERMANENT_CONNECT_ERRORS,
}


def _admin_client(bootstrap: str, client_config: ClientConfig | None = None, **extra: Any) -> AdminClient:
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "log_level": _QUIET, "logger": CLIENT_LOGGER,
                              **(client_config or {}), **extra}
    return AdminClient(config)


def describe_connect_error(error: KafkaError) -> str:
    """What went wrong, in a few words a user acts on (refused, DNS, authentication, TLS), plus librdkafka's."""
    text = error.str()
    if error.code() == KafkaError._TRANSPORT:
        what = "connection refused" if "refused" in text.lower() else "connection failed"
    else:
        what = _CONNECT_ERRORS.get(error.code(), error.name())
    return f"{what} ({text})"


def check_connection(bootstrap: str, client_config: ClientConfig | None = None, timeout: float = 30.0,
                     interrupted: Callable[[], bool] = lambda: False) -> None:
    """Return once Kafka at ``bootstrap`` answers a metadata request; else ``KafkaUnreachable`` with one line
    naming the address and what failed, at the latest after ``timeout`` seconds, and at once when the broker
    refuses the client (authentication, TLS): those do not heal by waiting. ``interrupted`` is polled about
    every half second (a stop signal ends the wait, raising ``KafkaUnreachable`` too)."""
    errors: list[KafkaError] = []
    admin = _admin_client(bootstrap, client_config, error_cb=errors.append)
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=max(0.1, min(0.5, deadline - time.monotonic())))
            return
        except KafkaException as exc:
            errors.append(exc.args[0])
        admin.poll(0)  # serves error_cb: the specific cause (refused, DNS, authentication) comes from there
        refused = [e for e in errors if e.code() in _PERMANENT_CONNECT_ERRORS]
        if refused:
            raise KafkaUnreachable(f"Kafka at {bootstrap}: {describe_connect_error(refused[-1])}")
        if interrupted():
            raise KafkaUnreachable(f"stopped while waiting for Kafka at {bootstrap}")
        if time.monotonic() >= deadline:
            last = next((e for e in reversed(errors) if e.code() != KafkaError._TIMED_OUT), errors[-1])
            raise KafkaUnreachable(f"cannot reach Kafka at {bootstrap} within {timeout:.0f}s: "
                                   f"{describe_connect_error(last)}")


def create_topic(bootstrap: str, topic: str, partitions: int = 1, config: dict[str, str] | None = None,
                 timeout: float = 30.0, client_config: ClientConfig | None = None) -> None:
    """Create ``topic`` (replicated as the broker's ``default.replication.factor`` says) and wait for the
    broker to confirm it; an existing topic is left as it is."""
    admin = _admin_client(bootstrap, client_config)
    futures = admin.create_topics([NewTopic(topic, partitions, config=config or {})],
                                  operation_timeout=timeout, request_timeout=timeout)
    try:
        futures[topic].result(timeout)
    except KafkaException as error:
        if error.args[0].name() != "TOPIC_ALREADY_EXISTS":
            raise TopicAdminError(f"creating topic {topic!r} on {bootstrap} failed: {error}") from error


def partitions_of(bootstrap: str, topic: str, timeout: float = 30.0,
                  client_config: ClientConfig | None = None) -> list[int]:
    """The topic's partition ids; a missing topic is an error that names it."""
    admin = _admin_client(bootstrap, client_config)
    try:
        metadata = admin.list_topics(topic, timeout=timeout)
    except KafkaException as error:
        raise TopicAdminError(f"cannot describe topic {topic!r}: broker {bootstrap} unreachable ({error})") from error
    described = metadata.topics.get(topic)
    if described is None or described.error is not None:
        reason = described.error if described is not None else "not in metadata"
        raise TopicAdminError(f"topic {topic!r} is not available on {bootstrap}: {reason}")
    return sorted(described.partitions)


def watermark_offsets(consumer: Consumer, topic: str, partitions: list[int],
                      timeout: float = 30.0) -> dict[int, tuple[int, int]]:
    """Per partition, ``(log start, end)`` as ``consumer``'s isolation level sees them: for
    ``read_committed`` the end is the last stable offset (what such a reader stops before), else the high
    watermark. Transaction markers occupy offsets, so the end is not "last record offset + 1"."""
    offsets = {}
    for partition in partitions:
        try:
            offsets[partition] = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
        except KafkaException as error:
            raise TopicAdminError(f"offsets of topic {topic!r} partition {partition} unavailable: {error}") from error
    return offsets


def partition_offsets(bootstrap: str, topic: str, timeout: float = 30.0,
                      client_config: ClientConfig | None = None) -> dict[int, tuple[int, int]]:
    """``watermark_offsets`` of every partition of ``topic``, read as a ``read_committed`` consumer."""
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "group.id": "epochline-end-offsets",
                              "isolation.level": "read_committed", "enable.auto.commit": False,
                              "log_level": _QUIET, "logger": CLIENT_LOGGER, **(client_config or {})}
    consumer = Consumer(config)
    try:
        return watermark_offsets(consumer, topic, partitions_of(bootstrap, topic, timeout, client_config), timeout)
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, timeout: float = 30.0,
                client_config: ClientConfig | None = None) -> dict[int, int]:
    """Per partition, the offset a ``read_committed`` reader stops before (the last stable offset)."""
    offsets = partition_offsets(bootstrap, topic, timeout, client_config)
    return {partition: end for partition, (_, end) in offsets.items()}


def committed_offsets(consumer: Consumer, partitions: list[TopicPartition], timeout: float = 30.0,
                      ) -> list[TopicPartition]:
    """The consumer's group's committed offsets (with metadata) for ``partitions``, retrying retriable errors
    and a coordinator that is not ready yet until ``timeout``; then ``TopicAdminError``."""
    deadline = time.monotonic() + timeout
    backoff = 0.1
    while True:
        try:
            return list(consumer.committed(partitions, timeout=max(0.1, deadline - time.monotonic())))
        except KafkaException as exc:
            error = exc.args[0]
            transient = error.retriable() or error.code() in COORDINATOR_NOT_READY
            if not transient or time.monotonic() + backoff > deadline:
                raise TopicAdminError(f"committed offsets unavailable: {error}") from exc
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)


def authorized_operations(bootstrap: str, topics: list[str], group: str, client_config: ClientConfig | None = None,
                          timeout: float = 30.0) -> dict[str, set[str] | str]:
    """What the principal may do, per topic and for ``group``: the broker's authorized operations (``READ``,
    ``WRITE``, ``DESCRIBE``, ...) or, when it will not describe one, why (missing, not authorized). Nothing is
    read or written: this is what ``epochline validate --online`` checks."""
    admin = _admin_client(bootstrap, client_config)
    answers: dict[str, set[str] | str | KafkaError] = {}
    described = admin.describe_topics(TopicCollection(topics), include_authorized_operations=True,
                                      request_timeout=timeout)
    for topic, future in described.items():
        answers[topic] = _described(future, timeout, missing="the topic does not exist")
    deadline = time.monotonic() + timeout
    while True:
        [future] = admin.describe_consumer_groups([group], include_authorized_operations=True,
                                                  request_timeout=timeout).values()
        answer = _described(future, timeout, missing="the group does not exist")
        if not isinstance(answer, KafkaError) or answer.code() not in COORDINATOR_NOT_READY \
                or time.monotonic() > deadline:
            break
        time.sleep(0.5)  # a new group's coordinator may still be loading: that clears within seconds
    answers[group] = answer
    return {name: f"{found.name()}: {found.str()}" if isinstance(found, KafkaError) else found
            for name, found in answers.items()}


def _described(future: Future[Any], timeout: float, missing: str) -> set[str] | str | KafkaError:
    """The authorized operations of a described topic or group, ``missing`` when it does not exist, or the
    error the broker answered with."""
    try:
        described = future.result(timeout)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        missing_codes = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError.GROUP_ID_NOT_FOUND)
        return missing if error.code() in missing_codes else error
    return {operation.name for operation in described.authorized_operations or ()}
