"""KafkaSource against the real broker: exact cuts, restore, transactions, barriers, errors, flow control."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import Producer

from connectors.admin import create_topic, end_offsets
from connectors.batch import SourceBatch
from connectors.checkpoint import SourceCheckpoint
from connectors.metadata import METADATA_COLUMNS
from connectors.source import (
    FETCH_DEFAULTS,
    GROUP_CONSUMER_DEFAULTS,
    KafkaSource,
    SourceError,
    SourceSettings,
    SourceUnavailable,
    TopicMissing,
)
from engine.ports import free_port
from engine.testing import produce_transactions
from engine.testing.connectors import read_until
from schemas import FormatSpec

RAW = FormatSpec("raw")

pytestmark = pytest.mark.usefixtures("kafka_io")  # each test once per way records move (C module, per record)


def produce(bootstrap: str, topic: str, values: Iterable[bytes | None], partition: int | None = None,
            keys: Sequence[bytes] | None = None) -> None:
    """Plain (non-transactional) writes, spread round-robin over partitions unless one is given."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "partitioner": "murmur2_random"})
    for i, value in enumerate(values):
        extra = {"partition": partition} if partition is not None else {}
        producer.produce(topic, value, key=keys[i] if keys else str(i).encode(), **extra)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


def rows(batches: Iterable[SourceBatch], column: str = "value") -> list[tuple[int, int, object]]:
    """(partition, offset, value) of every handed-out row."""
    out = []
    for b in batches:
        out.extend(zip(b.batch.column("__kafka_partition").to_pylist(), b.batch.column("__kafka_offset").to_pylist(),
                       b.batch.column(column).to_pylist()))
    return out


def raw_settings(topic: str, **overrides: object) -> SourceSettings:
    return SourceSettings(name="src", topic=topic, format=RAW, **overrides)  # type: ignore[arg-type]


@pytest.fixture
def group(unique_topic: str) -> str:
    return f"group-{unique_topic}"


# -- metadata columns and batch bounds -----------------------------------------------------------------------

