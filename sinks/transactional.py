"""The exactly-once sink: one Kafka transaction per checkpoint epoch, offsets committed inside it.

Why the transaction is the commit point: librdkafka cannot resume a transaction that another process (or
producer instance) opened; ``init_transactions`` on the same ``transactional.id`` aborts it and fences the
old instance. So a "prepare at the barrier, commit later" sink loses the epoch when the process dies in
between. Instead, one Kafka transaction holds one checkpoint epoch: the epoch's output records, its
dead-letter records, and the source offsets with the checkpoint id in their metadata. When
``commit_transaction`` returns, the epoch exists; before that, nothing of it does.

Output rows go to librdkafka through the C module when it is there (``connectors.native_io``), as Arrow
columns with no Python object per record. That is safe here and only here: such records are not reported to
the delivery callback, but a failed one puts the transaction in an abortable state, so the epoch's commit
fails and nothing of it becomes visible. Its commit error does not say why ("N message(s) failed
delivery"), so rows go record by record, whose delivery reports name the reason (a missing WRITE permission
fails the connector at once), until an epoch with rows has committed, and again after any aborted epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException

from connectors.native_io import native_io
from schemas import Format
from sinks.calls import with_retries, within_deadline
from sinks.errors import CallAbandoned, ProducerWedged, SinkError
from sinks.produce import produce_column
from sinks.writer import KafkaWriter, OffsetCommit, Produced, SinkSettings, encode_columns, produced_column

log = logging.getLogger(__name__)

TXN_CALL_S = 5.0
"""How long one ``send_offsets_to_transaction`` or ``commit_transaction`` call is asked to wait. A call that
times out is retried (librdkafka resumes the operation in flight) until ``with_retries``' deadline, so a slow
commit still completes. A stop signal does not wait for it: with the transaction coordinator gone,
``send_offsets_to_transaction`` waits out its request timeout (``socket.timeout.ms``) whatever it is given, so
``within_deadline`` gives up on the call in flight when a stop is requested (``CallAbandoned``)."""
WEDGE_MARGIN_S = 10.0
"""Beyond the longest a working call takes, before it is given up as wedged (``wedged_after_s``)."""


def wedged_after_s(transaction_timeout_ms: int) -> float:
    """How long a ``send_offsets_to_transaction`` or ``commit_transaction`` call may stay in flight before the
    producer is given up as wedged (``within_deadline``) and the connector restarts from its last committed
    checkpoint with a new producer.

    A working call returns within ``TXN_CALL_S`` once its request is answered, and a request waits at most
    ``socket.timeout.ms``, which librdkafka keeps within 0.1 s of the transaction timeout for a transactional
    producer (0.1 s under it by default; more than 0.1 s over it is refused), and by then the broker has
    aborted the transaction anyway. A call past that is wedged: after the broker holding the group
    coordinator restarts, ``send_offsets_to_transaction`` may never return (librdkafka #5456, #5511: so in
    9 of 11 single-broker restarts measured, the broker back 10 s after it went). Giving up loses no epoch (the
    new producer's ``init_transactions`` fences this one, completing a commit that reached the coordinator
    and aborting anything else), so the bound is a working call's worst case plus ``WEDGE_MARGIN_S``, not
    more: a run of 60k records through such a restart
    (``test_pipeline_recovers_from_a_broker_restart_with_exact_output``, 10 s transaction timeout, so 25 s
    here) took 126-135 s with the fixed 90 s bound this replaces, 44-61 s with this one."""
    return (transaction_timeout_ms + 100) / 1000 + TXN_CALL_S + WEDGE_MARGIN_S


class TransactionalKafkaSink(KafkaWriter):
    """Exactly-once: one Kafka transaction per checkpoint epoch, offsets committed inside it.

    ``before_commit`` runs after the epoch's records are flushed and its offsets sent, right before
    ``commit_transaction``: the worst moment to crash, where crash tests inject one (``engine.testing.faults``).
    """

    def __init__(self, settings: SinkSettings, bootstrap: str, value_format: Format | None,
                 before_commit: Callable[[], None] | None = None):
        super().__init__(settings, bootstrap, value_format, {
            "transactional.id": settings.transactional_id,
            "transaction.timeout.ms": settings.transaction_timeout_ms,
        })
        self._before_commit = before_commit
        self._in_transaction = False
        self._wedged = False
        self._native = native_io()
        self._rows_proven = False
        """Whether an epoch whose rows went record by record has committed since the last abort."""
        self._rows_this_epoch = False
        self._wedged_after_s = wedged_after_s(settings.transaction_timeout_ms)

    def write(self, table: pa.Table) -> Produced:
        """Encode and produce every row: through the C module once rows are proven to commit, else (and
        without the module) record by record."""
        self._rows_this_epoch |= table.num_rows > 0
        if self._native is None or not self._rows_proven or table.num_rows == 0:
            return super().write(table)
        topic, value_format = self._output()
        total = Produced(0, 0)
        for values, keys, unwritten in encode_columns(table, value_format, self.settings):
            with self._refused_as_sink_error(f"producing to topic {topic!r}"):
                produce_column(self._native, self.producer, topic, values, keys)
            total = total + produced_column(values, unwritten)
        return total

    def start(self) -> None:
        """Fence every earlier instance and abort whatever it left open (``init_transactions``)."""
        # Metadata requests first (``check_topics``, two of them): they return once a broker connection is
        # up. librdkafka asks for the producer id only over an open connection and, finding none, asks again
        # 500 ms later; a producer just made has none yet, so about half of all starts waited those 500 ms
        # (bench/README.md, "Start-up: the producer's first connection"). The first answer may come over the
        # bootstrap connection, which librdkafka closes once it has learned the brokers' ids; after a second
        # request no start measured waited (0 of 100, against 13 of 40 with one; on one broker: a coordinator
        # on another broker still needs its own connection). Only the sink's own topics are asked for: a
        # request for every topic grows with the cluster (to init_transactions, 104 against 18 ms with 5,000
        # topics; bench/README.md, "Start-up on a cluster with many topics").
        self.check_topics()
        # Short calls, retried: librdkafka resumes init_transactions after a timeout, and a stop signal is
        # honoured between two calls instead of after one long one.
        with_retries(lambda: self.producer.init_transactions(5),
                     f"init_transactions({self.settings.transactional_id})", interrupted=self.interrupted)
        log.info("transactional producer ready", extra={"transactional_id": self.settings.transactional_id})

    def begin_epoch(self) -> None:
        if not self._in_transaction:
            with_retries(self.producer.begin_transaction, "begin_transaction", interrupted=self.interrupted)
            self._in_transaction = True

    def commit_epoch(self, commits: Sequence[OffsetCommit]) -> None:
        """The commit point: flush, send each consumer's offsets (already carrying their metadata, the
        checkpoint id) with that consumer's group metadata, commit."""
        self.begin_epoch()
        self.flush(self.settings.transaction_timeout_ms / 1000)
        names = ", ".join(sorted({tp.metadata or "" for commit in commits for tp in commit.offsets}))
        try:
            for commit in commits:
                if commit.offsets:
                    self._bounded(partial(self.producer.send_offsets_to_transaction, commit.offsets,
                                          commit.group_metadata, TXN_CALL_S), "send_offsets_to_transaction", names)
            if self._before_commit is not None:
                self._before_commit()
            self._bounded(lambda: self.producer.commit_transaction(TXN_CALL_S), "commit_transaction", names)
        except (ProducerWedged, CallAbandoned):
            self._wedged = True
            raise
        self._in_transaction = False
        self._rows_proven |= self._rows_this_epoch
        self._rows_this_epoch = False

    def _bounded(self, call: Callable[[], None], what: str, names: str) -> None:
        """A commit-point call: retried while librdkafka says retriable, each attempt given up as wedged after
        ``wedged_after_s`` (or at once on a stop request)."""
        with_retries(lambda: within_deadline(call, what, self._wedged_after_s, self.interrupted),
                     f"{what}({names})", interrupted=self.interrupted)

    def _fatal_cause(self) -> KafkaError | None:
        """librdkafka names a transactional producer's fatal error (fenced by a newer instance, ...) only
        through its next transactional call; the producer is unusable anyway, so ask by aborting."""
        try:
            self.producer.abort_transaction(0.1)
        except KafkaException as exc:
            cause: KafkaError = exc.args[0]
            return cause
        return None

    def abort_epoch(self) -> None:
        self._rows_proven = self._rows_this_epoch = False  # the next epoch's failures must name their reason
        if self._in_transaction:
            # Short calls, retried (librdkafka resumes an abort after a timeout), and given up when a stop is
            # requested: the next instance's init_transactions aborts whatever is left open.
            with_retries(lambda: self.producer.abort_transaction(5), "abort_transaction",
                         interrupted=self.interrupted)
            self._in_transaction = False
        self._failed.clear()

    def close(self) -> None:
        """Leave nothing open: an uncommitted epoch is aborted, not left to time out and block readers.
        A wedged producer (or one whose call was abandoned on a stop) is left alone: the next instance's
        ``init_transactions`` aborts its epoch."""
        if self._wedged:
            return
        try:
            self.abort_epoch()
            self.producer.flush(5)
        except (SinkError, KafkaException) as error:  # fenced or fatal: nothing of this producer may commit now
            log.warning("abort on close failed", extra={"error": str(error)})
