"""Kafka administration the connectors, batch jobs and tests share: check that Kafka answers, create and
describe topics, read partition offsets, describe consumer groups. Every partition start/end offset look-up
in epochline goes through ``watermark_offsets``.

``client_config`` (security settings: ``security.protocol``, ``sasl.*``, ``ssl.*``) goes to every client made
here, over ``connectors.clients.CLIENT_DEFAULTS``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Literal, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._group import MemberDescription  # re-exported by confluent_kafka.admin, undeclared
from confluent_kafka.cimpl import NewTopic  # the class confluent_kafka.admin re-exports without declaring it

from connectors.clients import UNREACHABLE_BACKOFF, kafka_client_config
from connectors.kafka_errors import (
    MISSING_TOPIC_ERRORS,
    PERMANENT_CONNECT_ERRORS,
    UNREACHABLE_ERRORS,
    describe_connect_error,
    kafka_error_text,
    missing_topic_text,
)

log = logging.getLogger(__name__)
MISSING_TOPIC_GRACE_S = 2.0
"""Seconds a missing topic is asked for again before it is an error: a topic made a moment ago may not have
reached the broker that answers yet (metadata propagation)."""

ClientConfig = Mapping[str, str]
Isolation = Literal["read_committed", "read_uncommitted"]

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


_ANSWER_GRACE_S = 0.5
"""How long past its request timeout a DescribeCluster future may take to resolve (its callback runs on a
librdkafka thread)."""


def _admin_client(bootstrap: str, client_config: ClientConfig | None = None, **extra: Any) -> AdminClient:
    return AdminClient(kafka_client_config(bootstrap, {"log_level": _QUIET}, client_config or {}, extra))


def check_connection(bootstrap: str, client_config: ClientConfig | None = None, timeout: float = 30.0,
                     interrupted: Callable[[], bool] = lambda: False) -> None:
    """Return once Kafka at ``bootstrap`` answers a DescribeCluster request (a few bytes, where a metadata
    request lists every topic of the cluster: 50-100 ms of a connector's start here, more on a big cluster);
    else ``KafkaUnreachable`` with one line naming the address and what failed, at the latest after
    ``timeout`` seconds, and at once when the broker refuses the client (authentication, TLS): those do not
    heal by waiting. ``interrupted`` is polled about
    every half second (a stop signal ends the wait, raising ``KafkaUnreachable`` too). While Kafka does not
    answer, the client connects again about 4 times a second (``UNREACHABLE_BACKOFF``), not 78."""
    errors: list[KafkaError] = []
    admin = _admin_client(bootstrap, {**UNREACHABLE_BACKOFF, **(client_config or {})}, error_cb=errors.append)
    deadline = time.monotonic() + timeout
    while True:
        wait = max(0.1, min(0.5, deadline - time.monotonic()))
        try:
            admin.describe_cluster(request_timeout=wait).result(timeout=wait + _ANSWER_GRACE_S)
            return
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError._UNSUPPORTED_FEATURE:
                return  # a broker older than DescribeCluster (Kafka 2.8) has answered all the same
            errors.append(exc.args[0])
        except FutureTimeout:
            errors.append(KafkaError(KafkaError._TIMED_OUT, f"no answer to DescribeCluster within {wait:.1f}s"))
        admin.poll(0)  # serves error_cb: the specific cause (refused, DNS, authentication) comes from there
        refused = [e for e in errors if e.code() in PERMANENT_CONNECT_ERRORS]
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
    create_topics(bootstrap, [topic], partitions, config, timeout, client_config)


def create_topics(bootstrap: str, topics: Sequence[str], partitions: int = 1, config: dict[str, str] | None = None,
                  timeout: float = 30.0, client_config: ClientConfig | None = None) -> list[str]:
    """``create_topic`` for many topics in one request (a thousand one by one take minutes): all of them, or
    ``TopicAdminError`` naming the first that failed. Returns the topics created now (not those that existed).
    ``partitions`` -1 takes the broker's ``num.partitions``."""
    if not topics:
        return []
    admin = _admin_client(bootstrap, client_config)
    futures = admin.create_topics([NewTopic(topic, partitions, config=config or {}) for topic in topics],
                                  operation_timeout=timeout, request_timeout=timeout)
    created = []
    for topic, future in futures.items():
        try:
            future.result(timeout)
            created.append(topic)
        except KafkaException as error:
            if error.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise TopicAdminError(f"creating topic {topic!r} failed: {kafka_error_text(error, bootstrap)}"
                                      ) from error
    return created


def partitions_of(bootstrap: str, topic: str, timeout: float = 30.0,
                  client_config: ClientConfig | None = None) -> list[int]:
    """The topic's partition ids; a missing topic is an error that names it."""
    admin = _admin_client(bootstrap, client_config)
    try:
        metadata = admin.list_topics(topic, timeout=timeout)
    except KafkaException as error:
        raise TopicAdminError(f"cannot describe topic {topic!r}: {kafka_error_text(error, bootstrap)}") from error
    described = metadata.topics.get(topic)
    if described is None:
        raise TopicAdminError(missing_topic_text(topic, bootstrap))
    if described.error is not None:
        raise TopicAdminError(kafka_error_text(described.error, bootstrap, topic))
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
            raise TopicAdminError(f"offsets of topic {topic!r} partition {partition} unavailable: "
                                  f"{kafka_error_text(error)}") from error
    return offsets


def partition_offsets(bootstrap: str, topic: str, timeout: float = 30.0, client_config: ClientConfig | None = None,
                      *, isolation: Isolation = "read_committed",
                      partitions: list[int] | None = None) -> dict[int, tuple[int, int]]:
    """``watermark_offsets`` of ``partitions`` of ``topic`` (default: all), as a consumer with ``isolation``
    reads them: the last stable offset read_committed, the high watermark read_uncommitted."""
    consumer = _offsets_consumer(bootstrap, client_config, isolation=isolation)
    try:
        if partitions is None:
            partitions = partitions_of(bootstrap, topic, timeout, client_config)
        return watermark_offsets(consumer, topic, partitions, timeout)
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
                raise TopicAdminError(f"committed offsets unavailable: {kafka_error_text(error)}") from exc
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
        missing_codes = MISSING_TOPIC_ERRORS | {KafkaError.GROUP_ID_NOT_FOUND}
        return missing if error.code() in missing_codes else error
    return {operation.name for operation in described.authorized_operations or ()}


class GroupMissing(TopicAdminError):
    """The consumer group does not exist: no instance has joined it and it holds no committed offsets."""


@dataclass(frozen=True)
class DescribedMember:
    """One member of a consumer group as the group coordinator sees it, with the partitions it holds."""

    member_id: str
    client_id: str
    group_instance_id: str | None
    host: str
    partitions: tuple[tuple[str, int], ...]  # (topic, partition), sorted


@dataclass(frozen=True)
class DescribedGroup:
    """A consumer group's state (``STABLE``, ``EMPTY``, ``PREPARING_REBALANCE``, ...) and its members."""

    group_id: str
    state: str
    members: tuple[DescribedMember, ...]


def describe_group(bootstrap: str, group: str, timeout: float = 30.0,
                   client_config: ClientConfig | None = None) -> DescribedGroup:
    """The group's state and members (member id, client id, group instance id, host, assigned partitions),
    within ``timeout`` seconds. A group that does not exist (the broker answers ``DEAD`` or
    ``GROUP_ID_NOT_FOUND``) is ``GroupMissing``; a broker that does not answer is ``KafkaUnreachable``. A
    coordinator that is still loading is asked again until the timeout: that clears within seconds."""
    admin = _admin_client(bootstrap, client_config)
    deadline = time.monotonic() + timeout
    while True:
        remaining = max(0.1, deadline - time.monotonic())
        [future] = admin.describe_consumer_groups([group], request_timeout=remaining).values()
        try:
            described = future.result(remaining + 1.0)
            break
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() in COORDINATOR_NOT_READY and time.monotonic() + 0.5 < deadline:
                time.sleep(0.5)
                continue
            raise _group_error(bootstrap, group, error) from exc
        except TimeoutError as exc:  # librdkafka's request timeout should have answered first
            raise KafkaUnreachable(f"cannot describe consumer group {group!r}: Kafka at {bootstrap} did not "
                                   f"answer within {timeout:.0f}s") from exc
    state = described.state.name if described.state is not None else "UNKNOWN"
    if state == "DEAD":
        raise GroupMissing(f"consumer group {group!r} does not exist on {bootstrap}")
    members = tuple(_described_member(member) for member in described.members)
    return DescribedGroup(group, state, tuple(sorted(members, key=lambda member: member.client_id)))


def _group_error(bootstrap: str, group: str, error: KafkaError) -> TopicAdminError:
    """The error class a failed group description deserves: missing, unreachable, or another answer."""
    if error.code() == KafkaError.GROUP_ID_NOT_FOUND:
        return GroupMissing(f"consumer group {group!r} does not exist on {bootstrap}")
    if error.code() in UNREACHABLE_ERRORS:
        return KafkaUnreachable(f"cannot describe consumer group {group!r}: Kafka at {bootstrap}: "
                                f"{describe_connect_error(error)}")
    return TopicAdminError(f"cannot describe consumer group {group!r} on {bootstrap}: {error.name()}: {error.str()}")


def _described_member(member: MemberDescription) -> DescribedMember:
    """A member of confluent-kafka's group description as plain data."""
    assigned = member.assignment.topic_partitions if member.assignment is not None else []
    return DescribedMember(member_id=member.member_id, client_id=member.client_id,
                           group_instance_id=member.group_instance_id or None, host=member.host,
                           partitions=tuple(sorted((tp.topic, tp.partition) for tp in assigned)))


def matching_topics(bootstrap: str, prefix: str = "", suffix: str = "", timeout: float = 30.0,
                    client_config: ClientConfig | None = None) -> dict[str, list[int]]:
    """The topics whose names start with ``prefix`` and end with ``suffix``, with their partition ids: how
    a connector's own topics (changelogs, repartition) are found by name. One metadata request."""
    admin = _admin_client(bootstrap, client_config)
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as error:
        raise KafkaUnreachable(f"cannot list topics: Kafka at {bootstrap}: "
                               f"{describe_connect_error(error.args[0])}") from error
    return {name: sorted(topic.partitions) for name, topic in sorted(metadata.topics.items())
            if name.startswith(prefix) and name.endswith(suffix) and topic.error is None}


def _offsets_consumer(bootstrap: str, client_config: ClientConfig | None, group: str = "epochline-end-offsets",
                      isolation: Isolation = "read_uncommitted", eof: bool = False) -> Consumer:
    """A consumer that only looks: never subscribes (so never joins ``group``), never commits. By default it
    reads high watermarks (``read_uncommitted``), so an open transaction neither blocks nor hides an offset;
    with ``eof`` it says when an assigned partition is read to its end."""
    return Consumer(kafka_client_config(bootstrap, {"group.id": group, "isolation.level": isolation,
                                                    "enable.partition.eof": eof, "enable.auto.commit": False,
                                                    "log_level": _QUIET},
                                        client_config or {}))


def topic_watermarks(bootstrap: str, prefix: str = "", suffix: str = "", timeout: float = 30.0,
                     client_config: ClientConfig | None = None) -> dict[str, dict[int, tuple[int, int]]]:
    """Per topic matching ``prefix``/``suffix`` (``matching_topics``), per partition ``(log start, high
    watermark)``: high minus start is how many offsets a topic holds (for a compacted topic an upper bound)."""
    topics = matching_topics(bootstrap, prefix, suffix, timeout, client_config)
    consumer = _offsets_consumer(bootstrap, client_config)
    try:
        return {topic: watermark_offsets(consumer, topic, partitions, timeout) for topic, partitions in topics.items()}
    finally:
        consumer.close()


@dataclass(frozen=True)
class StoredRecord:
    """A record as read back from a topic: where it is, when it was written, its bytes and headers."""

    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def last_committed_records(bootstrap: str, topic: str, count: int, timeout: float = 10.0,
                           client_config: ClientConfig | None = None) -> list[StoredRecord]:
    """Up to the last ``count`` committed records of ``topic``, newest first, read ``read_committed``.

    Each partition is read from ``count`` offsets before its last stable offset; transaction markers and
    aborted records take offsets too, so a partition that yields fewer is read again from twice as far back,
    until it yields ``count`` or its log start is reached. A topic that does not exist holds none; a read
    that does not reach the ends within ``timeout`` is a ``TopicAdminError``."""
    deadline = time.monotonic() + timeout
    consumer = _offsets_consumer(bootstrap, client_config, isolation="read_committed", eof=True)
    try:
        described = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if described is None or described.error is not None:
            return []
        marks = {partition: (low, end) for partition, (low, end) in
                 watermark_offsets(consumer, topic, sorted(described.partitions), timeout).items() if end > low}
        found: dict[int, list[StoredRecord]] = {}
        span = count
        while marks:
            starts = {partition: max(low, end - span) for partition, (low, end) in marks.items()}
            read = _read_to_the_end(consumer, topic, starts, deadline)
            for partition in starts:
                found[partition] = [record for record in read if record.partition == partition]
            marks = {partition: marks[partition] for partition, start in starts.items()
                     if len(found[partition]) < count and start > marks[partition][0]}
            span *= 2
    finally:
        consumer.close()
    newest = sorted((record for records in found.values() for record in records),
                    key=lambda record: (record.timestamp_ms or 0, record.partition, record.offset), reverse=True)
    return newest[:count]


def _read_to_the_end(consumer: Consumer, topic: str, starts: Mapping[int, int], deadline: float) -> list[StoredRecord]:
    """Every record from ``starts`` until each partition reports its end (``enable.partition.eof``)."""
    if not starts:
        return []
    consumer.assign([TopicPartition(topic, partition, offset) for partition, offset in starts.items()])
    reading, found = set(starts), []
    while reading:
        if time.monotonic() > deadline:
            raise TopicAdminError(f"topic {topic!r}: partitions {sorted(reading)} not read to their end in time")
        message = consumer.poll(0.2)
        if message is None:
            continue
        error = message.error()
        if error is not None and error.code() == KafkaError._PARTITION_EOF:
            reading.discard(message.partition())
        elif error is not None:
            raise TopicAdminError(f"topic {topic!r}: cannot read partition {message.partition()}: {error}")
        else:
            kind, timestamp = message.timestamp()
            headers = cast(list[tuple[str, bytes | None]], message.headers() or [])  # a list, as consumed
            found.append(StoredRecord(cast(int, message.partition()), cast(int, message.offset()),
                                      timestamp if kind else None, message.key(), message.value(), headers))
    return found


@dataclass(frozen=True)
class GroupPartitionOffsets:
    """One partition as a group's progress report needs it: where the log starts and ends (high watermark),
    and what the group committed there (None when nothing was), with the commit's metadata string."""

    partition: int
    low: int
    high: int
    committed: int | None
    metadata: str | None


def group_offsets(bootstrap: str, group: str, topic: str, partitions: list[int], timeout: float = 30.0,
                  client_config: ClientConfig | None = None) -> list[GroupPartitionOffsets]:
    """The group's committed offsets (with metadata) and the watermarks of ``partitions`` of ``topic``, read
    without joining the group: a running instance is neither disturbed nor waited for."""
    consumer = _offsets_consumer(bootstrap, client_config, group)
    try:
        watermarks = watermark_offsets(consumer, topic, partitions, timeout)
        committed = committed_offsets(consumer, [TopicPartition(topic, p) for p in partitions], timeout)
    finally:
        consumer.close()
    by_partition = {tp.partition: tp for tp in committed}
    return [GroupPartitionOffsets(partition, *watermarks[partition], *_committed(by_partition.get(partition)))
            for partition in partitions]


def _committed(tp: TopicPartition | None) -> tuple[int | None, str | None]:
    """A committed offset and its metadata; a negative offset is librdkafka's "nothing committed"."""
    if tp is None or tp.offset < 0:
        return None, None
    return tp.offset, tp.metadata or None


class TopicMismatch(TopicAdminError):
    """A topic exists, but not as required: another partition count, or another cleanup policy."""


class TopicNotAuthorized(TopicAdminError):
    """The principal may not create (or describe) a topic it needs."""


_AUTHORIZATION_CODES = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED})


