"""The committed offset's metadata string: one codec for checkpoint ids and batch items."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition

from connectors.offset_metadata import (
    CommittedEpoch,
    MalformedOffsetMetadata,
    checkpoint_id_from_metadata,
    checkpoint_metadata,
    committed_epoch,
    decode,
    encode,
    tagged,
)


def test_a_checkpoint_id_round_trips_through_its_metadata_string() -> None:
    assert checkpoint_metadata(42) == "epochline:checkpoint=42"
    assert checkpoint_id_from_metadata(checkpoint_metadata(42)) == 42


def test_a_streaming_commit_carries_its_cumulative_dead_letter_count() -> None:
    """The count of a partition's dead letters in all committed epochs travels with its offset, so whoever
    reads the group, or owns the partition next, knows it without asking the process that counted."""
    metadata = checkpoint_metadata(9, "i1", 1_700, 1_800, dead_letters=4)
    assert metadata == "epochline:checkpoint=9;instance=i1;event_time=1700;at=1800;dead_letters=4"
    assert committed_epoch(metadata) == CommittedEpoch(9, "i1", 1_700, 4)
    assert committed_epoch(checkpoint_metadata(9)) == CommittedEpoch(9)  # a commit by an older version


def test_a_dead_letter_count_that_is_not_a_number_is_an_error_that_quotes_it() -> None:
    with pytest.raises(MalformedOffsetMetadata, match="dead_letters=-2"):
        committed_epoch("epochline:checkpoint=3;dead_letters=-2")


@pytest.mark.parametrize("metadata", [None, "", "someone-else's", "epochline:batch=b;item=p0000:01;run=r"])
def test_metadata_that_names_no_checkpoint_reads_as_none(metadata: str | None) -> None:
    assert checkpoint_id_from_metadata(metadata) is None


@pytest.mark.parametrize("metadata", ["epochline:checkpoint=abc", "epochline:checkpoint=", "epochline:checkpoint=-1",
                                      "epochline:checkpoint"])
def test_epochline_metadata_that_cannot_be_read_is_an_error_that_quotes_it(metadata: str) -> None:
    with pytest.raises(MalformedOffsetMetadata, match=metadata):
        checkpoint_id_from_metadata(metadata)


def test_fields_keep_their_order_and_values() -> None:
    fields = {"batch": "nightly", "item": "p0003:00000000000000001000", "run": "ab12", "seconds": "1.500"}
    assert decode(encode(fields)) == fields


def test_a_value_that_would_break_the_format_is_refused() -> None:
    with pytest.raises(ValueError, match="may not contain"):
        encode({"batch": "a;b"})


def test_tagged_offsets_carry_the_metadata_and_keep_their_positions() -> None:
    offsets = [TopicPartition("orders", 0, 7), TopicPartition("orders", 3, 9)]
    assert [(tp.topic, tp.partition, tp.offset, tp.metadata) for tp in tagged(offsets, "epochline:checkpoint=2")] == [
        ("orders", 0, 7, "epochline:checkpoint=2"), ("orders", 3, 9, "epochline:checkpoint=2")]
