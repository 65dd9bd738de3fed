"""What every sink is (``Sink``), its settings, and ``KafkaWriter``: encode Arrow rows and produce them."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, cast

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from connectors.admin import MISSING_TOPIC_GRACE_S
from connectors.clients import kafka_client_config
from connectors.dead_letter import DeadLetter
from connectors.kafka_errors import MISSING_TOPIC_ERRORS, missing_topic_text
from connectors.metadata import is_metadata_column
from schemas import Format
from schemas.base import EncodeError, encode_column
from sinks.calls import with_retries
from sinks.errors import (
    NOT_AUTHORIZED_CODES,
    CallInterrupted,
    EpochAborted,
    SinkError,
    SinkTopicMissing,
    classify,
    not_authorized,
)
from sinks.produce import Headers, produce_all, produce_waiting

FLUSH_SLICE_S = 0.5
TOPIC_RECHECK_S = 0.2


@dataclass(frozen=True)
class SinkSettings:
    topic: str | None
    """The output topic; None when the rows go to an external sink and only offsets, dead letters and
    changelogs go through this producer."""
    transactional_id: str
    group_id: str
    dead_letter_topic: str | None = None
    key_column: str | None = None
    include_metadata: Sequence[str] = ()
    transaction_timeout_ms: int = 60_000
    producer_config: dict[str, str] = field(default_factory=dict)
    client_config: dict[str, str] = field(default_factory=dict)  # security settings, for every client
    max_queued_messages: int = 500_000


class Unwritten(NamedTuple):
    """Row ``row`` of the table given to ``write`` was not written: its value does not encode in the sink's
    format (``reason`` is the format's ``EncodeError``). The caller dead-letters it."""

    row: int
    reason: str


class Produced(NamedTuple):
    """What one ``write`` handed to the producer: records and the bytes of their encoded values, and the rows
    it could not encode."""

    records: int
    bytes: int
    unwritten: tuple[Unwritten, ...] = ()

    def __add__(self, other: object) -> Produced:
        if not isinstance(other, Produced):
            return NotImplemented
        return Produced(self.records + other.records, self.bytes + other.bytes, self.unwritten + other.unwritten)


def produced(values: Sequence[bytes | None], unwritten: Sequence[Unwritten] = ()) -> Produced:
    """What handing ``values`` to a producer counts as."""
    return Produced(len(values), sum(map(len, filter(None, values))), tuple(unwritten))


def produced_column(values: pa.Array[Any], unwritten: Sequence[Unwritten] = ()) -> Produced:
    """What handing the rows of the binary array ``values`` to a producer counts as."""
    return Produced(len(values), int(pc.sum(pc.binary_length(cast(pa.BinaryArray, values))).as_py() or 0),
                    tuple(unwritten))


def dead_letter_topic(settings: SinkSettings, letters: Sequence[DeadLetter]) -> str:
    """Where ``letters`` go; a config without a dead-letter topic cannot take them (nothing is dropped)."""
    if settings.dead_letter_topic is None:
        raise SinkError(f"{len(letters)} dead-letter records but no dead_letter topic is configured")
    return settings.dead_letter_topic


class OffsetCommit(NamedTuple):
    """Offsets one consumer read, each carrying its metadata, and that consumer's group metadata (read at
    commit time: it names the member and generation the group coordinator checks, so a member whose
    partitions moved cannot commit them)."""

    offsets: list[TopicPartition]
    group_metadata: object
    commit_through: Callable[[list[TopicPartition]], None] | None = None
    """How the group member that read the offsets commits them outside a transaction (at-least-once): a
    commit by anyone else is refused while the group has members ("Unknown member")."""


class OutgoingRecord(NamedTuple):
    """A record for an explicit partition (changelog and repartition records), produced in the open epoch."""

    topic: str
    partition: int
    value: bytes | None
    key: bytes | None = None
    headers: Headers | None = None


class Sink(Protocol):
    """What the pipeline needs of a sink, whatever its delivery guarantee."""

    def start(self) -> None: ...
    def begin_epoch(self) -> None: ...
    def write(self, table: pa.Table) -> Produced: ...
    def write_dead_letters(self, letters: Iterable[DeadLetter]) -> int: ...
    def write_records(self, records: Sequence[OutgoingRecord]) -> Produced: ...
    def commit_epoch(self, commits: Sequence[OffsetCommit]) -> None: ...
    def abort_epoch(self) -> None: ...
    def is_backpressured(self) -> bool: ...
    def close(self) -> None: ...


class EncodedRows(NamedTuple):
    values: list[bytes | None]
    keys: list[bytes | None] | None
    unwritten: list[Unwritten]


class EncodedColumn(NamedTuple):
    """One batch of output rows encoded: the values, their keys (or None), and the rows left out."""

    values: pa.Array[Any]
    keys: pa.Array[Any] | None
    unwritten: list[Unwritten]


def encode_rows(table: pa.Table, value_format: Format, settings: SinkSettings) -> EncodedRows:
    """Output rows as the records a sink produces: values in the sink's format without the Kafka metadata
    columns (unless ``include_metadata`` keeps some), keys from ``key_column``; a row whose value does not
    encode is left out and named in ``unwritten``. Kafka sinks and the broker-free test driver both encode
    here (``encode_columns`` as Arrow columns)."""
    values: list[bytes | None] = []
    keys: list[bytes | None] = []
    unwritten: list[Unwritten] = []
    for encoded in encode_columns(table, value_format, settings):
        values += encoded.values.to_pylist()
        keys += encoded.keys.to_pylist() if encoded.keys is not None else []
        unwritten += encoded.unwritten
    return EncodedRows(values, keys if settings.key_column else None, unwritten)


def encode_columns(table: pa.Table, value_format: Format, settings: SinkSettings) -> Iterator[EncodedColumn]:
    """``encode_rows`` as Arrow binary arrays, per batch of rows."""
    keys = _key_column(table, settings)
    start = 0
    for batch in _value_rows(table, settings).to_batches():
        values, kept, unwritten = _encoded_batch(value_format, batch, start)
        batch_keys = keys.slice(start, batch.num_rows) if keys is not None else None
        if batch_keys is not None and kept is not None:
            batch_keys = batch_keys.take(pa.array(kept, pa.int64()))
        yield EncodedColumn(values, batch_keys, unwritten)
        start += batch.num_rows


def _encoded_batch(value_format: Format, batch: pa.RecordBatch,
                   start: int) -> tuple[pa.Array[Any], list[int] | None, list[Unwritten]]:
    """The batch's values (binary), the positions in the batch of the rows they hold (None: every row) and the
    rows that do not encode, at their position in the table (``start`` is the batch's first row there).

    A batch is encoded whole; only when the format refuses it (``EncodeError``: a value that does not fit
    the sink's schema) is each row encoded alone, so one bad row costs its own dead letter and not its batch.
    """
    try:
        return _binary(encode_column(value_format, batch)), None, []
    except EncodeError:
        pass
    values: list[pa.Array[Any]] = []
    kept: list[int] = []
    unwritten: list[Unwritten] = []
    for row in range(batch.num_rows):
        try:
            values.append(_binary(encode_column(value_format, batch.slice(row, 1))))
        except EncodeError as error:
            unwritten.append(Unwritten(start + row, str(error)))
        else:
            kept.append(row)
    return (pa.concat_arrays(values) if values else pa.array([], pa.binary())), kept, unwritten


def _binary(encoded: pa.ChunkedArray[Any]) -> pa.Array[Any]:
    values = encoded.combine_chunks()
    return values if pa.types.is_binary(values.type) else values.cast(pa.binary())


def _value_rows(table: pa.Table, settings: SinkSettings) -> pa.Table:
    return table.select(written_columns(table.column_names, settings.include_metadata))


def written_columns(names: Sequence[str], include_metadata: Sequence[str]) -> list[str]:
    """The columns of the output a sink writes into each value: all but the Kafka metadata columns, of which
    it keeps those ``include_metadata`` lists."""
    return [name for name in names if not is_metadata_column(name) or name in include_metadata]


def _key_column(table: pa.Table, settings: SinkSettings) -> pa.Array[Any] | None:
    """``key_column`` as binary: bytes as they are, anything else as its text in UTF-8."""
    if not settings.key_column:
        return None
    column = table.column(settings.key_column).combine_chunks()
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        column = column.cast(pa.string())
    return column.cast(pa.binary())


PURGED_CODES = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
"""Records librdkafka dropped because something else failed the transaction first: their delivery reports
can come before the one that says why, so the epoch's error names a record that failed for a reason of its
own (a record the broker refused as too large, say) when there is one."""


class KafkaWriter:
    """Encodes Arrow rows and produces them; shared by both delivery guarantees.

    Delivery reports are requested only for failures (``delivery.report.only.error``), so success costs
    nothing per record, and a failed delivery is never lost: it is remembered and raised at the next
    flush, before any offset that covers it is committed.
    """

    def __init__(self, settings: SinkSettings, bootstrap: str, value_format: Format | None,
                 extra: dict[str, object]):
        self.settings = settings
        self.bootstrap = bootstrap
        self._format = value_format
        self._failed: list[tuple[bool, str]] = []
        """Each failed delivery of the epoch: whether the record was purged (a consequence), and the reason."""
        self._not_authorized: SinkError | None = None
        self.interrupted: Callable[[], bool] = lambda: False
        """Polled while calls are retried: set by the engine so a stop signal ends the retries."""
        defaults: dict[str, object] = {
            "linger.ms": 5,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": settings.max_queued_messages,
            "queue.buffering.max.kbytes": 65_536,  # memory is bounded by these queues, not by topic size
            "compression.type": "lz4",
            "delivery.report.only.error": True,
            "on_delivery": self._on_delivery,
        }
        self.producer = Producer(kafka_client_config(bootstrap, defaults, extra, settings.producer_config))

    def check_topics(self) -> None:
        """Ask the broker about each topic this sink writes: the output topic, then the dead-letter topic (or
        the output topic again). A missing one fails the start (``SinkTopicMissing``) and a refused one too
        (``SinkNotAuthorized``), each naming the topic, instead of every epoch failing on its delivery
        timeout and the connector restarting in vain. Two requests, whatever the config: they are also what
        a transactional start waits on before it asks for its producer id (``TransactionalKafkaSink.start``).
        On a broker that creates topics on demand (``auto.create.topics.enable``), the request creates a
        missing topic, as the first record produced to it would."""
        topics = [(topic, role) for topic, role in ((self.settings.topic, "sink"),
                                                    (self.settings.dead_letter_topic, "dead letters")) if topic]
        for topic, role in (topics * 2)[:2]:  # two requests, also for one topic; none for a producer without
            self._check_topic(topic, role)    # topics (an external sink's epochs, no dead-letter topic)

    def _check_topic(self, topic: str, role: str) -> None:
        where = f"{role}: topic {topic!r} on {self.bootstrap}"
        deadline = time.monotonic() + MISSING_TOPIC_GRACE_S
        while True:
            metadata = with_retries(lambda: self.producer.list_topics(topic, timeout=5), f"describing {where}",
                                    interrupted=self.interrupted)
            described = metadata.topics.get(topic)
            error = described.error if described is not None else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
            if error is None:
                return
            if error.code() in NOT_AUTHORIZED_CODES:
                raise not_authorized(f"producing to topic {topic!r}", error)
            if error.code() not in MISSING_TOPIC_ERRORS:
                return  # e.g. a leader being elected, or a topic being created on demand: records wait for it
            if self.interrupted():
                raise CallInterrupted(f"describing {where}: stop requested while waiting for the topic")
            if time.monotonic() >= deadline:
                raise SinkTopicMissing(f"{role}: {missing_topic_text(topic, self.bootstrap)} (or let the broker "
                                       "create topics on demand)")
            time.sleep(TOPIC_RECHECK_S)

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            return
        if error.code() in NOT_AUTHORIZED_CODES:
            self._not_authorized = not_authorized(f"producing to topic {message.topic()!r}", error)
        purged = error.code() in PURGED_CODES
        self._failed.append((purged, f"{message.topic()}[{message.partition()}]: {error.str()}"))

    def write(self, table: pa.Table) -> Produced:
        """Encode and produce every row; returns how many records (and value bytes) went to the producer."""
        if table.num_rows == 0:
            return Produced(0, 0)
        topic, value_format = self._output()
        values, keys, unwritten = encode_rows(table, value_format, self.settings)
        self._produce(topic, values, keys)
        return produced(values, unwritten)

    def _output(self) -> tuple[str, Format]:
        """The output topic and its format; a producer made for an external sink's epochs has neither."""
        if self.settings.topic is None or self._format is None:
            raise SinkError("rows written to a Kafka producer that has no output topic (the connector's sink "
                            "is not Kafka)")
        return self.settings.topic, self._format

    def _produce(self, topic: str, values: list[bytes | None], keys: list[bytes | None] | None = None,
                 headers: list[Headers] | None = None) -> None:
        with self._refused_as_sink_error(f"producing to topic {topic!r}"):
            produce_all(self.producer, topic, values, keys, headers)

    @contextmanager
    def _refused_as_sink_error(self, what: str) -> Iterator[None]:
        """A ``produce`` the client refuses (e.g. fenced, or no transaction open) raises the ``SinkError``
        that says what it means, ``what`` naming the topic (and partition)."""
        try:
            yield
        except KafkaException as exc:
            raise self._produce_failure(exc, what) from exc

    def _produce_failure(self, exc: KafkaException, what: str) -> SinkError:
        """What a refused ``produce`` means; "Local: Fatal error" is told apart by the fatal error itself."""
        error: KafkaError = exc.args[0]
        if error.code() == KafkaError._FATAL:
            error = self._fatal_cause() or error
        return classify(error, what) or SinkError(f"{what}: {error.str()}")

    def _fatal_cause(self) -> KafkaError | None:
        """Which fatal error stopped the producer (fenced, or something a new producer gets past); None when
        this kind of producer cannot tell."""
        return None

    def write_records(self, records: Sequence[OutgoingRecord]) -> Produced:
        """Produce records to the partitions they name (state changelogs, repartitioned rows)."""
        for record in records:
            with self._refused_as_sink_error(f"producing to topic {record.topic!r} partition {record.partition}"):
                produce_waiting(self.producer, record.topic, record.value, record.key, record.headers,
                                partition=record.partition)
        return produced([record.value for record in records])

    def write_dead_letters(self, letters: Iterable[DeadLetter]) -> int:
        letters = list(letters)
        if not letters:
            return 0
        self._produce(
            dead_letter_topic(self.settings, letters),
            [letter.value or b"" for letter in letters],
            [letter.key for letter in letters],
            [letter.headers() for letter in letters],
        )
        return len(letters)

    def flush(self, timeout: float) -> None:
        """Wait until every record is acknowledged; a failed delivery raises before offsets move.

        Waits in half-second slices, so a signal's handler runs while records are in flight (a second stop
        signal stops at once even when the broker is gone), and no longer once a record has failed: the epoch
        fails anyway, and a transaction that failed sends nothing more, so its queued records would only
        keep the wait going until the timeout (seen in CI: 60 s, then an error naming no cause)."""
        deadline = time.monotonic() + timeout
        remaining = self._flush_slice(min(FLUSH_SLICE_S, timeout))
        while remaining and not self._failed and time.monotonic() < deadline:
            remaining = self._flush_slice(min(FLUSH_SLICE_S, max(0.0, deadline - time.monotonic())))
        if self._not_authorized is not None:
            raise self._not_authorized
        if self._failed:
            failed, self._failed = self._failed, []
            cause = next((reason for purged, reason in failed if not purged), failed[0][1])
            raise EpochAborted(f"{len(failed)} records failed delivery, e.g. {cause}")
        if remaining:
            raise EpochAborted(f"{remaining} records to {self.settings.topic} were not delivered within {timeout}s")

    def _flush_slice(self, timeout: float) -> int:
        """One ``flush``; a fatal error raised inside it (fenced while records were in flight) is the sink
        error it stands for. confluent-kafka 2.x raises that error from ``flush``; when a delivery callback
        then runs with the exception pending, Python reports a SystemError caused by it instead."""
        try:
            return self.producer.flush(timeout)
        except KafkaException as exc:
            raise self._produce_failure(exc, f"flushing records to {self.settings.topic!r}") from exc
        except SystemError as exc:
            if not isinstance(exc.__cause__, KafkaException):
                raise
            raise self._produce_failure(exc.__cause__, f"flushing records to {self.settings.topic!r}") from exc

    def is_backpressured(self) -> bool:
        return len(self.producer) > self.settings.max_queued_messages // 2
