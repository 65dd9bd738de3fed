"""SourceCheckpoint: serialization, partial order, and the checkpoint id riding along in offset metadata."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from connectors.admin import create_topic
from connectors.checkpoint import CheckpointFormatError, SourceCheckpoint
from connectors.source import KafkaSource, SourceSettings
from schemas import FormatSpec


def test_checkpoint_survives_bytes_round_trip() -> None:
    checkpoint = SourceCheckpoint("orders", "orders-topic", {2: 40, 0: 7, 1: 0})
    restored = SourceCheckpoint.from_bytes(checkpoint.to_bytes())
    assert restored == checkpoint
    assert dict(restored.offsets) == {0: 7, 1: 0, 2: 40}
    assert hash(restored) == hash(checkpoint)


def test_checkpoint_offsets_cannot_be_changed_after_creation() -> None:
    offsets = {0: 1}
    checkpoint = SourceCheckpoint("s", "t", offsets)
    offsets[0] = 99
    assert checkpoint.offsets[0] == 1
    with pytest.raises(TypeError):
        checkpoint.offsets[0] = 5  # type: ignore[index]


@pytest.mark.parametrize("data", [b"not json", b"{}", b'{"source": "s", "topic": "t", "offsets": {"0": -1}}',
                                  b'{"source": "s", "topic": "t", "offsets": {"x": 1}}'])
def test_invalid_checkpoint_bytes_raise_a_format_error(data: bytes) -> None:
    with pytest.raises(CheckpointFormatError, match="not a source checkpoint"):
        SourceCheckpoint.from_bytes(data)


def test_checkpoints_are_ordered_by_every_partition_offset() -> None:
    early = SourceCheckpoint("s", "t", {0: 5, 1: 5})
    later = SourceCheckpoint("s", "t", {0: 5, 1: 9})
    mixed = SourceCheckpoint("s", "t", {0: 9, 1: 1})
    assert early <= later and early < later and later > early and later >= early
    same = SourceCheckpoint("s", "t", {0: 5, 1: 5})
    assert early <= same and not early < same
    assert not (mixed <= later) and not (later <= mixed)


def test_checkpoint_missing_a_partition_is_below_one_that_has_it() -> None:
    partial = SourceCheckpoint("s", "t", {0: 5})
    full = SourceCheckpoint("s", "t", {0: 5, 1: 0})
    assert partial < full and not full <= partial


def test_checkpoints_of_different_sources_or_topics_are_incomparable() -> None:
    base = SourceCheckpoint("s", "t", {0: 1})
    for other in (SourceCheckpoint("other", "t", {0: 2}), SourceCheckpoint("s", "other", {0: 2})):
        assert not (base <= other) and not (base >= other) and base != other


def test_topic_partitions_carry_offsets_and_metadata() -> None:
    checkpoint = SourceCheckpoint("s", "t", {1: 4, 0: 3})
    with_metadata = checkpoint.topic_partitions("epochline:checkpoint=3")
    assert [(tp.topic, tp.partition, tp.offset, tp.metadata) for tp in with_metadata] == [
        ("t", 0, 3, "epochline:checkpoint=3"), ("t", 1, 4, "epochline:checkpoint=3")]
    assert [tp.metadata for tp in checkpoint.topic_partitions()] == [None, None]


def test_checkpoint_id_round_trips_through_transactional_offset_metadata(
        kafka_bootstrap: str, unique_topic: str) -> None:
    create_topic(kafka_bootstrap, unique_topic, partitions=3)
    group = f"group-{unique_topic}"
    settings = SourceSettings(name="orders", topic=unique_topic, format=FormatSpec("raw"))
    with KafkaSource(settings, kafka_bootstrap, group) as source:
        assert source.committed() == (None, None)
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"tx-{unique_topic}"})
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(unique_topic, b"output", partition=0)
        cut = SourceCheckpoint("orders", unique_topic, {0: 11, 1: 0, 2: 5})
        producer.send_offsets_to_transaction(cut.topic_partitions("epochline:checkpoint=7"),
                                             source.consumer_group_metadata(), 30)
        producer.commit_transaction(30)

        assert source.committed() == (cut, "epochline:checkpoint=7")
