"""Changelog topics: where a source partition's keyed (window) state lives in Kafka, and how it is read back.

Why: in group mode the instances of a connector share the source partitions through a consumer group, so a
partition's state must follow the partition, not the process. After each epoch, for every source partition p
whose state changed, the engine's transactional producer writes ONE record holding p's whole state snapshot
(``state_record``) to partition p of the compacted topic ``changelog_topic(connector, operator)``, inside
the epoch's transaction: the state is committed with the output and the offsets, or not at all. Every record
of a partition has the same key (``STATE_KEY``), so compaction keeps exactly one per partition, the newest.
The record must be produced to partition p explicitly (the key partitioner would send every partition's state
to one partition).

When a partition is assigned, its state is restored from the **last committed** record of its changelog
partition (``ChangelogReader.latest``), read with ``isolation.level=read_committed`` by a consumer outside the
group (assigned, never subscribed, never committing). That record is not at "high watermark - 1":
transaction markers occupy offsets and records of aborted transactions are invisible to such a reader (a
partition may even end in a run of aborted epochs). So the reader seeks a little before the partition's end
(the last stable offset), reads to the end-of-partition event and keeps the last record it saw; when that
window held none it doubles the window and reads again, down to the log start.

Before reading, the reader waits until no transaction is open on the partition (its last stable offset has
reached the high watermark): ``commit_transaction()`` returns before the coordinator has written the commit
markers to the partitions, so right after the old owner's last commit, even once the group's committed
offsets show it, the state record of that epoch may not be readable yet, and reading then would restore the
epoch before it. A transaction a dead instance left open is waited for until it is aborted, so the reader's
timeout must exceed ``transaction.timeout.ms``.

The repartition topic (``repartition_topic``) carries rows re-keyed by something other than the input
partitioning; it is written in the same transaction and read as another source of the group.

Nothing here imports the engine; ``connectors.admin.ensure_topic`` creates both kinds of topic.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Self

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from connectors.admin import MISSING_TOPIC_GRACE_S, ClientConfig
from connectors.clients import kafka_client_config
from connectors.kafka_errors import MISSING_TOPIC_ERRORS

CHECKPOINT_HEADER = "epochline.checkpoint"
"""Header naming the checkpoint id whose epoch wrote the record, as decimal ASCII."""
INSTANCE_HEADER = "epochline.instance"
"""Header naming the connector instance that wrote the record (UTF-8)."""
STATE_KEY = b"state"
"""The key of every state record: one key per partition, so compaction keeps one record per partition."""

DEFAULT_GROUP_ID = "epochline-changelog-restore"
"""The reader's group id. It is required by librdkafka but never joined (partitions are assigned) and never
committed to."""
INITIAL_LOOKBACK = 2
"""Offsets read back from the end on the first pass: the last committed record plus its commit marker. Each
pass that finds no committed record doubles it."""

_MISSING = MISSING_TOPIC_ERRORS | {KafkaError._UNKNOWN_PARTITION}
"""What Kafka answers for a topic or partition that does not exist, and for a topic the principal may not
describe (it does not reveal that one exists)."""
_PERMANENT_ERRORS = frozenset({
    *_MISSING, KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
})
"""Errors that waiting does not heal: reported at once instead of at the timeout. GROUP_AUTHORIZATION_FAILED
is not one: librdkafka looks up the coordinator of ``group.id`` even for an assign-only consumer and reports
the refusal, but the reader never uses the group, so a principal needs no ACL on it (READ and DESCRIBE on
the changelog topic suffice)."""

_REQUIRED_CONFIG: dict[str, Any] = {
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "earliest",  # a seek below a log start moved by retention starts at the log start
}


def changelog_topic(connector: str, operator: str) -> str:
    """``<connector>-<operator>-changelog``: the compacted topic of one stateful operator's keyed state."""
    _check_name_part("connector", connector)
    _check_name_part("operator", operator)
    return f"{connector}-{operator}-changelog"


