"""The transactional sink: the Kafka transaction is the commit point of an epoch."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import fastavro
import orjson
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import ClusterMetadata, TopicMetadata

from connectors.admin import MISSING_TOPIC_GRACE_S, create_topic
from connectors.dead_letter import DeadLetter
from connectors.offset_metadata import checkpoint_id_from_metadata, checkpoint_metadata
from engine.testing import read_values
from schemas import Format, FormatSpec, make_format
from sinks import (
    AtLeastOnceKafkaSink,
    CallAbandoned,
    EpochAborted,
    OffsetCommit,
    Produced,
    ProducerFenced,
    ProducerWedged,
    SinkFatal,
    SinkSettings,
    SinkTopicMissing,
    TransactionalKafkaSink,
)
from sinks.calls import within_deadline
from sinks.errors import classify
from sinks.transactional import TXN_CALL_S, WEDGE_MARGIN_S, wedged_after_s

BOTH_WAYS = pytest.mark.usefixtures("kafka_io")  # once per way records move: the C module, and per record


def sink_for(bootstrap: str, topic: str, value_format: Format | None = None,
             **settings: object) -> TransactionalKafkaSink:
    create_topic(bootstrap, topic, 2)
    create_topic(bootstrap, f"{topic}-dlq", 1)
    return TransactionalKafkaSink(
        SinkSettings(topic=topic, transactional_id=f"tx-{topic}", group_id=f"group-{topic}",
                     dead_letter_topic=f"{topic}-dlq", **settings),
        bootstrap, value_format or make_format(FormatSpec("json")))


def unconnected_sink(dead_letter_topic: str | None = None) -> TransactionalKafkaSink:
    """A sink whose producer never reaches a broker: for what the sink does with the answers it is given."""
    return TransactionalKafkaSink(SinkSettings(topic="orders-out", transactional_id="tx-unused", group_id="g",
                                               dead_letter_topic=dead_letter_topic),
                                  "127.0.0.1:9", make_format(FormatSpec("json")))


ROWS = pa.table({"id": [1, 2, 3], "__kafka_offset": pa.array([10, 11, 12], pa.int64())})


def read_records(bootstrap: str, topic: str) -> list[tuple[bytes | None, bytes | None]]:
    """(key, value) of every committed record of ``topic``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{topic}", "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    consumer.subscribe([topic])
    records, ends = [], 0
    deadline = time.monotonic() + 30
    while ends < 2 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error() is None:
            records.append((message.key(), message.value()))
        elif message.error().code() == KafkaError._PARTITION_EOF:
            ends += 1
    consumer.close()
    return records


def group_consumer(bootstrap: str, group: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})


def group_metadata(bootstrap: str, group: str) -> object:
    """A group's metadata, as a sink sends it with offsets: a copy, still valid once its consumer is closed."""
    consumer = group_consumer(bootstrap, group)
    try:
        return consumer.consumer_group_metadata()
    finally:
        consumer.close()


@BOTH_WAYS
def test_a_committed_epoch_carries_output_dead_letters_and_tagged_offsets(kafka_bootstrap: str,
                                                                          unique_topic: str) -> None:
    sink = sink_for(kafka_bootstrap, unique_topic)
    source_topic = f"{unique_topic}-in"
    create_topic(kafka_bootstrap, source_topic, 1)
    metadata = group_metadata(kafka_bootstrap, f"group-{unique_topic}")
    sink.start()
    sink.begin_epoch()
    sink.write(ROWS)
    sink.write_dead_letters([DeadLetter("in", 0, 5, b"k", b"{bad", "not JSON", "decode")])
    sink.commit_epoch([OffsetCommit([TopicPartition(source_topic, 0, 42, metadata=checkpoint_metadata(7))], metadata)])
    sink.close()

    assert sorted(orjson.loads(v)["id"] for v in read_values(kafka_bootstrap, unique_topic)) == [1, 2, 3]
    assert read_values(kafka_bootstrap, f"{unique_topic}-dlq") == [b"{bad"]
    consumer = group_consumer(kafka_bootstrap, f"group-{unique_topic}")
    try:
        committed = consumer.committed([TopicPartition(source_topic, 0)], timeout=10)[0]
    finally:
        consumer.close()
    assert (committed.offset, checkpoint_id_from_metadata(committed.metadata)) == (42, 7)


