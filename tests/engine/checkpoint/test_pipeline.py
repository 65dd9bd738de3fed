"""``KafkaPipeline`` in process against the real broker: what recovery refuses, and what the metrics count."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from connectors.admin import create_topic, end_offsets, group_offsets
from connectors.offset_metadata import committed_epoch
from connectors.source import KafkaSource, PartitionListener, SourceSettings
from engine.checkpoint import (
    ConnectorFailed,
    EpochLoop,
    EpochLoopSettings,
    KafkaPipeline,
    RunOptions,
    run_connector,
)
from engine.config import ConnectorConfig, load_config
from engine.metrics import Metrics
from engine.testing import read_values
from engine.testing.accounting import assert_exactly_once, read_dead_letters
from engine.testing.connectors import produce_values, write_config
from engine.wiring import SOURCE_NAME, build_sink

PARTITIONS = 2
RECORDS = 2_000


def connector_with_input(bootstrap: str, tmp_path: Path, topic: str) -> tuple[ConnectorConfig, list[bytes]]:
    """A connector over a fresh input topic holding ``RECORDS`` JSON orders (every tenth one negative)."""
    path = write_config(tmp_path, {
        "name": f"pipeline-{topic}",
        "source": {"topic": f"{topic}-in", "format": "json"},
        "transform": {"sql": "SELECT id, amount FROM input WHERE amount >= 0"},
        "sink": {"topic": f"{topic}-out", "format": "json"},
        "dead_letter": {"topic": f"{topic}-dlq"},
        "checkpoint": {"interval": "200ms", "dir": str(tmp_path / "state")},
    })
    config = load_config(path)
    for name in (config.source.topic, config.sink.topic, f"{topic}-dlq"):
        create_topic(bootstrap, name, PARTITIONS)
    values = [orjson.dumps({"id": i, "amount": -1.0 if i % 10 == 0 else float(i)}) for i in range(RECORDS)]
    produce_values(bootstrap, config.source.topic, values, PARTITIONS)
    return config, values


def kept_ids() -> list[int]:
    """The ids the SQL step keeps: every tenth order is negative."""
    return [i for i in range(RECORDS) if i % 10]


def commit_offsets(bootstrap: str, group: str, offsets: list[TopicPartition]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
    finally:
        consumer.close()


def test_metadata_epochline_did_not_write_stops_recovery_naming_group_partition_and_string(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    config, _ = connector_with_input(kafka_bootstrap, tmp_path, unique_topic)
    commit_offsets(kafka_bootstrap, config.group_id, [
        TopicPartition(config.source.topic, 1, 5, metadata="epochline:checkpoint=abc")])

    with pytest.raises(ConnectorFailed) as failure:
        run_connector(config, RunOptions(bootstrap=kafka_bootstrap, stop_at_end=True, max_restarts=0))

    message = str(failure.value)
    assert f"consumer group {config.group_id!r}" in message
    assert f"topic {config.source.topic!r} partition(s) [1]" in message
    assert "'epochline:checkpoint=abc'" in message
    assert read_values(kafka_bootstrap, config.sink.topic) == []


def test_the_metrics_count_records_and_wire_bytes_in_and_out(kafka_bootstrap: str, unique_topic: str,
                                                           tmp_path: Path) -> None:
    config, values = connector_with_input(kafka_bootstrap, tmp_path, unique_topic)
    metrics = Metrics()
    ends = {SOURCE_NAME: end_offsets(kafka_bootstrap, config.source.topic)}
    loop = EpochLoop(KafkaPipeline(config, kafka_bootstrap, metrics),
                     EpochLoopSettings(checkpoint_interval_s=0.2, stop_at=ends))
    loop.run()

    assert_exactly_once(kafka_bootstrap, config.sink.topic, f"{unique_topic}-dlq", kept_ids())
    output = read_values(kafka_bootstrap, config.sink.topic)
    counted = metrics.snapshot()
    assert (counted["records_in"], counted["bytes_in"]) == (RECORDS, sum(map(len, values)))
    assert (counted["records_out"], counted["bytes_out"]) == (len(output), sum(len(v or b"") for v in output))


def committed_dead_letters(bootstrap: str, config: ConnectorConfig) -> dict[int, int | None]:
    """Per source partition, the dead-letter count its committed offset's metadata carries."""
    offsets = group_offsets(bootstrap, config.group_id, config.source.topic, list(range(PARTITIONS)))
    return {p.partition: epoch.dead_letters if (epoch := committed_epoch(p.metadata)) else None for p in offsets}


def run_to_the_end(bootstrap: str, config: ConnectorConfig) -> None:
    ends = {SOURCE_NAME: end_offsets(bootstrap, config.source.topic)}
    EpochLoop(KafkaPipeline(config, bootstrap),
              EpochLoopSettings(checkpoint_interval_s=0.2, stop_at=ends)).run()


