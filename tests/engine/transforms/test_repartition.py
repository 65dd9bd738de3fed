"""Re-keying by the window key: which partition a row goes to, what it carries, and windows over it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from engine.testing import TransformTestDriver
from engine.transforms import OperatorConfigError, WindowOperator, WindowSpec, build_chain
from engine.transforms.repartition import carried, restored, split_by_key, split_for_repartition
from tests.engine.testing.test_driver import order, totals, window_config


def window(key: list[str], name: str = "step0-window") -> WindowOperator:
    return WindowOperator(WindowSpec("tumbling", 10_000, None, key, "ts", {"n": "count(*)"}), name=name)


def test_one_key_always_lands_on_one_partition_whatever_batch_it_comes_in() -> None:
    first = split_by_key(pa.table({"user": ["ada", "bob", "cy", "ada"], "n": [1, 2, 3, 4]}), ["user"], 6)
    second = split_by_key(pa.table({"user": ["cy", "ada"], "n": [5, 6]}), ["user"], 6)
    home = {user: partition for partition, part in first.items() for user in part.column("user").to_pylist()}
    assert {user: partition for partition, part in second.items() for user in part.column("user").to_pylist()} \
        == {"cy": home["cy"], "ada": home["ada"]}
    assert sorted(n for part in first.values() for n in part.column("n").to_pylist()) == [1, 2, 3, 4]


def test_a_window_keyed_by_the_kafka_key_needs_no_repartition_and_others_split_before_the_window() -> None:
    assert split_for_repartition(build_chain([window(["__kafka_key", "user"])])) is None
    stages = split_for_repartition(build_chain([window(["user"])]))
    assert stages is not None and stages.key == ["user"] and not stages.before.steps


def test_a_second_window_after_a_repartitioned_one_is_refused() -> None:
    with pytest.raises(OperatorConfigError, match="second window"):
        split_for_repartition(build_chain([window(["user"]), window(["region"], name="step1-window")]))


def test_rows_carry_their_kafka_timestamp_and_key_through_the_repartition_topic() -> None:
    source = pa.table({"user": ["ada"], "__kafka_partition": pa.array([3], pa.int32()),
                       "__kafka_timestamp": pa.array([1_000], pa.timestamp("ms", tz="UTC")),
                       "__kafka_key": [b"k"]})
    through = carried(source)
    assert through.column_names == ["user", "__epochline_kafka_timestamp", "__epochline_kafka_key"]
    read = through.append_column("__kafka_partition", pa.array([1], pa.int32())) \
        .append_column("__kafka_timestamp", pa.array([9_999], pa.timestamp("ms", tz="UTC"))) \
        .append_column("__kafka_key", pa.array([b"repartition"]))
    back = restored(read.to_batches()[0])
    assert back.column("__kafka_timestamp").to_pylist() == source.column("__kafka_timestamp").to_pylist()
    assert back.column("__kafka_key").to_pylist() == [b"k"]
    assert back.column("__kafka_partition").to_pylist() == [1]  # state is keyed by the repartition partition


def test_a_key_spread_over_partitions_is_aggregated_once_after_the_repartition(tmp_path: Path) -> None:
    with TransformTestDriver(window_config(tmp_path), partitions=3) as driver:
        for partition in range(3):
            driver.send([order(partition, 1.0 + partition, 1 + partition)], partition=partition)
        for partition in range(3):
            driver.send([order(10 + partition, 0.0, 15)], partition=partition)  # every partition passes 10 s
        assert totals(driver.output_rows()) == [("ada", "2026-01-01T00:00:00.000Z", 6.0, 3)]