ORDER_OUT_AVRO = {"type": "record", "name": "OrderOut", "fields": [
    {"name": "id", "type": "long"}, {"name": "user", "type": ["null", "string"]}, {"name": "amount", "type": "double"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}, {"name": "vip", "type": "boolean"}]}


@BOTH_WAYS
def test_avro_rows_reach_the_topic_as_fastavro_reads_them_in_every_epoch(kafka_bootstrap: str, unique_topic: str,
                                                                         tmp_path: Path) -> None:
    """Records of primitive fields are written by the C codec when it is there; the first epoch goes record by
    record, the next through the C module (with native I/O): both must carry fastavro's bytes."""
    schema_path = tmp_path / "order_out.avsc"
    schema_path.write_text(json.dumps(ORDER_OUT_AVRO))
    value_format = make_format(FormatSpec("avro", schema=schema_path))
    sink = sink_for(kafka_bootstrap, unique_topic, value_format)
    rows = [{"id": i, "user": None if i % 3 == 0 else f"kundin-{i}-ü", "amount": i / 7 - 50,
             "ts": 1_764_000_000_000 + i, "vip": i % 2 == 0} for i in range(1_000)]
    physical = pa.Table.from_pylist(rows, schema=pa.schema([("id", pa.int64()), ("user", pa.string()),
                                                            ("amount", pa.float64()), ("ts", pa.int64()),
                                                            ("vip", pa.bool_())]))
    table = physical.cast(value_format.arrow_schema)
    metadata = group_metadata(kafka_bootstrap, "unused")
    sink.start()
    for epoch in (table.slice(0, 400), table.slice(400)):
        sink.begin_epoch()
        sink.write(epoch)
        sink.commit_epoch([OffsetCommit([], metadata)])
    sink.close()

    without_logical_types = fastavro.parse_schema({**ORDER_OUT_AVRO, "name": "Plain", "fields": [
        {**field, "type": "long"} if field["name"] == "ts" else field for field in ORDER_OUT_AVRO["fields"]]})
    read = [fastavro.schemaless_reader(io.BytesIO(value), without_logical_types, None)
            for value in read_values(kafka_bootstrap, unique_topic)]
    assert sorted(read, key=lambda row: row["id"]) == rows


@BOTH_WAYS
def test_metadata_columns_are_not_written_unless_selected(kafka_bootstrap: str, unique_topic: str) -> None:
    sink = sink_for(kafka_bootstrap, unique_topic, include_metadata=("__kafka_offset",))
    metadata = group_metadata(kafka_bootstrap, "unused")
    sink.start()
    sink.begin_epoch()
    sink.write(ROWS.select(["id"]).append_column("__kafka_partition", pa.array([0, 0, 0], pa.int32()))
               .append_column("__kafka_offset", ROWS.column("__kafka_offset")))
    sink.commit_epoch([OffsetCommit([], metadata)])
    sink.close()
    rows = [orjson.loads(v) for v in read_values(kafka_bootstrap, unique_topic)]
    assert sorted(rows, key=lambda r: r["id"])[0] == {"id": 1, "__kafka_offset": 10}


@BOTH_WAYS
def test_an_aborted_epoch_leaves_nothing_for_read_committed(kafka_bootstrap: str, unique_topic: str) -> None:
    sink = sink_for(kafka_bootstrap, unique_topic)
    sink.start()
    sink.begin_epoch()
    sink.write(ROWS)
    sink.flush(10)
    sink.abort_epoch()
    sink.close()
    assert read_values(kafka_bootstrap, unique_topic) == []
    assert len(read_values(kafka_bootstrap, unique_topic, isolation="read_uncommitted")) == 3


@BOTH_WAYS
def test_a_newer_instance_fences_the_older_one(kafka_bootstrap: str, unique_topic: str) -> None:
    old = sink_for(kafka_bootstrap, unique_topic)
    metadata = group_metadata(kafka_bootstrap, "unused")
    old.start()
    old.begin_epoch()
    old.write(ROWS)
    new = sink_for(kafka_bootstrap, unique_topic)
    new.start()
    with pytest.raises(ProducerFenced, match="fenced"):
        old.commit_epoch([OffsetCommit([], metadata)])
    new.close()
    assert read_values(kafka_bootstrap, unique_topic) == []


