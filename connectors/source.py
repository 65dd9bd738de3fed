"""The Kafka source: one topic's partitions read into Arrow record batches, with an exact, committable cut.

Guarantees and what they rest on:

- **Only committed records.** The consumer runs with ``isolation.level=read_committed``, so records of
  aborted (or still open) transactions never reach a batch.
- **The cut is exact.** ``position()`` is, per owned partition, the offset after the last record *handed out*
  by ``poll_batch`` (records buffered but not yet handed out are not in it), or the end-of-partition offset
  the consumer reports when it has read a partition to its end. Transaction markers occupy offsets, so the
  end is never computed as "last offset + 1": a partition ending in markers is only seen as fully read
  through the consumer's EOF event (``enable.partition.eof``). Restoring a cut therefore neither re-reads
  nor skips.
- **Partitions come from the consumer group.** Instances of a connector subscribe with its group id
  (``cooperative-sticky`` by default; Kafka 4's consumer protocol with ``group.protocol=consumer``), so Kafka
  spreads the partitions over them; one instance is a group of one. Every assignment change goes through a
  ``PartitionListener`` *inside* the rebalance callback: on assignment it returns where each partition starts
  (the group's committed offset, after restoring the partition's state); on revocation it commits the epoch
  before the partitions go (a later commit could overwrite the new owner's offsets); on loss it aborts. Seeks
  are never done inside a callback (librdkafka refuses them there): a rewind is staged and applied by the next
  ``poll_batch``.
- **Offsets are only committed inside the sink's transaction** (``send_offsets_to_transaction`` with the
  group metadata read at commit time and the checkpoint id as offset metadata); the consumer never commits
  itself (``enable.auto.commit`` / ``enable.auto.offset.store`` off).
- **One path after the fetch.** Records arrive as Arrow columns through a fetcher (``connectors.fetched``:
  the C reader, or confluent-kafka's per-record calls), in each partition's offset order either way, with
  end-of-partition events where they happened; the cut, rebalances and decoding do not depend on which.
- **Nothing silently dropped.** A record that does not decode becomes a ``DeadLetter`` with its original
  bytes (or ``PoisonRecord`` is raised with ``on_error="halt"``); its offset still counts as read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, Self

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from connectors.admin import (
    TopicAdminError,
    committed_offsets,
    watermark_offsets,
)
from connectors.alignment import EventTimeAligner
from connectors.batch import SourceBatch
from connectors.checkpoint import SourceCheckpoint
from connectors.clients import kafka_client_config
from connectors.dead_letter import DeadLetter, PoisonRecord
from connectors.fetched import Fetched, PartitionEvent, RecordColumns, make_fetcher
from connectors.kafka_errors import MISSING_TOPIC_ERRORS, kafka_error_text, missing_topic_text
from connectors.metadata import METADATA_COLUMNS, with_metadata_fields
from connectors.watermarks import WatermarkTracker, observe_batch
from schemas import Format, FormatSpec, make_format
from schemas.base import Decoded, SchemaError, decode_column

log = logging.getLogger(__name__)

# Settings the exactly-once protocol depends on; consumer_config may repeat them but not change them.
REQUIRED_CONSUMER_CONFIG = {
    "isolation.level": "read_committed",
    "enable.auto.commit": "false",
    "enable.auto.offset.store": "false",
    "enable.partition.eof": "true",
}
GROUP_PROGRESS_INTERVAL_S = 1.0
GROUP_CONSUMER_DEFAULTS = {"partition.assignment.strategy": "cooperative-sticky", "session.timeout.ms": "10000",
                           "heartbeat.interval.ms": "1000"}
"""Group-mode defaults a user may change: cooperative-sticky moves only the partitions that must move, so a
rebalance does not stop every instance (Kafka Streams and Connect default to cooperative protocols too); a
10 s session (Kafka Streams' old default) bounds how long the partitions of a crashed instance wait.
They belong to Kafka's classic group protocol; with ``group.protocol=consumer`` (KIP-848) the broker assigns
the partitions and owns the session and heartbeat settings, so none of them is set (and a user's is an error)."""

PREFETCH_BOUND = {"queued.max.messages.kbytes": 32_768}
"""How much a source's consumer fetches ahead of what it handed out: memory does not grow with topic size."""

FETCH_DEFAULTS = {"fetch.queue.backoff.ms": "10"}
"""No one-second pause after each full prefetch queue; a user may change it (``source.consumer``). When a
partition's queued records pass ``queued.min.messages`` (100,000) or the queue passes
``queued.max.messages.kbytes``, librdkafka postpones that partition's next fetch by ``fetch.queue.backoff.ms``,
1 s by default, however fast the queue drains. A consumer doing nothing else read 1M 171-byte records at
165,000-189,000 records/s with it and at 470,000-720,000 with 10 ms, whatever the fetch size (bench/README.md,
"The fetch queue's backoff"). Memory stays bounded by ``queued.max.messages.kbytes``: the backoff only decides
how soon a drained queue is filled again. Larger fetches (8 MiB per partition, the default before) gave
nothing more once this was fixed and cost about 80 MB of peak RSS, so fetch sizes are librdkafka's."""

UNAVAILABLE_ERRORS = frozenset({KafkaError._UNKNOWN_PARTITION})
NOT_AUTHORIZED_ERRORS = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED})