def ensure_topic(bootstrap: str, name: str, partitions: int, client_config: ClientConfig | None = None, *,
                 compacted: bool, timeout: float = 30.0, config: Mapping[str, str] | None = None) -> bool:
    """Make sure topic ``name`` exists with ``partitions`` partitions and ``cleanup.policy=compact`` when
    ``compacted`` (else ``delete``); returns True when it was created now. Replication is the broker's
    ``default.replication.factor``; ``config`` adds topic settings (``max.message.bytes`` for large state).

    An existing topic is accepted when its partition count matches and its cleanup policy is the one asked
    for: a compacted changelog that retention may delete (``delete`` in its policy) loses state, a topic that
    compaction may thin out loses rows. Otherwise ``TopicMismatch`` names the topic and what differs. A
    principal that may not create (or describe) it gets ``TopicNotAuthorized``, naming the topic and the
    settings to create it with by other means. The broker is not asked to auto-create anything: the topic is
    described through DescribeTopics, then created with CreateTopics, then awaited until every partition has a
    leader, all within ``timeout``."""
    if partitions < 1:
        raise ValueError(f"topic {name!r}: partitions must be at least 1, got {partitions}")
    policy = "compact" if compacted else "delete"
    given = (config or {}).get("cleanup.policy")
    if given is not None and given != policy:
        raise ValueError(f"topic {name!r}: config cleanup.policy={given!r} contradicts compacted={compacted}")
    wanted = f"{partitions} partitions, cleanup.policy={policy}"
    admin = _admin_client(bootstrap, client_config)
    deadline = time.monotonic() + timeout
    existing = _topic_partition_count(admin, bootstrap, name, deadline, wanted)
    if existing is None:
        topic = NewTopic(name, partitions, config={**(config or {}), "cleanup.policy": policy})
        remaining = max(0.1, deadline - time.monotonic())
        future = admin.create_topics([topic], operation_timeout=remaining, request_timeout=remaining)[name]
        try:
            future.result(remaining + 1.0)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() in _AUTHORIZATION_CODES:
                raise TopicNotAuthorized(f"the principal may not create topic {name!r} on {bootstrap} "
                                         f"({error.name()}); create it with {wanted}, or grant CREATE") from exc
            if error.code() != KafkaError.TOPIC_ALREADY_EXISTS:  # else created meanwhile: check it below
                raise TopicAdminError(f"creating topic {name!r} ({wanted}) on {bootstrap} failed: "
                                      f"{error.name()}: {error.str()}") from exc
        except TimeoutError as exc:
            raise TopicAdminError(f"creating topic {name!r} on {bootstrap}: no answer within {timeout:g}s") from exc
        else:
            _await_leaders(admin, bootstrap, name, partitions, deadline, timeout, wanted)
            log.info("topic created", extra={"topic": name, "partitions": partitions, "cleanup_policy": policy})
            return True
        existing = _described_once_known(admin, bootstrap, name, deadline, wanted)
    if existing != partitions:
        raise TopicMismatch(f"topic {name!r} on {bootstrap} has {existing} partitions, {partitions} are required "
                            f"(partition counts are fixed by the state they hold: recreate it or fix the setting)")
    _check_cleanup_policy(admin, bootstrap, name, compacted, deadline)
    return False