class FlushRaising:
    """A producer fenced while records are in flight: ``flush`` raises, as confluent-kafka 2.x does."""

    def __init__(self, raised: BaseException) -> None:
        self.raised = raised

    def flush(self, timeout: float) -> int:
        raise self.raised

    def abort_transaction(self, timeout: float) -> None:  # how the sink asks which fatal error it was
        raise KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))


def raised_with_cause(error: BaseException, cause: BaseException) -> BaseException:
    error.__cause__ = cause
    return error


@BOTH_WAYS
def test_rows_are_keyed_by_the_key_column_as_text_or_bytes(kafka_bootstrap: str, unique_topic: str) -> None:
    sink = sink_for(kafka_bootstrap, unique_topic, key_column="user")
    metadata = group_metadata(kafka_bootstrap, "unused")
    sink.start()
    sink.begin_epoch()
    produced = sink.write(pa.table({"id": [1, 2, 3], "user": ["ann", None, "zoë"]}))
    sink.commit_epoch([OffsetCommit([], metadata)])
    sink.close()
    records = read_records(kafka_bootstrap, unique_topic)
    assert sorted(records, key=lambda kv: kv[1]) == [(b"ann", b'{"id":1,"user":"ann"}'),
                                                     (None, b'{"id":2,"user":null}'),
                                                     ("zoë".encode(), '{"id":3,"user":"zoë"}'.encode())]
    assert produced == Produced(3, sum(len(value) for _, value in records))


@BOTH_WAYS
def test_a_record_the_broker_refuses_aborts_its_epoch_and_the_replay_names_the_reason(kafka_bootstrap: str,
                                                                                      unique_topic: str) -> None:
    """Rows produced through the C module are not reported one by one: their refusal shows as a failed commit.
    After an aborted epoch rows go record by record until an epoch commits, so the replay names the reason."""
    create_topic(kafka_bootstrap, unique_topic, 2, config={"max.message.bytes": "2000"})
    sink = sink_for(kafka_bootstrap, unique_topic, producer_config={"compression.type": "none"})
    metadata = group_metadata(kafka_bootstrap, "unused")
    too_large = pa.table({"id": [2, 3], "text": ["short", "x" * 5000]})
    sink.start()
    sink.begin_epoch()
    sink.write(pa.table({"id": [1], "text": ["committed"]}))
    sink.commit_epoch([OffsetCommit([], metadata)])
    for _ in range(2):  # through the C module once rows committed, then record by record
        sink.begin_epoch()
        sink.write(too_large)
        with pytest.raises(EpochAborted) as aborted:
            sink.commit_epoch([OffsetCommit([], metadata)])
        sink.abort_epoch()
    assert "too large" in str(aborted.value)
    sink.close()
    assert [orjson.loads(v)["id"] for v in read_values(kafka_bootstrap, unique_topic)] == [1]