def repartition_topic(connector: str) -> str:
    """``<connector>-repartition``: rows re-keyed by something other than the input partitioning."""
    _check_name_part("connector", connector)
    return f"{connector}-repartition"


def _check_name_part(what: str, value: str) -> None:
    if not value:
        raise ValueError(f"{what} name must not be empty")


class StateRecord(NamedTuple):
    """What the engine produces, to partition p of the changelog topic, inside the epoch's transaction."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]


def state_record(state: bytes, checkpoint_id: int, instance: str) -> StateRecord:
    """The record holding one partition's whole ``state`` snapshot, written in checkpoint ``checkpoint_id``'s
    transaction by connector instance ``instance``. ``producer.produce(topic, record.value, record.key,
    partition=p, headers=record.headers)``: the partition is always given explicitly."""
    if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int) or checkpoint_id < 0:
        raise ValueError(f"checkpoint id must be a non-negative integer, got {checkpoint_id!r}")
    if not instance:
        raise ValueError("instance must not be empty")
    return StateRecord(STATE_KEY, bytes(state), [(CHECKPOINT_HEADER, str(checkpoint_id).encode("ascii")),
                                                  (INSTANCE_HEADER, instance.encode("utf-8"))])


@dataclass(frozen=True)
class ChangelogEntry:
    """The last committed state record of one changelog partition."""

    value: bytes
    checkpoint_id: int
    instance: str
    offset: int


@dataclass(frozen=True)
class RestoreRead:
    """What one ``ChangelogReader.read`` found, and what it cost (for the engine's "restore time" log and
    metric). ``bytes_read`` counts the keys, values and headers of the committed records handed to the reader
    (records of aborted transactions are filtered inside librdkafka and not counted); ``passes`` is how many
    windows were read (more than one when aborted epochs hid the last committed record)."""

    topic: str
    partition: int
    entry: ChangelogEntry | None
    seconds: float
    bytes_read: int
    records_read: int
    passes: int
    log_start: int
    end: int
    """The last stable offset the read went to: records at or beyond it were not considered."""
    waited: float
    """Of ``seconds``, how long the read waited for transactions open on the partition to end."""


class ChangelogError(RuntimeError):
    """A changelog partition could not be read (missing topic or partition, not authorized, unreadable)."""


class ChangelogTimeout(ChangelogError):
    """A changelog partition was not read to its end within the reader's timeout."""


class ChangelogRecordInvalid(ChangelogError):
    """The last committed record of a changelog partition is not a state record (key or headers wrong)."""