def _topic_partition_count(admin: AdminClient, bootstrap: str, name: str, deadline: float,
                           wanted: str, *, known_to_exist: bool = False) -> int | None:
    """The topic's partition count, None when it does not exist; retriable answers are asked again. Kafka
    does not say whether a topic exists to whom may not describe it, so that is None too (creating tells),
    unless the topic is known to exist (``known_to_exist``): then it is ``TopicNotAuthorized``."""
    while True:
        remaining = max(0.1, deadline - time.monotonic())
        [future] = admin.describe_topics(TopicCollection([name]), request_timeout=remaining).values()
        try:
            return len(future.result(remaining + 1.0).partitions)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() in MISSING_TOPIC_ERRORS:
                return None
            if error.code() in _AUTHORIZATION_CODES:
                if known_to_exist:
                    raise _may_not_describe(bootstrap, name, wanted, error) from exc
                return None
            if not error.retriable() or time.monotonic() + 0.2 >= deadline:
                kind = KafkaUnreachable if error.code() in UNREACHABLE_ERRORS else TopicAdminError
                raise kind(f"cannot describe topic {name!r} (needed: {wanted}): Kafka at {bootstrap}: "
                           f"{describe_connect_error(error)}") from exc
            time.sleep(0.2)
        except TimeoutError as exc:
            raise KafkaUnreachable(f"cannot describe topic {name!r}: Kafka at {bootstrap} did not answer") from exc