class SourceError(RuntimeError):
    """The source cannot go on; the message names the source, topic and what went wrong."""


class SourceUnavailable(SourceError):
    """The broker cannot be reached (within the source's timeout): transient, worth a restart."""


class TopicMissing(SourceError):
    """The source topic does not exist: permanent, a restart would fail the same way."""


class SourceNotAuthorized(SourceError):
    """The principal may not read the topic or use the group: permanent until an operator grants it."""


# A batch's size bounds. Per-cycle costs (a DuckDB query, an Arrow JSON parse, a produce call) are paid per
# batch, so larger batches cost less CPU per record: 25,000 records against 10,000 gave 4.1-4.3 against
# 4.4-4.7 us of client CPU per record and 11% more records/s on the JSON benchmark, for about 55 MB more
# peak RSS (bench/README.md, "Batch size"). The bytes bound caps the memory of a batch of large records.
DEFAULT_MAX_BATCH_RECORDS = 25_000
DEFAULT_MAX_BATCH_BYTES = 8 << 20
ALIGNMENT_HOLD_ROWS = 250_000
ALIGNMENT_HOLD_BYTES = 32 << 20
"""An aligned source holds at most this many rows (or four batches, when that is more) or bytes of values (as
much as the consumer prefetches, ``PREFETCH_BOUND``) before it stops waiting for the partitions that hold it
back (``connectors.alignment``): room for a fetch of every partition, since librdkafka fetches a backlog
partition by partition, up to a MiB of each."""


@dataclass(frozen=True)
class SourceSettings:
    name: str
    topic: str
    format: FormatSpec
    max_batch_records: int = DEFAULT_MAX_BATCH_RECORDS
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    start_from: Literal["earliest", "latest"] = "earliest"
    event_time_column: str | None = None
    allowed_lateness_ms: int = 0
    idle_timeout_ms: int = 30_000
    on_error: Literal["dead-letter", "halt"] = "dead-letter"
    consumer_config: Mapping[str, str] = field(default_factory=dict)
    align_event_time: bool = False
    """Hand out rows in event-time order across partitions (``connectors.alignment``): for a source whose
    partitions' rows meet downstream (a repartition topic feeding a window)."""

    def __post_init__(self) -> None:
        bounds = {"max_batch_records": (self.max_batch_records, 1), "max_batch_bytes": (self.max_batch_bytes, 1),
                  "allowed_lateness_ms": (self.allowed_lateness_ms, 0), "idle_timeout_ms": (self.idle_timeout_ms, 1)}
        for name, (value, minimum) in bounds.items():
            if value < minimum:
                raise ValueError(f"source {self.name!r}: {name} must be at least {minimum}, got {value}")
        if self.start_from not in ("earliest", "latest"):
            raise ValueError(f"source {self.name!r}: start_from must be 'earliest' or 'latest', "
                             f"got {self.start_from!r}")
        if self.on_error not in ("dead-letter", "halt"):
            raise ValueError(f"source {self.name!r}: on_error must be 'dead-letter' or 'halt', got {self.on_error!r}")


class PartitionListener(Protocol):
    """Told of every assignment change, inside the rebalance callback (so before the change takes effect).

    ``assigned`` returns where each partition starts (partitions it leaves out start at ``start_from``) and
    must have restored their state when it returns; ``revoked`` commits (or abandons) the epoch while the
    partitions are still owned; ``lost`` abandons it (the group already gave them to another member)."""

    def assigned(self, source: str, partitions: list[int]) -> Mapping[int, int]: ...
    def revoked(self, source: str, partitions: list[int]) -> None: ...
    def lost(self, source: str, partitions: list[int]) -> None: ...