class ChangelogReader:
    """Reads the last committed state record of changelog partitions, as a ``read_committed`` consumer outside
    the connector's group. One reader serves any number of ``latest`` calls, one after the other (it is not
    thread-safe); ``timeout`` bounds each call as a whole."""

    def __init__(self, bootstrap: str, client_config: ClientConfig | None = None, timeout: float = 60.0, *,
                 group_id: str = DEFAULT_GROUP_ID, initial_lookback: int = INITIAL_LOOKBACK,
                 consumer_config: Mapping[str, Any] | None = None) -> None:
        if initial_lookback < 1:
            raise ValueError(f"initial_lookback must be at least 1, got {initial_lookback}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.bootstrap = bootstrap
        self.timeout = timeout
        self.initial_lookback = initial_lookback
        self.last_read: RestoreRead | None = None
        """What the most recent ``latest``/``read`` found and cost."""
        # The end-of-partition event comes with the empty fetch at the end, which the broker holds up to this
        # long; partitions are only assigned during a read, so short polls cost nothing in between.
        self._config = kafka_client_config(bootstrap, {"fetch.wait.max.ms": 5}, consumer_config or {},
                                           client_config or {}, _REQUIRED_CONFIG, {"group.id": group_id})
        self._consumer = Consumer(self._config)
        self._uncommitted: Consumer | None = None  # only asks for high watermarks; made on first use
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._consumer.close()
            if self._uncommitted is not None:
                self._uncommitted.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def latest(self, topic: str, partition: int) -> ChangelogEntry | None:
        """The last committed state record of ``topic`` partition ``partition``; None when the partition is
        empty, holds only records of aborted transactions, or ends in a tombstone (state deleted)."""
        return self.read(topic, partition).entry

    def read(self, topic: str, partition: int) -> RestoreRead:
        """``latest``, with what the read cost; also kept in ``last_read``."""
        if self._closed:
            raise ChangelogError(f"changelog reader for Kafka at {self.bootstrap} is closed")
        started = time.monotonic()
        deadline = started + self.timeout
        where = f"changelog {topic!r} partition {partition} on Kafka at {self.bootstrap}"
        low, end, waited = self._stable_end(topic, partition, deadline, where)
        passes = records = size = 0
        found: Message | None = None
        lookback = self.initial_lookback
        try:
            while end > low:
                start = max(low, end - lookback)
                passes += 1
                window = self._read_window(topic, partition, start, end, deadline, where)
                records += window.records
                size += window.bytes
                if window.last is not None or start <= low:
                    found = window.last
                    break
                lookback *= 2
        finally:
            self._consumer.unassign()
        entry = None if found is None or found.value() is None else _entry(found, where)
        self.last_read = RestoreRead(topic, partition, entry, time.monotonic() - started, size, records, passes,
                                     low, end, waited)
        return self.last_read

    def _stable_end(self, topic: str, partition: int, deadline: float, where: str) -> tuple[int, int, float]:
        """(log start, end, seconds waited): the end is the last stable offset once it has reached the high
        watermark seen first, i.e. once no transaction that wrote to the partition is still open.

        Waiting is needed: ``commit_transaction()`` returns once the coordinator has logged the commit, and
        writes the markers to the partitions afterwards, so right after the old owner committed (even after
        the group's committed offsets show its epoch) the partition's last stable offset may still stand
        before that epoch's state record. Reading then would restore the epoch before. A transaction left
        open by a dead instance is waited for too, until it is aborted (``transaction.timeout.ms``, or
        fenced by its restarted instance): ``timeout`` must exceed that."""
        if self._uncommitted is None:
            self._uncommitted = Consumer({**self._config, "isolation.level": "read_uncommitted"})
        _, high = self._offsets(self._uncommitted, topic, partition, deadline, where)
        waiting_since: float | None = None
        stable = -1
        while True:
            try:
                low, stable = self._offsets(self._consumer, topic, partition, deadline, where)
            except ChangelogTimeout:
                if waiting_since is None:
                    raise
                break  # the deadline passed during a look-up, while a transaction was known to be open
            if stable >= high:
                return low, stable, 0.0 if waiting_since is None else time.monotonic() - waiting_since
            waiting_since = waiting_since or time.monotonic()
            if time.monotonic() + 0.02 >= deadline:
                break
            time.sleep(0.02)
        raise ChangelogTimeout(
            f"{where}: a transaction is still open on it after {self.timeout:g}s (last stable offset "
            f"{stable}, high watermark {high}): the instance that opened it has neither committed nor "
            f"aborted it (transaction.timeout.ms must be shorter than the restore timeout)")

    def _offsets(self, consumer: Consumer, topic: str, partition: int, deadline: float,
                 where: str) -> tuple[int, int]:
        """``consumer``'s (log start, end) of the partition, retrying what may heal until ``deadline``."""
        last: KafkaError | None = None
        missing_since: float | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChangelogTimeout(f"{where}: offsets not available within {self.timeout:g}s"
                                       + (f" ({_explained(last)})" if last is not None else ""))
            try:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                           timeout=remaining, cached=False)
                return int(low), int(high)
            except KafkaException as exc:
                last = exc.args[0]
                if last.code() in _MISSING:  # a topic created a moment ago may not be known everywhere yet
                    missing_since = missing_since or time.monotonic()
                    if time.monotonic() - missing_since < MISSING_TOPIC_GRACE_S:
                        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
                        continue
                if _permanent(last):
                    raise ChangelogError(f"{where}: cannot read its offsets: {_explained(last)}") from exc
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def _read_window(self, topic: str, partition: int, start: int, end: int, deadline: float,
                     where: str) -> _Window:
        """Read from ``start`` to the end-of-partition event at ``end`` or beyond; the last committed record
        below ``end`` (later ones were committed after the read began and are left out: the result does not
        depend on timing)."""
        self._consumer.assign([TopicPartition(topic, partition, start)])
        window = _Window()
        last_error: KafkaError | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChangelogTimeout(
                    f"{where}: not read to its end offset {end} within {self.timeout:g}s (read from {start}, "
                    f"position {self._position(topic, partition)})"
                    + (f"; last error: {last_error}" if last_error is not None else ""))
            message = self._consumer.poll(min(0.2, remaining))  # returns at the first message or event
            if message is None:
                if self._position(topic, partition) >= end:  # queue drained and position past the end
                    return window
                continue
            error = message.error()
            if error is None:
                offset = message.offset()
                if message.partition() == partition and offset is not None and start <= offset < end:
                    window.add(message)
            elif error.code() == KafkaError._PARTITION_EOF:
                if message.partition() == partition and (message.offset() or 0) >= end:
                    return window
            elif _permanent(error):
                raise ChangelogError(f"{where}: reading failed: {_explained(error)}")
            else:
                last_error = error  # transport and leader changes: librdkafka retries them itself

    def _position(self, topic: str, partition: int) -> int:
        try:
            [position] = self._consumer.position([TopicPartition(topic, partition)])
        except KafkaException:
            return -1
        return int(position.offset)