def _described_once_known(admin: AdminClient, bootstrap: str, name: str, deadline: float, wanted: str) -> int:
    """The partition count of a topic whose creation said it exists: the broker describing it may learn of
    it a moment after the controller (seen once: the description said it did not exist), so it is asked
    again for ``MISSING_TOPIC_GRACE_S``."""
    grace_ends = min(deadline, time.monotonic() + MISSING_TOPIC_GRACE_S)
    while (existing := _topic_partition_count(admin, bootstrap, name, deadline, wanted, known_to_exist=True)) is None:
        if time.monotonic() >= grace_ends:
            raise TopicAdminError(f"topic {name!r} on {bootstrap}: creation said it exists, but it is not "
                                  f"described after {MISSING_TOPIC_GRACE_S:g}s")
        time.sleep(0.1)
    return existing


def _await_leaders(admin: AdminClient, bootstrap: str, name: str, partitions: int, deadline: float,
                   timeout: float, wanted: str) -> None:
    """Wait until the new topic's description shows every partition with a leader: clients that use it at
    once then find it. A principal that may create it but not describe it is told so at once."""
    while True:
        remaining = max(0.1, deadline - time.monotonic())
        [future] = admin.describe_topics(TopicCollection([name]), request_timeout=remaining).values()
        try:
            described = future.result(remaining + 1.0).partitions
            if len(described) == partitions and all(p.leader is not None and p.leader.id >= 0 for p in described):
                return
        except KafkaException as exc:
            if exc.args[0].code() in _AUTHORIZATION_CODES:
                raise _may_not_describe(bootstrap, name, wanted, exc.args[0]) from exc
        except TimeoutError:
            pass  # not propagated yet
        if time.monotonic() + 0.1 >= deadline:
            raise TopicAdminError(f"topic {name!r} was created on {bootstrap} but its partitions have no leader "
                                  f"after {timeout:g}s")
        time.sleep(0.1)


