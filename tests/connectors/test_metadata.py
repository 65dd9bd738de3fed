"""Per-partition maxima over a batch: the numbers a fetch's next offsets and a batch's watermark come from."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from connectors.metadata import MASKED_MAXIMA_LIMIT, maxima_by_partition


def brute_force(partitions: list[int], values: list[int | None]) -> dict[int, int]:
    maxima: dict[int, int] = {}
    for partition, value in zip(partitions, values):
        if value is not None:
            maxima[partition] = max(value, maxima.get(partition, value))
    return maxima


@pytest.mark.parametrize("partition_count", [1, 4, MASKED_MAXIMA_LIMIT, MASKED_MAXIMA_LIMIT + 1, 128])
def test_each_partition_gets_its_largest_value_however_many_partitions_a_batch_holds(partition_count: int) -> None:
    rng = random.Random(partition_count)
    partitions = [rng.randrange(partition_count) for _ in range(5_000)]
    values: list[int | None] = [rng.randrange(-2**62, 2**62) for _ in partitions]
    got = maxima_by_partition(pa.array(partitions, pa.int32()), pa.array(values, pa.int64()))
    assert got == brute_force(partitions, values)


@pytest.mark.parametrize("partition_count", [3, MASKED_MAXIMA_LIMIT + 5])
def test_null_values_are_ignored_and_a_partition_of_only_nulls_has_no_maximum(partition_count: int) -> None:
    rng = random.Random(7)
    partitions = [rng.randrange(partition_count) for _ in range(2_000)] + [partition_count] * 3
    values = [None if rng.random() < 0.3 else rng.randrange(10**12) for _ in range(2_000)] + [None] * 3
    got = maxima_by_partition(pa.array(partitions, pa.int32()), pa.array(values, pa.int64()))
    assert got == brute_force(partitions, values)
    assert partition_count not in got


def test_an_empty_batch_has_no_maxima() -> None:
    assert maxima_by_partition(pa.array([], pa.int32()), pa.array([], pa.int64())) == {}


def test_a_value_below_zero_is_a_maximum_like_any_other() -> None:
    """Masks never use a stand-in value for nulls that a real value could equal."""
    got = maxima_by_partition(pa.array([0, 0, 1], pa.int32()), pa.array([-5, None, -1], pa.int64()))
    assert got == {0: -5, 1: -1}