class _Window:
    """The committed records seen in one pass: only the last one is kept."""

    def __init__(self) -> None:
        self.last: Message | None = None
        self.records = 0
        self.bytes = 0

    def add(self, message: Message) -> None:
        self.last = message
        self.records += 1
        self.bytes += len(message.value() or b"") + len(message.key() or b"") + sum(
            len(name) + len(value or b"") for name, value in _headers(message))


def _headers(message: Message) -> list[tuple[str, bytes | None]]:
    """A consumed record's headers as (name, bytes) pairs (librdkafka hands out a list of those)."""
    headers = message.headers() or []
    pairs = headers.items() if isinstance(headers, dict) else headers
    return [(name, value.encode("utf-8") if isinstance(value, str) else value) for name, value in pairs]


def _explained(error: KafkaError) -> str:
    if error.code() in _MISSING:
        return (f"the topic or partition does not exist, or the principal may not describe it "
                f"({error.name()}: {error.str()})")
    return f"{error.name()}: {error.str()}"


def _permanent(error: KafkaError) -> bool:
    return bool(error.fatal()) or error.code() in _PERMANENT_ERRORS


def _entry(message: Message, where: str) -> ChangelogEntry:
    offset = message.offset()
    where = f"{where}, offset {offset}"
    if message.key() != STATE_KEY:
        raise ChangelogRecordInvalid(f"{where}: key {message.key()!r} is not {STATE_KEY!r}: not a state record")
    headers: dict[str, bytes | None] = {}
    for name, value in _headers(message):
        headers[name] = value  # a repeated header: the last one counts, as in Kafka's lastHeader
    checkpoint = headers.get(CHECKPOINT_HEADER)
    instance = headers.get(INSTANCE_HEADER)
    if checkpoint is None or instance is None:
        missing = [name for name, value in ((CHECKPOINT_HEADER, checkpoint), (INSTANCE_HEADER, instance))
                   if value is None]
        raise ChangelogRecordInvalid(f"{where}: header(s) {', '.join(missing)} missing")
    if not (checkpoint.isascii() and checkpoint.isdigit()):
        raise ChangelogRecordInvalid(f"{where}: header {CHECKPOINT_HEADER} {checkpoint!r} is not a decimal id")
    try:
        instance_name = instance.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ChangelogRecordInvalid(f"{where}: header {INSTANCE_HEADER} {instance!r} is not UTF-8") from exc
    return ChangelogEntry(message.value() or b"", int(checkpoint), instance_name, int(offset or 0))