def test_batch_has_value_and_typed_metadata_columns(kafka_bootstrap: str, unique_topic: str, group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce(kafka_bootstrap, unique_topic, [b"a", b"b"], partition=0, keys=[b"k1", b"k2"])
    with KafkaSource(raw_settings(unique_topic), kafka_bootstrap, group) as source:
        source.open()
        batch = read_until(source, {0: 2})[0].batch
    assert batch.schema.names[-4:] == list(METADATA_COLUMNS)
    assert [batch.schema.field(c).type for c in METADATA_COLUMNS] == [
        pa.int32(), pa.int64(), pa.timestamp("ms", tz="UTC"), pa.binary()]
    assert batch.column("__kafka_offset").to_pylist() == [0, 1]
    assert batch.column("__kafka_key").to_pylist() == [b"k1", b"k2"]
    assert batch.column("value").to_pylist() == [b"a", b"b"]
    now_ms = time.time() * 1000
    assert all(now_ms - 120_000 < t.timestamp() * 1000 <= now_ms + 1000
               for t in batch.column("__kafka_timestamp").to_pylist())


def test_poll_returns_available_records_without_waiting_out_its_timeout(
        kafka_bootstrap: str, unique_topic: str, group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce(kafka_bootstrap, unique_topic, [b"a", b"b", b"c"], partition=0)
    with KafkaSource(raw_settings(unique_topic), kafka_bootstrap, group) as source:
        source.open()
        started = time.monotonic()
        batch = source.poll_batch(20.0)
        assert time.monotonic() - started < 10
    assert batch is not None and batch.batch.num_rows >= 1


def test_batches_are_bounded_by_records_and_bytes(kafka_bootstrap: str, unique_topic: str, group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce(kafka_bootstrap, unique_topic, [b"x" * 100] * 500, partition=0)
    by_records = raw_settings(unique_topic, max_batch_records=64)
    by_bytes = raw_settings(unique_topic, max_batch_bytes=1_000)
    one_by_one = raw_settings(unique_topic, max_batch_records=1)
    for settings, limit in ((by_records, 64), (by_bytes, 10), (one_by_one, 1)):
        with KafkaSource(settings, kafka_bootstrap, group) as source:
            source.open()
            batches = read_until(source, {0: 500})
        assert max(b.batch.num_rows for b in batches) == limit
        assert sum(b.batch.num_rows for b in batches) == 500


def test_value_bytes_count_the_records_only_when_the_end_of_partition_event_comes_in_the_same_fetch(
        kafka_bootstrap: str, unique_topic: str, group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    values = [b"x" * n for n in range(1, 6)]
    produce(kafka_bootstrap, unique_topic, values, partition=0)
    with KafkaSource(raw_settings(unique_topic), kafka_bootstrap, group) as source:
        source.open()
        time.sleep(2.0)  # the consumer fetches the records and queues the end-of-partition event behind them
        batches = read_until(source, {0: len(values)})
    assert [v for _, _, v in rows(batches)] == values
    assert sum(b.value_bytes for b in batches) == sum(map(len, values))


# -- exact cuts: restore, transactions, barriers --------------------------------------------------------------

def test_restored_checkpoint_reads_the_rest_without_gaps_or_repeats_across_transactions(
        kafka_bootstrap: str, unique_topic: str, group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=3)
    transactions = [([f"{t}-{i}".encode() for i in range(300)], t % 3 != 1) for t in range(8)]
    produce_transactions(kafka_bootstrap, unique_topic, transactions, partitions=3)
    committed_values = sorted(v for values, commit in transactions if commit for v in values)
    ends = end_offsets(kafka_bootstrap, unique_topic)
    settings = raw_settings(unique_topic, max_batch_records=100)

    with KafkaSource(settings, kafka_bootstrap, group) as first:
        first.open()
        first_part = [first.poll_batch(5.0) for _ in range(6)]
        saved = first.position().to_bytes()
    with KafkaSource(settings, kafka_bootstrap, group) as second:
        second.open(start_at=SourceCheckpoint.from_bytes(saved))
        rest = read_until(second, ends)
        assert second.position() == SourceCheckpoint("src", unique_topic, ends)

    read = rows([b for b in first_part if b is not None]) + rows(rest)
    assert 0 < sum(b.batch.num_rows for b in first_part if b) < len(committed_values)
    assert len({(p, o) for p, o, _ in read}) == len(read), "a record was handed out twice"
    assert sorted(v for _, _, v in read) == committed_values


def test_reached_does_not_hang_when_the_topic_ends_in_transaction_markers(
        kafka_bootstrap: str, unique_topic: str, group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce_transactions(kafka_bootstrap, unique_topic, [([b"kept"], True), ([b"gone"] * 5, False)], partitions=1)
    ends = end_offsets(kafka_bootstrap, unique_topic)
    assert ends == {0: 8}, "1 record + commit marker + 5 aborted records + abort marker"
    with KafkaSource(raw_settings(unique_topic), kafka_bootstrap, group) as source:
        source.open()
        values = [v for _, _, v in rows(read_until(source, ends, deadline_s=20))]
        assert source.position().offsets == {0: 8}
    assert values == [b"kept"]


def test_restore_at_the_end_offset_past_markers_is_immediately_reached(
        kafka_bootstrap: str, unique_topic: str, group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce_transactions(kafka_bootstrap, unique_topic, [([b"a", b"b"], True)], partitions=1)
    ends = end_offsets(kafka_bootstrap, unique_topic)
    with KafkaSource(raw_settings(unique_topic), kafka_bootstrap, group) as source:
        source.open(start_at=SourceCheckpoint("src", unique_topic, ends))
        assert source.reached(ends)
        assert source.poll_batch(1.0) is None
        assert source.position().offsets == ends


def test_records_handed_out_after_a_barrier_are_outside_its_cut(
        kafka_bootstrap: str, unique_topic: str, group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=2)
    produce(kafka_bootstrap, unique_topic, [str(i).encode() for i in range(2_000)])
    with KafkaSource(raw_settings(unique_topic, max_batch_records=50), kafka_bootstrap, group) as source:
        source.open()
        before = [source.poll_batch(5.0) for _ in range(4)]
        cut = source.inject_barrier(1)
        after = read_until(source, end_offsets(kafka_bootstrap, unique_topic))
    assert all(o < cut.offsets[p] for p, o, _ in rows(b for b in before if b))
    assert after and all(o >= cut.offsets[p] for p, o, _ in rows(after))


def test_restore_drops_buffered_records_and_continues_at_the_checkpoint(
        kafka_bootstrap: str, unique_topic: str, group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce(kafka_bootstrap, unique_topic, [str(i).encode() for i in range(1_000)], partition=0)
    with KafkaSource(raw_settings(unique_topic, max_batch_bytes=100), kafka_bootstrap, group) as source:
        source.open()
        assert source.poll_batch(5.0) is not None
        rewind = SourceCheckpoint("src", unique_topic, {0: 3})
        source.restore(rewind)
        assert source.position() == rewind
        offsets = [o for _, o, _ in rows(read_until(source, {0: 1_000}))]
    assert offsets == list(range(3, 1_000))


def test_start_from_latest_skips_records_written_before_open(
        kafka_bootstrap: str, unique_topic: str, group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce(kafka_bootstrap, unique_topic, [b"old"] * 10, partition=0)
    with KafkaSource(raw_settings(unique_topic, start_from="latest"), kafka_bootstrap, group) as source:
        source.open()
        assert source.position().offsets == {0: 10}
        produce(kafka_bootstrap, unique_topic, [b"new"], partition=0)
        assert [v for _, _, v in rows(read_until(source, {0: 11}))] == [b"new"]


# -- watermarks ----------------------------------------------------------------------------------------------

def produce_timed(bootstrap: str, topic: str, records: Sequence[tuple[int, int, bytes]]) -> None:
    """(partition, Kafka timestamp ms, value) records."""
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition, timestamp, value in records:
        producer.produce(topic, value, partition=partition, timestamp=timestamp)
    assert producer.flush(30) == 0


def test_watermark_follows_kafka_timestamps_per_partition(kafka_bootstrap: str, unique_topic: str,
                                                          group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=2)
    produce_timed(kafka_bootstrap, unique_topic, [(0, 1_000, b""), (0, 5_000, b""), (0, 3_000, b""),
                                                  (1, 2_000, b""), (1, 4_000, b"")])
    settings = raw_settings(unique_topic, allowed_lateness_ms=500)
    with KafkaSource(settings, kafka_bootstrap, group) as source:
        source.open()
        assert source.watermarks.current() is None
        for batch in read_until(source, {0: 3, 1: 2}):
            source.observe_event_times(batch.batch)
        assert source.watermarks.current() == 3_500


def test_watermark_follows_the_configured_event_time_column(kafka_bootstrap: str, unique_topic: str,
                                                            group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce_timed(kafka_bootstrap, unique_topic, [(0, 1, b'{"at": 7000}'), (0, 2, b'{"at": 9000}')])
    settings = SourceSettings(name="src", topic=unique_topic, format=FormatSpec("json"), event_time_column="at")
    with KafkaSource(settings, kafka_bootstrap, group) as source:
        source.open()
        for batch in read_until(source, {0: 2}):
            source.observe_event_times(batch.batch)
        assert source.watermarks.current() == 9_000


def test_an_aligned_source_hands_out_a_backlog_in_event_time_order_with_an_exact_cut(
        kafka_bootstrap: str, unique_topic: str, group: str) -> None:
    """Each partition's backlog is fetched in one long run, yet no row comes after a later row of another
    partition; a checkpoint taken half way and restored reads the rest without gaps or repeats."""
    create_topic(kafka_bootstrap, unique_topic, partitions=3)
    produce_timed(kafka_bootstrap, unique_topic, [(p, 1_000 + 10 * i + p, b"") for p in range(3) for i in range(3000)])
    settings = raw_settings(unique_topic, align_event_time=True, max_batch_records=500)
    handed_out: list[SourceBatch] = []
    with KafkaSource(settings, kafka_bootstrap, group) as source:
        source.open()
        while sum(b.batch.num_rows for b in handed_out) < 4_000:
            batch = source.poll_batch(5.0)
            if batch is not None:
                handed_out.append(batch)
                source.observe_event_times(batch.batch)
        saved = source.position()
    read = rows(handed_out, "__kafka_timestamp")
    assert {p for p, _, _ in rows(handed_out[:1])} == {0, 1, 2}  # not a run of one partition
    assert saved.offsets == {p: sum(1 for q, _, _ in read if q == p) for p in range(3)}
    for earlier, later in itertools.pairwise(handed_out):
        assert pc.min(later.batch.column("__kafka_timestamp")).as_py() >= pc.max(
            earlier.batch.column("__kafka_timestamp")).as_py()
    with KafkaSource(settings, kafka_bootstrap, group) as second:
        second.open(start_at=saved)
        rest = read_until(second, {0: 3000, 1: 3000, 2: 3000})
    offsets = [(p, o) for p, o, _ in read + rows(rest, "__kafka_timestamp")]
    assert sorted(offsets) == [(p, o) for p in range(3) for o in range(3000)]


# -- flow control and metrics ---------------------------------------------------------------------------------

def test_paused_source_hands_out_nothing_until_resumed(kafka_bootstrap: str, unique_topic: str, group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce(kafka_bootstrap, unique_topic, [str(i).encode() for i in range(50)], partition=0)
    with KafkaSource(raw_settings(unique_topic), kafka_bootstrap, group) as source:
        source.open()
        source.pause()
        first = source.poll_batch(1.0)
        assert source.poll_batch(0.5) is None
        produce(kafka_bootstrap, unique_topic, [str(i).encode() for i in range(50, 100)], partition=0)
        assert source.poll_batch(1.0) is None
        source.resume()
        offsets = [o for _, o, _ in rows([b for b in [first] if b] + read_until(source, {0: 100}))]
    assert offsets == list(range(100))


def test_lag_counts_records_not_yet_handed_out(kafka_bootstrap: str, unique_topic: str, group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    produce(kafka_bootstrap, unique_topic, [b"x"] * 300, partition=0)
    with KafkaSource(raw_settings(unique_topic, max_batch_records=100), kafka_bootstrap, group) as source:
        source.open()
        handed_out = source.poll_batch(5.0)
        assert handed_out is not None and source.lag() == {0: 300 - handed_out.batch.num_rows}
        read_until(source, {0: 300})
        assert source.lag() == {0: 0}


# -- unavailable broker, missing topic, unsafe configuration ----------------------------------------------------

def test_unreachable_broker_raises_source_unavailable_naming_it_within_the_timeout() -> None:
    bootstrap = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with (KafkaSource(raw_settings("some-topic"), bootstrap, "g", timeout=2.0) as source,
          pytest.raises(SourceUnavailable, match=f"{bootstrap}.*'some-topic'")):
        source.open()
    assert time.monotonic() - started < 10


def test_a_missing_topic_is_a_permanent_error_naming_it(kafka_bootstrap: str, unique_topic: str) -> None:
    """Permanent, not ``SourceUnavailable``: restarting would fail the same way (no restart loop)."""
    with (KafkaSource(raw_settings(unique_topic), kafka_bootstrap, "g", timeout=5.0) as source,
          pytest.raises(TopicMissing, match=f"topic '{unique_topic}' does not exist on {kafka_bootstrap}: create it")):
        source.open()


def test_checkpoint_of_another_topic_is_refused(kafka_bootstrap: str, unique_topic: str, group: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=1)
    with (KafkaSource(raw_settings(unique_topic), kafka_bootstrap, group) as source,
          pytest.raises(SourceError, match="checkpoint of source 'src' on topic 'elsewhere'")):
        source.open(start_at=SourceCheckpoint("src", "elsewhere", {0: 1}))


@pytest.mark.parametrize(("overrides", "problem"), [
    ({"max_batch_records": 0}, "max_batch_records must be at least 1"),
    ({"allowed_lateness_ms": -1}, "allowed_lateness_ms must be at least 0"),
    ({"start_from": "middle"}, "start_from must be 'earliest' or 'latest'"),
    ({"on_error": "ignore"}, "on_error must be 'dead-letter' or 'halt'"),
])
def test_invalid_settings_are_refused_naming_the_field(overrides: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        raw_settings("t", **overrides)


def test_a_drained_prefetch_queue_is_refilled_at_once_and_the_user_s_consumer_settings_win() -> None:
    with KafkaSource(raw_settings("t"), "127.0.0.1:1", "g") as source:
        default = source.consumer_config()
    assert {key: default[key] for key in FETCH_DEFAULTS} == FETCH_DEFAULTS
    assert int(FETCH_DEFAULTS["fetch.queue.backoff.ms"]) < 1000  # librdkafka's own default: a 1 s pause
    with KafkaSource(raw_settings("t", consumer_config={"fetch.queue.backoff.ms": "500"}),
                     "127.0.0.1:1", "g") as source:
        chosen = source.consumer_config()
    assert chosen["fetch.queue.backoff.ms"] == "500"
    assert chosen["isolation.level"] == "read_committed"


def test_the_consumer_group_protocol_leaves_assignment_and_session_to_the_broker() -> None:
    """KIP-848: the classic protocol's assignor, session and heartbeat are broker settings there (librdkafka
    refuses them), so epochline sets none; a user who sets one is told which, before any connection."""
    with KafkaSource(raw_settings("t"), "127.0.0.1:1", "g") as source:
        classic = source.consumer_config()
    assert {key: classic[key] for key in GROUP_CONSUMER_DEFAULTS} == GROUP_CONSUMER_DEFAULTS
    with KafkaSource(raw_settings("t", consumer_config={"group.protocol": "consumer"}), "127.0.0.1:1", "g") as source:
        chosen = source.consumer_config()
    assert chosen["group.protocol"] == "consumer"
    assert not set(chosen) & set(GROUP_CONSUMER_DEFAULTS)
    settings = raw_settings("t", consumer_config={"group.protocol": "consumer", "session.timeout.ms": "6000"})
    with pytest.raises(SourceError, match="session.timeout.ms belong to the classic group protocol"):
        KafkaSource(settings, "127.0.0.1:1", "g")


def test_consumer_config_cannot_break_exactly_once_reading() -> None:
    settings = raw_settings("t", consumer_config={"isolation.level": "read_uncommitted"})
    with pytest.raises(SourceError, match="isolation.level='read_uncommitted'"):
        KafkaSource(settings, "127.0.0.1:1", "g")