def _may_not_describe(bootstrap: str, name: str, wanted: str, error: KafkaError) -> TopicNotAuthorized:
    return TopicNotAuthorized(f"the principal may not describe topic {name!r} on {bootstrap} ({error.name()}), so "
                              f"whether it has {wanted} cannot be checked: grant DESCRIBE (or READ) on it")


def _check_cleanup_policy(admin: AdminClient, bootstrap: str, name: str, compacted: bool, deadline: float) -> None:
    """``TopicMismatch`` when the existing topic's cleanup policy is not the one asked for. A principal that
    may not describe configs cannot check it: a warning says so, and the topic is used."""
    from confluent_kafka.admin._config import ConfigResource
    from confluent_kafka.admin._resource import ResourceType

    remaining = max(0.1, deadline - time.monotonic())
    [future] = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)], request_timeout=remaining).values()
    try:
        entries = future.result(remaining + 1.0)
    except (KafkaException, TimeoutError) as exc:
        reason = exc.args[0] if isinstance(exc, KafkaException) else "no answer"
        log.warning("cleanup policy of an existing topic not checked", extra={"topic": name, "reason": str(reason)})
        return
    entry = entries.get("cleanup.policy")
    actual = {part.strip() for part in (entry.value or "").split(",")} if entry is not None else {"delete"}
    if compacted and actual != {"compact"}:
        raise TopicMismatch(f"topic {name!r} on {bootstrap} has cleanup.policy={','.join(sorted(actual))}, "
                            f"compact is required (retention would delete state records that are still current)")
    if not compacted and "compact" in actual:
        raise TopicMismatch(f"topic {name!r} on {bootstrap} has cleanup.policy={','.join(sorted(actual))}, "
                            f"delete is required (compaction would drop rows that share a key)")