def test_each_partitions_committed_offset_carries_its_dead_letters_so_far_across_runs(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    """The count is cumulative and committed with the dead letters: a second run (a restart, nothing kept in
    memory) adds to what the first committed, and the counts add up to the dead-letter topic read_committed."""
    config, _ = connector_with_input(kafka_bootstrap, tmp_path, unique_topic)
    produce_values(kafka_bootstrap, config.source.topic, [b"{not json"] * 3, PARTITIONS)  # partitions 0, 1, 0
    run_to_the_end(kafka_bootstrap, config)
    assert committed_dead_letters(kafka_bootstrap, config) == {0: 2, 1: 1}

    produce_values(kafka_bootstrap, config.source.topic, [b"[1"] * 4, PARTITIONS)
    run_to_the_end(kafka_bootstrap, config)
    assert committed_dead_letters(kafka_bootstrap, config) == {0: 4, 1: 3}
    assert len(read_dead_letters(kafka_bootstrap, f"{unique_topic}-dlq")) == 7


def test_a_transformed_row_the_sink_refuses_is_counted_in_the_committed_dead_letters_too(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    """Such a row comes from no source partition (its dead letter names the sink topic); it still counts in
    the connector's committed total, which equals the dead-letter topic read_committed."""
    (tmp_path / "out.avsc").write_text(orjson.dumps({"type": "record", "name": "Out", "fields": [
        {"name": "id", "type": "long"}, {"name": "amount", "type": "int"}]}).decode())
    config = load_config(write_config(tmp_path, {
        "name": f"pipeline-{unique_topic}",
        "source": {"topic": f"{unique_topic}-in", "format": "json"},
        "transform": {"sql": "SELECT id, CASE WHEN id % 100 = 7 THEN 1e12 ELSE amount END AS amount FROM input"},
        "sink": {"topic": f"{unique_topic}-out", "format": "avro", "schema": str(tmp_path / "out.avsc")},
        "dead_letter": {"topic": f"{unique_topic}-dlq"},
        "checkpoint": {"interval": "200ms", "dir": str(tmp_path / "state")},
    }))
    for name in (config.source.topic, config.sink.topic, f"{unique_topic}-dlq"):
        create_topic(kafka_bootstrap, name, PARTITIONS)
    produce_values(kafka_bootstrap, config.source.topic,
                   [orjson.dumps({"id": i, "amount": float(i)}) for i in range(300)], PARTITIONS)

    run_to_the_end(kafka_bootstrap, config)

    letters = read_dead_letters(kafka_bootstrap, f"{unique_topic}-dlq")
    assert len(letters) == 3
    assert sum(count or 0 for count in committed_dead_letters(kafka_bootstrap, config).values()) == 3


def test_the_sources_open_while_the_fence_runs_and_join_the_group_only_after_it(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    """Recovery reads committed offsets only after ``init_transactions`` fenced the previous incarnation
    (DESIGN.md); making the consumer and describing its topic touch neither the group nor a record, so they
    run while the fence waits on the broker. This fence waits until the source is open: run one after the
    other, the start would fail."""
    config, values = connector_with_input(kafka_bootstrap, tmp_path, unique_topic)
    events: list[str] = []
    source_opened = threading.Event()
    sink = build_sink(config, kafka_bootstrap, transactional_id=f"fence-{unique_topic}", group_id=config.group_id)
    fence = sink.start

    def fence_once_the_source_is_open() -> None:
        assert source_opened.wait(10), "the fence ran before the source was opened, not beside it"
        fence()
        events.append("fenced")

    class RecordedSource(KafkaSource):
        def subscribe(self, listener: PartitionListener) -> None:
            events.append("subscribed")
            super().subscribe(listener)

    def open_source(settings: SourceSettings) -> RecordedSource:
        source = RecordedSource(settings, kafka_bootstrap, config.group_id)
        events.append("source opened")
        source_opened.set()
        return source

    sink.start = fence_once_the_source_is_open  # type: ignore[method-assign]
    pipeline = KafkaPipeline(config, kafka_bootstrap, open_source=open_source, sink=sink)
    ends = {SOURCE_NAME: end_offsets(kafka_bootstrap, config.source.topic)}
    EpochLoop(pipeline, EpochLoopSettings(checkpoint_interval_s=0.2, stop_at=ends)).run()

    assert events == ["source opened", "fenced", "subscribed"]
    assert_exactly_once(kafka_bootstrap, config.sink.topic, f"{unique_topic}-dlq", kept_ids())
    assert sorted(read_values(kafka_bootstrap, config.sink.topic)) == sorted(
        orjson.dumps({"id": i, "amount": float(i)}) for i in range(RECORDS) if i % 10)