class KafkaSource:
    """Reads ``settings.topic``; see the module docstring for the guarantees.

    Two ways to get partitions: ``subscribe`` (streaming runs: the consumer group spreads them over
    instances, ``member`` names this one) or ``open`` (every partition, explicitly: batch jobs and tools).
    ``timeout`` bounds every blocking call to the broker (metadata, offset look-ups, committed offsets).
    ``watermarks`` advances through ``observe_event_times``, which the engine calls after it has judged
    a batch's rows late against the watermark from before that batch.
    """

    def __init__(self, settings: SourceSettings, bootstrap: str, group_id: str, *, member: str | None = None,
                 timeout: float = 10.0) -> None:
        self.settings = settings
        self.name = settings.name
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.member = member
        self.timeout = timeout
        self.format = make_format(settings.format)
        self.watermarks = WatermarkTracker(settings.allowed_lateness_ms, settings.idle_timeout_ms)
        config = self.consumer_config()
        # the consumer protocol (KIP-848) always changes assignments incrementally
        self._cooperative = (_uses_consumer_protocol(config)
                             or "cooperative" in str(config.get("partition.assignment.strategy")))
        self._consumer = Consumer(config)
        self._fetcher = make_fetcher(self._consumer, settings.topic, settings.max_batch_records)
        self._partitions: list[int] | None = None
        self._positions: dict[int, int] = {}
        self._pending = Fetched.nothing()
        self._aligner = (EventTimeAligner(settings.event_time_column,
                                          max(ALIGNMENT_HOLD_ROWS, 4 * settings.max_batch_records),
                                          max(ALIGNMENT_HOLD_BYTES, 4 * settings.max_batch_bytes),
                                          reported_end=self._reported_end)
                         if settings.align_event_time else None)
        self._listener: PartitionListener | None = None
        self._staged_seeks: dict[int, int] = {}
        self._group_checked_at = float("-inf")
        self._paused = False
        self._closed = False

    def consumer_config(self) -> dict[str, object]:
        """What the consumer is made with: epochline's defaults, then the user's ``consumer_config``, then
        what exactly-once reading requires (a user value that breaks it is a ``SourceError``)."""
        user = {key: str(value) for key, value in self.settings.consumer_config.items()}
        for key, required in REQUIRED_CONSUMER_CONFIG.items():
            if user.get(key, required).lower() != required:
                raise SourceError(f"source {self.name!r}: consumer_config {key}={user[key]!r} breaks "
                                  f"exactly-once reading; it must be {required!r}")
        # The member name is the client id, so the group (and ``epochline status``) shows which instance
        # holds what. Not static membership: a member that stops must leave the group at once, or its
        # partitions would wait out its session before anyone else may read them.
        member = {"client.id": self.member} if self.member else {}
        defaults = {"auto.offset.reset": self.settings.start_from, **PREFETCH_BOUND, **FETCH_DEFAULTS,
                    **self._group_defaults(user), **member}
        return kafka_client_config(self.bootstrap, defaults, user, REQUIRED_CONSUMER_CONFIG,
                                   {"group.id": self.group_id})

    def _group_defaults(self, user: Mapping[str, str]) -> dict[str, str]:
        """``GROUP_CONSUMER_DEFAULTS`` for the classic group protocol; none for the consumer protocol, where
        setting one of them is a ``SourceError`` naming it (the broker's group settings decide them)."""
        if not _uses_consumer_protocol(user):
            return GROUP_CONSUMER_DEFAULTS
        classic_only = sorted(set(user) & set(GROUP_CONSUMER_DEFAULTS))
        if classic_only:
            raise SourceError(f"source {self.name!r}: consumer_config {', '.join(classic_only)} belong to the "
                              "classic group protocol; with group.protocol=consumer the broker assigns partitions "
                              "and sets the session (group.consumer.* broker settings)")
        return {}

    # -- lifecycle ---------------------------------------------------------------------------------------

    def open(self, start_at: SourceCheckpoint | None = None) -> None:
        """Assign all partitions of the topic, at ``start_at`` (partitions it lacks, and every partition when
        it is None, start at ``settings.start_from``, resolved to a concrete offset now)."""
        partitions = self.partitions()
        self.watermarks.assign(partitions)
        self._assign(start_at)
        log.info("source opened", extra={"source": self.name, "topic": self.settings.topic,
                                         "offsets": dict(self._positions)})

    def subscribe(self, listener: PartitionListener) -> None:
        """Join the group; partitions arrive (and leave) through ``listener`` during ``poll_batch``. The topic
        is described first, so a missing topic or a refused permission fails here, not in a callback."""
        self.partitions()
        self._listener = listener
        self._consumer.subscribe([self.settings.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                 on_lost=self._on_lost)
        log.info("source subscribed", extra={"source": self.name, "topic": self.settings.topic,
                                             "group": self.group_id, "member": self.member})

    def restore(self, checkpoint: SourceCheckpoint) -> None:
        """Continue exactly at ``checkpoint``: buffered and prefetched records are dropped. In group mode the
        seeks are staged (this may run inside a rebalance callback) and done by the next ``poll_batch``;
        until then no record of those partitions is handed out."""
        if self._listener is None:
            self._assign(checkpoint)
        else:
            offsets = {p: o for p, o in self._checked_offsets(checkpoint).items() if p in self._positions}
            self._staged_seeks.update(offsets)
            self._positions.update(offsets)
            self._pending = self._pending.without(set(offsets))
            if self._aligner is not None:
                self._aligner.assign(offsets)
        log.info("source restored", extra={"source": self.name, "topic": self.settings.topic,
                                           "offsets": dict(checkpoint.offsets)})

    def owned(self) -> list[int]:
        """The partitions this source reads now (all of them after ``open``; the group's share after
        ``subscribe``)."""
        return sorted(self._positions)

    # -- rebalance callbacks (run inside poll, on this thread) ------------------------------------------

    def _on_assign(self, consumer: Consumer, assigned: list[TopicPartition]) -> None:
        partitions = sorted(tp.partition for tp in assigned)
        if not partitions or self._listener is None:
            return
        starts = self._listener.assigned(self.name, partitions)
        start = {p: starts[p] if p in starts else self.start_offset(p) for p in partitions}
        # Anything still buffered for these partitions was fetched under an earlier ownership: handing it out
        # now would skip from the committed offset to wherever that fetch had got.
        self._pending = self._pending.without(set(start))
        if self._aligner is not None:
            self._aligner.assign(start)
        positioned = [TopicPartition(self.settings.topic, p, start[p]) for p in partitions]
        self._fetcher.attach(partitions)
        self._change_assignment(consumer, positioned, add=True)
        if self._paused:
            consumer.pause(positioned)
        self._positions.update(start)
        self.watermarks.assign(partitions)
        log.info("partitions assigned", extra={"source": self.name, "topic": self.settings.topic,
                                               "offsets": start})

    def _on_revoke(self, consumer: Consumer, revoked: list[TopicPartition]) -> None:
        partitions = sorted(tp.partition for tp in revoked)
        if partitions and self._listener is not None:
            self._listener.revoked(self.name, partitions)
        self._forget(partitions)
        self._fetcher.detach(partitions)
        self._change_assignment(consumer, revoked, add=False)
        log.info("partitions revoked", extra={"source": self.name, "topic": self.settings.topic,
                                              "partitions": partitions})

    def _on_lost(self, consumer: Consumer, lost: list[TopicPartition]) -> None:
        partitions = sorted(tp.partition for tp in lost)
        if partitions and self._listener is not None:
            self._listener.lost(self.name, partitions)
        self._forget(partitions)
        self._fetcher.detach(partitions)
        self._change_assignment(consumer, lost, add=False)
        log.warning("partitions lost", extra={"source": self.name, "topic": self.settings.topic,
                                              "partitions": partitions})

    def _change_assignment(self, consumer: Consumer, partitions: list[TopicPartition], *, add: bool) -> None:
        """Cooperative protocols change the assignment incrementally; eager ones replace it whole."""
        if self._cooperative:
            consumer.incremental_assign(partitions) if add else consumer.incremental_unassign(partitions)
        elif add:
            consumer.assign(partitions)
        else:
            consumer.unassign()

    def _forget(self, partitions: list[int]) -> None:
        gone = set(partitions)
        for partition in gone:
            self._positions.pop(partition, None)
            self._staged_seeks.pop(partition, None)
        self._pending = self._pending.without(gone)
        if self._aligner is not None:
            self._aligner.forget(gone)
        self.watermarks.remove(gone)

    def _apply_staged_seeks(self) -> None:
        """Seek where ``restore`` asked; a partition the consumer cannot seek yet (its fetch is still
        starting) stays staged, and its records are not handed out meanwhile."""
        for partition, offset in list(self._staged_seeks.items()):
            try:
                self._consumer.seek(TopicPartition(self.settings.topic, partition, offset))
            except KafkaException as error:
                log.debug("seek deferred", extra={"source": self.name, "partition": partition,
                                                  "error": str(error)})
                continue
            del self._staged_seeks[partition]

    def close(self) -> None:
        """Leave the group. The listener is not told: closing follows the final commit (or a failure whose
        epoch the sink aborts), so the revocation closing runs must not commit anything."""
        if not self._closed:
            self._closed = True
            self._listener = None
            self._fetcher.close()
            self._consumer.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def partitions(self) -> list[int]:
        """The topic's partitions (described once); ``SourceUnavailable`` when broker or topic is missing."""
        if self._partitions is None:
            self._partitions = self._describe_topic()
        return self._partitions

    def _describe_topic(self) -> list[int]:
        topic = self.settings.topic
        try:
            metadata = self._consumer.list_topics(topic, timeout=self.timeout)
        except KafkaException as error:
            raise SourceUnavailable(f"source {self.name!r}: Kafka at {self.bootstrap} did not describe topic "
                                    f"{topic!r} within {self.timeout}s: {kafka_error_text(error)}") from error
        described = metadata.topics.get(topic)
        where = f"topic {topic!r} on {self.bootstrap}"
        if described is None:
            raise TopicMissing(f"source {self.name!r}: {missing_topic_text(topic, self.bootstrap)}")
        if described.error is not None:
            raise (self._permanent_error(where, described.error)
                   or SourceUnavailable(f"source {self.name!r}: "
                                        f"{kafka_error_text(described.error, self.bootstrap, topic)}"))
        if not described.partitions:
            raise SourceUnavailable(f"source {self.name!r}: {where} has no partitions yet")
        return sorted(described.partitions)

    def _permanent_error(self, where: str, error: KafkaError) -> SourceError | None:
        """The permanent failure an error code means, or None when it may heal (worth a retry or restart)."""
        if error.code() in MISSING_TOPIC_ERRORS:
            return TopicMissing(f"source {self.name!r}: {missing_topic_text(self.settings.topic, self.bootstrap)}")
        if error.code() in NOT_AUTHORIZED_ERRORS:
            return SourceNotAuthorized(f"source {self.name!r}: {where}: not authorized ({error.name()}: "
                                       f"{error.str()})")
        return None

    def _assign(self, checkpoint: SourceCheckpoint | None) -> None:
        offsets = self._checked_offsets(checkpoint) if checkpoint is not None else {}
        start = {p: offsets[p] if p in offsets else self.start_offset(p) for p in self.partitions()}
        topic = self.settings.topic
        self._consumer.unassign()
        self._fetcher.attach(list(start))
        self._consumer.assign([TopicPartition(topic, p, offset) for p, offset in start.items()])
        if self._paused:
            self._consumer.pause(self._consumer.assignment())
        self._positions = start
        self._pending = Fetched.nothing()
        if self._aligner is not None:
            self._aligner.forget(self._aligner.held_partitions())
            self._aligner.assign(start)

    def _checked_offsets(self, checkpoint: SourceCheckpoint) -> Mapping[int, int]:
        if checkpoint.source != self.name or checkpoint.topic != self.settings.topic:
            raise SourceError(f"source {self.name!r} on topic {self.settings.topic!r} cannot start at a "
                              f"checkpoint of source {checkpoint.source!r} on topic {checkpoint.topic!r}")
        unknown = set(checkpoint.offsets) - set(self.partitions())
        if unknown:
            raise SourceError(f"source {self.name!r}: checkpoint names partitions {sorted(unknown)} that topic "
                              f"{self.settings.topic!r} does not have (it has {self.partitions()})")
        return checkpoint.offsets

    def start_offset(self, partition: int) -> int:
        """``start_from`` as a concrete offset: the log start, or the last stable offset (read_committed)."""
        try:
            low, high = watermark_offsets(self._consumer, self.settings.topic, [partition], self.timeout)[partition]
        except TopicAdminError as error:
            raise SourceUnavailable(f"source {self.name!r} on {self.bootstrap}: {error}") from error
        return low if self.settings.start_from == "earliest" else high

    # -- reading -----------------------------------------------------------------------------------------

    def poll_batch(self, timeout: float) -> SourceBatch | None:
        """Hand out the next records (at most ``max_batch_records`` / about ``max_batch_bytes`` of values,
        at least one record), or None when none arrived within ``timeout``. Returns as soon as records are
        there: it waits for the first one only, then takes whatever the consumer has already fetched.

        Raises ``PoisonRecord`` (nothing handed out, position unchanged) when a record fails to decode and
        ``on_error == "halt"``.
        """
        if self._staged_seeks:
            self._apply_staged_seeks()
        if self._aligner is not None:
            return self._poll_aligned(self._aligner, timeout)
        if not self._pending:
            self._pending = self._owned_only(self._fetcher.fetch(timeout))
        take, value_bytes = self._records_that_fit(self._pending.records)
        taken, rest = self._pending.split(take)
        ends = self._ends_reached(taken.events)
        columns = taken.records
        source_batch = self._to_source_batch(columns, value_bytes) if len(columns) else None
        self._pending = rest
        self._advance(columns, ends)
        return source_batch

    def _poll_aligned(self, aligner: EventTimeAligner, timeout: float) -> SourceBatch | None:
        """``poll_batch`` in event-time order across partitions: fetch only when nothing held is due, and hand
        out what the aligner releases; each partition's position follows what it released."""
        batch = self._release(aligner)
        if batch is None:
            fetched = self._owned_only(self._fetcher.fetch(timeout))
            if fetched:
                ends = self._ends_reached(fetched.events)
                records = fetched.records
                decoded = self._to_source_batch(records, records.value_bytes()) if len(records) else None
                aligner.hold(decoded, records.next_offsets(), ends)
            batch = self._release(aligner)
        return batch

    def _reported_end(self, partition: int) -> int | None:
        """The partition's end as the broker last reported it with a fetch (no request is made)."""
        _, high = self._consumer.get_watermark_offsets(TopicPartition(self.settings.topic, partition), cached=True)
        return high if high >= 0 else None

    def _release(self, aligner: EventTimeAligner) -> SourceBatch | None:
        batch, cuts = aligner.release(self.watermarks.max_event_times())
        for partition, offset in cuts.items():
            if offset > self._positions.get(partition, offset):
                self._positions[partition] = offset
        return batch

    def _owned_only(self, fetched: Fetched) -> Fetched:
        """Drop what a rebalance callback (run inside this fetch) made stale: records of partitions given
        away, or of partitions whose rewind is staged (they are read again after the seek)."""
        if self._listener is None:
            return fetched
        rewound = set(self._staged_seeks)
        fresh = fetched.without((fetched.partitions() - set(self._positions)) | rewound)
        if rewound:
            self._apply_staged_seeks()
        return fresh

    def _records_that_fit(self, records: RecordColumns) -> tuple[int, int]:
        """How many of ``records`` to hand out (at least one, else as many as fit in ``max_batch_bytes``), and
        the bytes of their values."""
        if not len(records):
            return 0, 0
        value_bytes = np.cumsum(records.value_lengths())
        take = max(1, int(np.searchsorted(value_bytes, self.settings.max_batch_bytes, side="right")))
        return take, int(value_bytes[take - 1])

    def _ends_reached(self, events: Sequence[PartitionEvent]) -> dict[int, int]:
        """End-of-partition offsets from the EOF events; any other error is raised or logged."""
        ends: dict[int, int] = {}
        for event in events:
            error = event.error
            if error.code() == KafkaError._PARTITION_EOF:
                ends[event.partition] = event.offset
            elif error.fatal() or error.code() in UNAVAILABLE_ERRORS | MISSING_TOPIC_ERRORS | NOT_AUTHORIZED_ERRORS:
                where = f"topic {self.settings.topic!r} partition {event.partition} on {self.bootstrap}"
                raise (self._permanent_error(where, error)
                       or SourceUnavailable(f"source {self.name!r}: {where}: {error.str()}"))
            else:
                log.warning("consumer error", extra={"source": self.name, "topic": self.settings.topic,
                                                     "partition": event.partition, "error": error.str()})
        return ends

    def _advance(self, columns: RecordColumns, ends: Mapping[int, int]) -> None:
        for partition, offset in (*columns.next_offsets().items(), *ends.items()):
            if partition in self._positions and offset > self._positions[partition]:
                self._positions[partition] = offset

    def _to_source_batch(self, columns: RecordColumns, value_bytes: int) -> SourceBatch:
        return decode_records(self.name, self.settings.topic, self.format, columns, on_error=self.settings.on_error,
                              value_bytes=value_bytes)

    def observe_event_times(self, batch: pa.RecordBatch) -> None:
        """Advance the watermark with a batch's event times. Not done inside ``poll_batch``: the engine
        first judges the batch's rows late against the watermark from *before* it, then observes them."""
        observe_batch(self.watermarks, batch, self.settings.event_time_column)

    # -- cuts and committed offsets -----------------------------------------------------------------------

    def position(self) -> SourceCheckpoint:
        """The cut: per partition, the next offset after the last record handed out (or the partition end)."""
        return SourceCheckpoint(self.name, self.settings.topic, dict(self._positions))

    def inject_barrier(self, checkpoint_id: int) -> SourceCheckpoint:
        """The cut of epoch ``checkpoint_id``. Only handed-out records are in it, so every record a later
        ``poll_batch`` returns belongs to the next epoch."""
        cut = self.position()
        log.info("barrier", extra={"source": self.name, "checkpoint_id": checkpoint_id,
                                   "offsets": dict(cut.offsets)})
        return cut

    def reached(self, ends: Mapping[int, int]) -> bool:
        """True when every partition in ``ends`` is read up to its end offset. Positions move past trailing
        transaction markers through EOF events, so keep polling until this holds: it does not hang.

        In group mode the partitions other members own count as reached once the group's committed offsets
        reach their ends (asked at most once a second): the group as a whole is done, whoever committed."""
        others = {p: end for p, end in ends.items() if p not in self._positions}
        behind = [p for p, end in ends.items() if p in self._positions and self._positions[p] < end]
        if behind and not self._caught_up(behind, ends):
            return False
        return not others or self._group_reached(others)

    def _caught_up(self, partitions: list[int], ends: Mapping[int, int]) -> bool:
        """Take the consumer's own position where it is further: it moves past transaction markers (a
        commit marker written after the partition-EOF event was sent, or a trailing aborted transaction,
        brings no new EOF event). Only for partitions with nothing buffered: everything the consumer
        returned for them is handed out, so its position is an exact cut too."""
        buffered = self._pending.partitions() | (self._aligner.held_partitions() if self._aligner else set())
        asked = [TopicPartition(self.settings.topic, p) for p in partitions if p not in buffered]
        if asked:
            for tp in self._consumer.position(asked):
                if tp.offset > self._positions.get(tp.partition, tp.offset):
                    self._positions[tp.partition] = tp.offset
        return all(self._positions[p] >= ends[p] for p in partitions)

    def _group_reached(self, ends: Mapping[int, int]) -> bool:
        now = time.monotonic()
        if now - self._group_checked_at < GROUP_PROGRESS_INTERVAL_S:
            return False
        self._group_checked_at = now
        committed = {p: offset for p, (offset, _) in self.committed_metadata(list(ends)).items()}
        return all(committed.get(p, -1) >= end for p, end in ends.items())

    def committed(self) -> tuple[SourceCheckpoint | None, str | None]:
        """The group's committed offsets for this topic and their metadata (the checkpoint id the sink wrote),
        or ``(None, None)`` when the group committed nothing for it. One epoch commits every partition with
        the same metadata; ``committed_metadata`` has it per partition."""
        found = self.committed_metadata()
        if not found:
            return None, None
        metadata = [text for _, text in found.values()]
        if len(set(metadata)) > 1:
            log.warning("committed offsets carry different metadata", extra={
                "source": self.name, "topic": self.settings.topic,
                "metadata": {partition: text for partition, (_, text) in found.items()}})
        offsets = {partition: offset for partition, (offset, _) in found.items()}
        return SourceCheckpoint(self.name, self.settings.topic, offsets), metadata[0]

    def committed_metadata(self, partitions: list[int] | None = None) -> dict[int, tuple[int, str | None]]:
        """Per partition the group committed (of ``partitions``, default all), its offset and metadata."""
        asked = [TopicPartition(self.settings.topic, p) for p in (self.partitions() if partitions is None
                                                                  else partitions)]
        try:
            answered = committed_offsets(self._consumer, asked, self.timeout)
        except TopicAdminError as error:
            where = f"committed offsets of group {self.group_id!r} on topic {self.settings.topic!r}"
            cause = error.__cause__.args[0] if isinstance(error.__cause__, KafkaException) else None
            permanent = self._permanent_error(where, cause) if isinstance(cause, KafkaError) else None
            raise (permanent or SourceUnavailable(f"source {self.name!r}: {where} on {self.bootstrap}: {error}")
                   ) from error
        return {tp.partition: (tp.offset, tp.metadata) for tp in answered if tp.offset >= 0}

    def commit_offsets(self, offsets: list[TopicPartition]) -> None:
        """Commit as this group member, outside any transaction (the at-least-once sink's commit)."""
        self._consumer.commit(offsets=offsets, asynchronous=False)

    def consumer_group_metadata(self) -> object:
        """The consumer's group metadata, for ``Producer.send_offsets_to_transaction``."""
        return self._consumer.consumer_group_metadata()

    # -- flow control and metrics --------------------------------------------------------------------------

    def pause(self) -> None:
        """Stop fetching (backpressure); records already handed out stay handed out."""
        self._paused = True
        self._consumer.pause(self._consumer.assignment())

    def resume(self) -> None:
        self._paused = False
        self._consumer.resume(self._consumer.assignment())

    def end_offsets(self) -> dict[int, int]:
        """Per partition of the topic, its end (high watermark) now, asked of the broker."""
        try:
            offsets = watermark_offsets(self._consumer, self.settings.topic, self.partitions(), self.timeout)
        except TopicAdminError as error:
            raise SourceUnavailable(f"source {self.name!r} on {self.bootstrap}: {error}") from error
        return {partition: high for partition, (_, high) in offsets.items()}

    def lag(self) -> dict[int, int]:
        """Per partition, records between the position and the high watermark last reported by the broker
        (no request is made; partitions without a reported high watermark yet are left out)."""
        lags = {}
        for partition, position in self._positions.items():
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(self.settings.topic, partition), cached=True)
            if high >= 0:
                lags[partition] = max(0, high - position)
        return lags