class GroupNotEmpty(TopicAdminError):
    """The group still has members: its offsets can only be changed while no instance runs."""


def cluster_id(bootstrap: str, client_config: ClientConfig | None = None, timeout: float = 30.0) -> str | None:
    """The Kafka cluster id (what the worker's ``GET /`` reports), as the metadata response gives it."""
    admin = _admin_client(bootstrap, client_config)
    try:
        return admin.list_topics(timeout=timeout).cluster_id
    except KafkaException as exc:
        raise KafkaUnreachable(f"cannot reach Kafka at {bootstrap}: {describe_connect_error(exc.args[0])}") from exc


def alter_group_offsets(bootstrap: str, group: str, offsets: list[TopicPartition], timeout: float = 30.0,
                        client_config: ClientConfig | None = None) -> None:
    """Set the group's committed offsets (no metadata: the next owner starts there with a fresh event time).
    The broker refuses it while the group has members (``GroupNotEmpty``)."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    admin = _admin_client(bootstrap, client_config)
    [future] = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(group, offsets)],
                                                  request_timeout=timeout).values()
    _group_change(future, bootstrap, group, "altering the offsets of", timeout)


def delete_group(bootstrap: str, group: str, timeout: float = 30.0, client_config: ClientConfig | None = None) -> bool:
    """Delete the group and so every offset it committed; False when there was no such group. The broker
    refuses it while the group has members (``GroupNotEmpty``)."""
    admin = _admin_client(bootstrap, client_config)
    [future] = admin.delete_consumer_groups([group], request_timeout=timeout).values()
    try:
        _group_change(future, bootstrap, group, "deleting", timeout)
    except GroupMissing:
        return False
    return True


def _group_change(future: Future[Any], bootstrap: str, group: str, what: str, timeout: float) -> None:
    try:
        future.result(timeout + 1.0)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        if error.code() == KafkaError.NON_EMPTY_GROUP:
            raise GroupNotEmpty(f"{what} consumer group {group!r} refused: it still has members "
                                "(stop every instance first)") from exc
        raise _group_error(bootstrap, group, error) from exc
    except TimeoutError as exc:
        raise KafkaUnreachable(f"{what} consumer group {group!r}: Kafka at {bootstrap} did not answer "
                               f"within {timeout:.0f}s") from exc


def delete_topics(bootstrap: str, topics: list[str], timeout: float = 30.0,
                  client_config: ClientConfig | None = None) -> None:
    """Delete ``topics`` (all of them or ``TopicAdminError`` naming the first that failed), within ``timeout``."""
    if not topics:
        return
    admin = _admin_client(bootstrap, client_config)
    for topic, future in admin.delete_topics(topics, operation_timeout=timeout, request_timeout=timeout).items():
        try:
            future.result(timeout + 1.0)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            raise TopicAdminError(f"deleting topic {topic!r} on {bootstrap}: {error.name()}: {error.str()}") from exc
        except TimeoutError as exc:
            raise TopicAdminError(f"deleting topic {topic!r}: no answer from {bootstrap} within {timeout:g}s") from exc