@BOTH_WAYS
def test_a_row_whose_value_does_not_fit_the_sink_schema_is_left_out_and_named_and_its_batch_is_written(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    """The writer encodes a batch whole; when the format refuses it, each row alone, so only the row that does
    not fit (an int64 beyond an Avro int) is left out, named by its position for the pipeline to dead-letter."""
    schema = tmp_path / "small.avsc"
    schema.write_text(json.dumps({"type": "record", "name": "Small", "fields": [
        {"name": "id", "type": "long"}, {"name": "n", "type": "int"}]}))
    sink = sink_for(kafka_bootstrap, unique_topic, make_format(FormatSpec("avro", schema=schema)), key_column="id")
    metadata = group_metadata(kafka_bootstrap, "unused")
    sink.start()
    for rows in ({"id": [0], "n": [0]}, {"id": [1, 2, 3], "n": [1, 2**40, -3]}):  # the C module once rows committed
        sink.begin_epoch()
        produced = sink.write(pa.table(rows))
        sink.commit_epoch([OffsetCommit([], metadata)])
    sink.close()
    [(row, reason)] = produced.unwritten
    assert (row, produced.records) == (1, 2)
    assert "column 'n'" in reason and "int32" in reason
    assert sorted(key for key, _ in read_records(kafka_bootstrap, unique_topic)) == [b"0", b"1", b"3"]


@pytest.mark.parametrize("raised", [
    KafkaException(KafkaError(KafkaError._FATAL, "Local: Fatal error", fatal=True)),
    raised_with_cause(SystemError("<built-in method flush> returned a result with an exception set"),
                      KafkaException(KafkaError(KafkaError._FATAL, "Local: Fatal error", fatal=True))),
])
def test_a_fatal_error_raised_by_flush_is_the_error_it_stands_for(raised: BaseException) -> None:
    sink = unconnected_sink()
    sink.producer = FlushRaising(raised)  # type: ignore[assignment]

    with pytest.raises(ProducerFenced, match="fenced by a newer instance"):
        sink.flush(1.0)


class CallRecorder:
    """A producer that records the calls the sink makes when it starts; every topic it is asked for exists."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        self.calls.append(f"list_topics({topic})")
        described = TopicMetadata()
        described.topic = topic
        metadata = ClusterMetadata()
        metadata.topics = {topic: described}
        return metadata

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init_transactions")


@pytest.mark.parametrize("dead_letter_topic", [None, "orders-dlq"])
def test_the_sink_connects_to_a_broker_proper_before_it_asks_for_its_producer_id(
        dead_letter_topic: str | None) -> None:
    """librdkafka asks for the producer id only over an open connection, and asks again 500 ms later when a
    fresh producer has none yet: metadata requests first make start-up wait for the connection instead. The
    first may be answered over the bootstrap connection, which is then closed, so there are two; they ask
    for the sink's own topics only (output, then dead letters), not for every topic of the cluster."""
    sink = unconnected_sink(dead_letter_topic)
    recorder = CallRecorder()
    sink.producer = recorder  # type: ignore[assignment]

    sink.start()

    topic = sink.settings.topic
    assert recorder.calls == [f"list_topics({topic})", f"list_topics({dead_letter_topic or topic})",
                              "init_transactions"]


@pytest.mark.parametrize("missing", ["sink", "dead letters"])
@pytest.mark.parametrize("delivery", [TransactionalKafkaSink, AtLeastOnceKafkaSink])
def test_a_missing_topic_fails_the_start_naming_it_in_bounded_time(
        kafka_bootstrap: str, unique_topic: str, missing: str,
        delivery: type[TransactionalKafkaSink | AtLeastOnceKafkaSink]) -> None:
    """On a broker that does not create topics on demand, records to a missing topic would only time out,
    epoch after epoch: the sink refuses to start instead, after giving a topic made a moment ago the time to
    reach the broker."""
    create_topic(kafka_bootstrap, unique_topic if missing == "dead letters" else f"{unique_topic}-dlq", 1)
    settings = SinkSettings(topic=unique_topic, transactional_id=f"tx-{unique_topic}", group_id="g",
                            dead_letter_topic=f"{unique_topic}-dlq")
    sink = delivery(settings, kafka_bootstrap, make_format(FormatSpec("json")))
    absent = unique_topic if missing == "sink" else f"{unique_topic}-dlq"
    started = time.monotonic()
    try:
        with pytest.raises(SinkTopicMissing, match=f"{missing}: topic '{absent}' does not exist on {kafka_bootstrap}: "
                                                   "create it"):
            sink.start()
    finally:
        sink.close()
    assert MISSING_TOPIC_GRACE_S <= time.monotonic() - started < MISSING_TOPIC_GRACE_S + 5


def test_a_topic_made_a_moment_after_the_start_began_is_waited_for(kafka_bootstrap: str,
                                                                     unique_topic: str) -> None:
    sink = TransactionalKafkaSink(SinkSettings(topic=unique_topic, transactional_id=f"tx-{unique_topic}",
                                               group_id="g"), kafka_bootstrap, make_format(FormatSpec("json")))
    late = threading.Timer(0.5, create_topic, (kafka_bootstrap, unique_topic, 2))
    late.start()
    try:
        sink.start()
        sink.begin_epoch()
        sink.write(ROWS)
        sink.commit_epoch([])
    finally:
        late.join()
        sink.close()
    assert sorted(orjson.loads(value or b"")["id"] for _, value in read_records(kafka_bootstrap, unique_topic)) \
        == [1, 2, 3]


def test_a_system_error_without_a_kafka_cause_is_not_mistaken_for_one() -> None:
    sink = unconnected_sink()
    sink.producer = FlushRaising(SystemError("something else"))  # type: ignore[assignment]

    with pytest.raises(SystemError, match="something else"):
        sink.flush(1.0)


@pytest.mark.parametrize("error, expected", [
    (KafkaError(KafkaError._FENCED, "fenced", fatal=True), ProducerFenced),
    (KafkaError(KafkaError._STATE, "boom", fatal=True), SinkFatal),
    (KafkaError(KafkaError._TIMED_OUT, "late", txn_requires_abort=True), EpochAborted),
    (KafkaError(KafkaError._TIMED_OUT, "again", retriable=True), None),
])
def test_librdkafka_error_classes_map_to_actions(error: KafkaError, expected: type | None) -> None:
    classified = classify(error, "commit_transaction")
    assert (type(classified) if classified is not None else None) is expected


def test_a_call_that_never_returns_is_given_up_as_wedged() -> None:
    never = threading.Event()
    with pytest.raises(ProducerWedged, match="did not return within"):
        within_deadline(never.wait, "send_offsets_to_transaction", 0.2)
    never.set()


def test_the_wedge_bound_holds_a_whole_request_of_a_transactional_producer() -> None:
    """librdkafka keeps a transactional producer's request timeout (``socket.timeout.ms``) within 0.1 s of its
    transaction timeout, refusing more; a call is given up only 15 s after that."""
    with pytest.raises(KafkaException, match="socket.timeout.ms"):
        Producer({"transactional.id": "t", "transaction.timeout.ms": 10_000, "socket.timeout.ms": 10_101})
    Producer({"transactional.id": "t", "transaction.timeout.ms": 10_000, "socket.timeout.ms": 10_100})
    assert wedged_after_s(10_000) == pytest.approx(10.1 + TXN_CALL_S + WEDGE_MARGIN_S) == pytest.approx(25.1)


def test_a_stop_requested_while_a_call_is_in_flight_abandons_the_call_at_once() -> None:
    never, stop = threading.Event(), threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    with pytest.raises(CallAbandoned, match="stop requested while the call was in flight"):
        within_deadline(never.wait, "send_offsets_to_transaction", 60, interrupted=stop.is_set)
    assert time.monotonic() - started < 2
    never.set()


def test_checkpoint_ids_round_trip_through_offset_metadata(tmp_path: Path) -> None:
    assert checkpoint_id_from_metadata(checkpoint_metadata(123)) == 123
    assert checkpoint_id_from_metadata("someone else's metadata") is None
    assert checkpoint_id_from_metadata(None) is None


class RefusedRecord:
    """The two things a delivery report's message is asked for."""

    def __init__(self, partition: int) -> None:
        self._partition = partition

    def topic(self) -> str:
        return "orders-out"

    def partition(self) -> int:
        return self._partition


def test_an_epochs_error_names_a_refused_record_before_the_ones_purged_because_of_it() -> None:
    """librdkafka may report the records it purged (the transaction had already failed) before the record
    that failed it; the error names the cause, whatever the order."""
    sink = unconnected_sink()
    sink._on_delivery(KafkaError(KafkaError._PURGE_QUEUE), RefusedRecord(1))
    sink._on_delivery(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), RefusedRecord(0))

    with pytest.raises(EpochAborted) as aborted:
        sink.flush(0.1)

    assert str(aborted.value).startswith("2 records failed delivery, e.g. orders-out[0]: Broker: Message size")


class FlushNeverDone:
    """A producer whose queue never empties, as librdkafka's does once the transaction failed."""

    def flush(self, timeout: float) -> int:
        time.sleep(timeout)
        return 1


def test_a_failed_delivery_ends_the_wait_for_the_rest_of_the_epoch() -> None:
    sink = unconnected_sink()
    sink.producer = FlushNeverDone()  # type: ignore[assignment]
    sink._on_delivery(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), RefusedRecord(1))
    started = time.monotonic()

    with pytest.raises(EpochAborted, match=r"1 records failed delivery, e\.g\. orders-out\[1\]: .*too large"):
        sink.flush(60)
    assert time.monotonic() - started < 5


def test_an_epoch_whose_records_were_all_purged_names_a_purged_one() -> None:
    sink = unconnected_sink()
    sink._on_delivery(KafkaError(KafkaError._PURGE_INFLIGHT), RefusedRecord(1))

    with pytest.raises(EpochAborted, match=r"1 records failed delivery, e\.g\. orders-out\[1\]: .*[Pp]urged"):
        sink.flush(0.1)