def _uses_consumer_protocol(config: Mapping[str, object]) -> bool:
    """Whether a consumer config asks for Kafka 4's consumer group protocol (KIP-848) instead of the classic one."""
    return str(config.get("group.protocol", "classic")).lower() == "consumer"


def decode_records(source: str, topic: str, value_format: Format, columns: RecordColumns, *,
                   on_error: Literal["dead-letter", "halt"] = "dead-letter", value_bytes: int = 0) -> SourceBatch:
    """Records as a ``SourceBatch``: values decoded with ``value_format`` plus the metadata columns, and a
    ``DeadLetter`` (original bytes, reason) for each record that does not decode, or ``PoisonRecord`` for
    the first one when ``on_error`` is ``halt``. Kafka sources and the broker-free test driver both decode
    here, so a test on the driver sees what a run sees."""
    decoded = decode_column(value_format, columns.values)
    dead_letters = [DeadLetter(topic, *columns.record(f.index), f.reason, "decode") for f in decoded.failures]
    if dead_letters:
        if on_error == "halt":
            raise PoisonRecord(dead_letters[0])
        log.warning("records dead-lettered", extra={"source": source, "topic": topic, "count": len(dead_letters),
                                                    "first": dead_letters[0].describe()})
    return SourceBatch(source, _with_metadata(source, topic, decoded, columns), dead_letters, value_bytes)


def _with_metadata(source: str, topic: str, decoded: Decoded, columns: RecordColumns) -> pa.RecordBatch:
    clash = set(decoded.batch.schema.names) & set(METADATA_COLUMNS)
    if clash:
        raise SchemaError(f"source {source!r}: topic {topic!r} values have columns "
                          f"{sorted(clash)} that collide with the Kafka metadata columns")
    arrays = columns.metadata_arrays()
    if decoded.rows_per_record != 1 or len(decoded.indices) != len(columns.values):
        rows = pa.array(decoded.indices, type=pa.int64())
        arrays = [array.take(rows) for array in arrays]
    schema = with_metadata_fields(decoded.batch.schema)
    return pa.RecordBatch.from_arrays([*decoded.batch.columns, *arrays], schema=schema)
