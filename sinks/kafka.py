"""Kafka sinks: the transactional producer whose commit *is* the checkpoint, and an at-least-once one.

Why the transaction is the commit point: librdkafka cannot resume a transaction that another process (or
producer instance) opened; ``init_transactions`` on the same ``transactional.id`` aborts it and fences the
old instance. So a "prepare at the barrier, commit later" sink loses the epoch when the process dies in
between. Instead, one Kafka transaction holds one checkpoint epoch: the epoch's output records, its
dead-letter records, and the source offsets with the checkpoint id in their metadata. When
``commit_transaction`` returns, the epoch exists; before that, nothing of it does.

Error classes follow librdkafka: ``retriable()`` retries the same call, ``txn_requires_abort()`` raises
``EpochAborted`` (the caller aborts, rewinds to the last committed cut and goes on), fatal or fenced
errors raise ``ProducerFenced``/``SinkFatal`` (the caller stops, clearly).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from connectors.dead_letter import DeadLetter
from engine import faults
from schemas import Format

log = logging.getLogger(__name__)

T = TypeVar("T")
METADATA_PREFIX = "__kafka_"
CHECKPOINT_METADATA_PREFIX = "epochline:checkpoint="
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


def checkpoint_metadata(checkpoint_id: int) -> str:
    """The offset metadata string that names the checkpoint an offset commit belongs to."""
    return f"{CHECKPOINT_METADATA_PREFIX}{checkpoint_id}"


def tagged(offsets: Iterable[TopicPartition], metadata: str) -> list[TopicPartition]:
    """Offsets carrying ``metadata`` (which names the checkpoint or batch item): recovery reads it back."""
    return [TopicPartition(tp.topic, tp.partition, tp.offset, metadata=metadata) for tp in offsets]


def checkpoint_id_from_metadata(metadata: str | None) -> int | None:
    if not metadata or not metadata.startswith(CHECKPOINT_METADATA_PREFIX):
        return None
    return int(metadata[len(CHECKPOINT_METADATA_PREFIX):])


@dataclass(frozen=True)
class SinkSettings:
    topic: str
    transactional_id: str
    group_id: str
    dead_letter_topic: str | None = None
    key_column: str | None = None
    include_metadata: Sequence[str] = ()
    transaction_timeout_ms: int = 60_000
    producer_config: dict[str, str] = field(default_factory=dict)
    max_queued_messages: int = 500_000


class Sink(Protocol):
    """What the pipeline needs of a sink, whatever its delivery guarantee."""

    def start(self) -> None: ...
    def begin_epoch(self) -> None: ...
    def write(self, table: pa.Table) -> int: ...
    def write_dead_letters(self, letters: Iterable[DeadLetter]) -> int: ...
    def commit_epoch(self, offsets: list[TopicPartition], metadata: str, group_metadata: object) -> None: ...
    def abort_epoch(self) -> None: ...
    def is_backpressured(self) -> bool: ...
    def close(self) -> None: ...


def _classify(error: KafkaError, what: str) -> SinkError | None:
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


def _with_retries(call: Callable[[], T], what: str, deadline_s: float = 120.0) -> T:
    """Run a transactional API call, retrying only what librdkafka calls retriable, up to a deadline."""
    deadline = time.monotonic() + deadline_s
    backoff = 0.1
    while True:
        try:
            return call()
        except KafkaException as exc:
            failure = _classify(exc.args[0], what)
            if failure is not None:
                raise failure from exc
            if time.monotonic() > deadline:
                raise SinkError(f"{what}: still failing after {deadline_s:.0f}s: {exc.args[0].str()}") from exc
            log.warning("retrying transactional call", extra={"call": what, "error": exc.args[0].str()})
            time.sleep(backoff)
            backoff = min(backoff * 2, 2.0)


def _within_deadline(call: Callable[[], T], what: str, deadline_s: float) -> T:
    """Run a blocking librdkafka call on a helper thread and give up on it after ``deadline_s``.

    Why: ``send_offsets_to_transaction`` can block past its own timeout when the group coordinator
    restarts (librdkafka issues #5456, #5511). A call that never returns would freeze the connector with
    its transaction open, holding back every read_committed reader. Giving up raises ``ProducerWedged``:
    the connector then restarts from the last committed checkpoint with a new producer, whose
    ``init_transactions`` fences the wedged one.
    """
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # handed to the caller below
            outcome["error"] = error

    worker = threading.Thread(target=run, name=f"epochline-{what}", daemon=True)
    worker.start()
    worker.join(deadline_s)
    if worker.is_alive():
        raise ProducerWedged(f"{what} did not return within {deadline_s:.0f}s; restarting with a new producer")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome.get("value")  # type: ignore[return-value]


def _key_bytes(column: pa.ChunkedArray) -> list[bytes | None]:
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return column.to_pylist()
    return [None if v is None else v.encode() for v in column.cast(pa.string()).to_pylist()]


class KafkaWriter:
    """Encodes Arrow rows and produces them; shared by both delivery guarantees.

    Delivery reports are requested only for failures (``delivery.report.only.error``), so success costs
    nothing per record, and a failed delivery is never lost: it is remembered and raised at the next
    flush, before any offset that covers it is committed.
    """

    def __init__(self, settings: SinkSettings, bootstrap: str, value_format: Format, extra: dict[str, object]):
        self.settings = settings
        self._format = value_format
        self._failed: list[str] = []
        config: dict[str, object] = {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": settings.max_queued_messages,
            "queue.buffering.max.kbytes": 65_536,  # memory is bounded by these queues, not by topic size
            "compression.type": "lz4",
            "delivery.report.only.error": True,
            "on_delivery": self._on_delivery,
            **extra,
            **settings.producer_config,
        }
        self.producer = Producer(config)

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._failed.append(f"{message.topic()}[{message.partition()}]: {error.str()}")

    def _output_columns(self, table: pa.Table) -> pa.Table:
        keep = [name for name in table.column_names
                if not name.startswith(METADATA_PREFIX) or name in self.settings.include_metadata]
        return table.select(keep)

    def write(self, table: pa.Table) -> int:
        """Encode and produce every row; returns the number of records handed to the producer."""
        if table.num_rows == 0:
            return 0
        keys = _key_bytes(table.column(self.settings.key_column)) if self.settings.key_column else None
        output = self._output_columns(table)
        values: list[bytes] = []
        for batch in output.to_batches():
            values += self._format.encode(batch)
        self._produce_all(self.settings.topic, values, keys)
        return len(values)

    def _produce_all(self, topic: str, values: list[bytes], keys: list[bytes | None] | None,
                     headers: list[list[tuple[str, bytes]]] | None = None) -> None:
        """Hand every record to librdkafka. The keyless, headerless case is a pipeline's hot path, so it
        calls ``produce`` with positional arguments only, which is measurably cheaper per record."""
        try:
            if keys is None and headers is None:
                produce = self.producer.produce
                for value in values:
                    try:
                        produce(topic, value)
                    except BufferError:
                        self._produce_when_queue_frees(topic, value, None, None)
            else:
                for index, value in enumerate(values):
                    self._produce_when_queue_frees(topic, value, keys[index] if keys is not None else None,
                                                   headers[index] if headers is not None else None)
        except KafkaException as exc:  # e.g. fenced, or no transaction open
            what = f"produce to {topic}"
            raise _classify(exc.args[0], what) or SinkError(f"{what}: {exc.args[0].str()}") from exc
        self.producer.poll(0)

    def _produce_when_queue_frees(self, topic: str, value: bytes, key: bytes | None,
                                  headers: list[tuple[str, bytes]] | None) -> None:
        """``produce``, serving delivery reports while librdkafka's local queue is full."""
        while True:
            try:
                self.producer.produce(topic, value, key, headers=headers)
                return
            except BufferError:
                self.producer.poll(0.05)

    def write_dead_letters(self, letters: Iterable[DeadLetter]) -> int:
        letters = list(letters)
        if not letters:
            return 0
        if self.settings.dead_letter_topic is None:
            raise SinkError(f"{len(letters)} dead-letter records but no dead_letter topic is configured")
        self._produce_all(
            self.settings.dead_letter_topic,
            [letter.value or b"" for letter in letters],
            [letter.key for letter in letters],
            [letter.headers() for letter in letters],
        )
        return len(letters)

    def flush(self, timeout: float) -> None:
        """Wait until every record is acknowledged; a failed delivery raises before offsets move."""
        remaining = self.producer.flush(timeout)
        if remaining:
            raise EpochAborted(f"{remaining} records to {self.settings.topic} were not delivered within {timeout}s")
        if self._failed:
            failed, self._failed = self._failed, []
            raise EpochAborted(f"{len(failed)} records failed delivery, e.g. {failed[0]}")

    def is_backpressured(self) -> bool:
        return len(self.producer) > self.settings.max_queued_messages // 2


class TransactionalKafkaSink(KafkaWriter):
    """Exactly-once: one Kafka transaction per checkpoint epoch, offsets committed inside it."""

    def __init__(self, settings: SinkSettings, bootstrap: str, value_format: Format):
        super().__init__(settings, bootstrap, value_format, {
            "transactional.id": settings.transactional_id,
            "transaction.timeout.ms": settings.transaction_timeout_ms,
        })
        self._in_transaction = False
        self._wedged = False

    def start(self) -> None:
        """Fence every earlier instance and abort whatever it left open (``init_transactions``)."""
        _with_retries(lambda: self.producer.init_transactions(30), f"init_transactions({self.settings.transactional_id})")
        log.info("transactional producer ready", extra={"transactional_id": self.settings.transactional_id})

    def begin_epoch(self) -> None:
        if not self._in_transaction:
            _with_retries(self.producer.begin_transaction, "begin_transaction")
            self._in_transaction = True

    def commit_epoch(self, offsets: list[TopicPartition], metadata: str, group_metadata: object) -> None:
        """The commit point: flush, send the offsets tagged with ``metadata`` (the checkpoint id), commit."""
        self.begin_epoch()
        self.flush(self.settings.transaction_timeout_ms / 1000)
        try:
            if offsets:
                marked = tagged(offsets, metadata)
                _with_retries(lambda: _within_deadline(
                    lambda: self.producer.send_offsets_to_transaction(marked, group_metadata, 30),
                    "send_offsets_to_transaction", 90), f"send_offsets_to_transaction({metadata})")
            faults.maybe_crash("between-flush-and-commit")
            _with_retries(lambda: _within_deadline(lambda: self.producer.commit_transaction(60),
                                                   "commit_transaction", 120), f"commit_transaction({metadata})")
        except ProducerWedged:
            self._wedged = True
            raise
        self._in_transaction = False

    def abort_epoch(self) -> None:
        if self._in_transaction:
            _with_retries(lambda: self.producer.abort_transaction(60), "abort_transaction")
            self._in_transaction = False
        self._failed.clear()

    def close(self) -> None:
        """Leave nothing open: an uncommitted epoch is aborted, not left to time out and block readers.
        A wedged producer is left alone: the next instance's ``init_transactions`` aborts its epoch."""
        if self._wedged:
            return
        try:
            self.abort_epoch()
        except SinkError as error:
            log.warning("abort on close failed", extra={"error": str(error)})
        self.producer.flush(5)


class AtLeastOnceKafkaSink(KafkaWriter):
    """At-least-once: idempotent producer, offsets committed after every record of the epoch is delivered.

    The trade-off: no transaction, so readers see records as soon as they are written (lower latency, no
    transaction markers), but a crash after delivery and before the offset commit replays that epoch's
    input, duplicating its output.
    """

    def __init__(self, settings: SinkSettings, bootstrap: str, value_format: Format):
        super().__init__(settings, bootstrap, value_format, {"enable.idempotence": True})
        self._committer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": settings.group_id, "enable.auto.commit": False,
        })

    def start(self) -> None:
        return None

    def begin_epoch(self) -> None:
        return None

    def commit_epoch(self, offsets: list[TopicPartition], metadata: str, group_metadata: object) -> None:
        self.flush(self.settings.transaction_timeout_ms / 1000)
        if offsets:
            try:
                self._committer.commit(offsets=tagged(offsets, metadata), asynchronous=False)
            except KafkaException as exc:
                raise EpochAborted(f"committing offsets ({metadata}) failed: {exc.args[0].str()}") from exc

    def abort_epoch(self) -> None:
        """Records already written stay written: at-least-once readers may see them twice after a rewind."""
        self._failed.clear()

    def close(self) -> None:
        self.producer.flush(10)
        self._committer.close()
