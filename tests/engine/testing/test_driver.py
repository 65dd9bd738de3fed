"""``TransformTestDriver``: a connector's transform tested without Kafka, through the same code as a run."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from engine.checkpoint import PipelineHalted
from engine.config import ConnectorConfig, load_config
from engine.testing import TransformTestDriver, create_unique_topic, produce_rows, read_topic, read_values
from engine.testing.connectors import write_config
from engine.testing.pipelines import run_pipeline
from schemas import FormatSpec
from tests.helpers import EXAMPLES

UTC = dt.UTC


def at(seconds: float) -> str:
    return (dt.datetime(2026, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=seconds)).isoformat()


def order(i: int, amount: float, seconds: float = 0.0, user: str = "ada") -> dict[str, Any]:
    return {"id": i, "user": user, "amount": amount, "ts": at(seconds)}


def headers(record: Any) -> dict[str, str]:
    return {name: value.decode() for name, value in record.headers}


# -- the orders example, as shipped -------------------------------------------------------------------------

def test_the_orders_example_keeps_valid_orders_and_doubles_them() -> None:
    with TransformTestDriver(EXAMPLES / "orders-clean.yaml") as driver:
        driver.send([order(1, 10.0), order(2, -3.0), order(3, 0.5)])

        assert driver.output_rows() == [{"id": 1, "amount2": 20.0}, {"id": 3, "amount2": 1.0}]
        assert [orjson.loads(record.value or b"") for record in driver.output()] == driver.output_rows()
        assert driver.dead_letters() == []


def test_a_record_that_does_not_decode_goes_to_the_dead_letter_topic_with_its_bytes_and_reason() -> None:
    with TransformTestDriver(EXAMPLES / "orders-clean.yaml") as driver:
        driver.send([order(1, 10.0)])
        driver.send_raw([b"{not json", orjson.dumps({"id": 4, "user": "bob"})], key=b"k")

        letters = driver.dead_letters()
        assert [(letter.key, letter.value) for letter in letters] == [
            (b"k", b"{not json"), (b"k", orjson.dumps({"id": 4, "user": "bob"}))]
        assert [headers(letter)["epochline.stage"] for letter in letters] == ["decode", "decode"]
        assert [headers(letter)["epochline.offset"] for letter in letters] == ["1", "2"]
        assert all(headers(letter)["epochline.reason"] for letter in letters)
        assert "amount" in headers(letters[1])["epochline.reason"]
        assert driver.output_rows() == [{"id": 1, "amount2": 20.0}]


# -- windows, event time and late rows ----------------------------------------------------------------------

def window_config(tmp_path: Path, name: str = "driver-windows", topic: str = "orders",
                  sink: str = "order-totals", dlq: str = "orders-late") -> ConnectorConfig:
    schema = tmp_path / "orders.schema.json"
    schema.write_bytes((EXAMPLES / "orders.schema.json").read_bytes())
    return load_config(write_config(tmp_path, {
        "name": name,
        "source": {"topic": topic, "format": "json", "schema": schema.name,
                   "event_time": {"column": "ts", "allowed_lateness": "0s"}},
        "transform": {"window": {"kind": "tumbling", "size": "10s", "key": ["user"], "time_column": "ts",
                                 "aggregates": {"total": "sum(amount)", "n": "count(*)"}}},
        "sink": {"topic": sink, "format": "json"},
        "dead_letter": {"topic": dlq},
        "checkpoint": {"interval": "200ms", "dir": "state"},
    }))


def totals(rows: list[dict[str, Any]]) -> list[tuple[str, str, float, int]]:
    return [(row["user"], row["window_start"], row["total"], row["n"]) for row in rows]


def test_a_tumbling_window_emits_once_event_time_passes_its_end_and_late_rows_are_dead_lettered(
        tmp_path: Path) -> None:
    with TransformTestDriver(window_config(tmp_path)) as driver:
        driver.send([order(1, 1.0, 1), order(2, 2.0, 4, "bob"), order(3, 3.0, 9)])
        assert driver.output() == []  # the window [0 s, 10 s) is still open

        driver.send([order(4, 4.0, 12)])  # event time 12 s: the watermark passes 10 s
        assert totals(driver.output_rows()) == [
            ("ada", "2026-01-01T00:00:00.000Z", 4.0, 2), ("bob", "2026-01-01T00:00:00.000Z", 2.0, 1)]

        driver.send([order(5, 5.0, 3), order(6, 6.0, 2)])  # behind the watermark: late
        driver.advance_event_time(dt.datetime(2026, 1, 1, 0, 0, 20, tzinfo=UTC).timestamp() * 1000)
        assert totals(driver.output_rows())[2:] == [("ada", "2026-01-01T00:00:10.000Z", 4.0, 1)]
        late = driver.dead_letters()
        # judged where the window reads its rows, on the repartition topic: each row as it was written there
        assert [pa.ipc.open_stream(letter.value).read_all().column("id").to_pylist() for letter in late] == [[5], [6]]
        assert [headers(letter)["epochline.stage"] for letter in late] == ["late", "late"]
        assert all("late row" in headers(letter)["epochline.reason"] for letter in late)


def test_window_state_survives_a_snapshot_restored_into_a_new_driver(tmp_path: Path) -> None:
    config = window_config(tmp_path)
    with TransformTestDriver(config) as first:
        first.send([order(1, 1.0, 1), order(2, 2.0, 2)])
        assert first.output() == []
        snapshot = first.snapshot()

    with TransformTestDriver(config, restore=snapshot) as second:
        second.send([order(3, 3.0, 11)])
        assert totals(second.output_rows()) == [("ada", "2026-01-01T00:00:00.000Z", 3.0, 2)]


def test_a_failing_python_transform_halts_without_committing_under_exactly_once(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, {
        "name": "driver-poison",
        "source": {"topic": "in", "format": "json"},
        "transform": [{"python": "tests.helpers.transforms:fail_on_poison"}],
        "sink": {"topic": "out", "format": "json"},
        "dead_letter": {"topic": "dlq"},
    }))
    from tests.helpers.transforms import POISON_ID

    with TransformTestDriver(config) as driver:
        driver.send([{"id": 1}])
        assert [orjson.loads(r.value or b"") for r in driver.output()] == [{"id": 1}]
        driver.send([{"id": POISON_ID}])
        with pytest.raises(PipelineHalted, match="halting without committing"):
            driver.output()


# -- the same cases on a broker give the same records -------------------------------------------------------

def test_the_driver_and_a_run_on_the_broker_produce_the_same_records(kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = create_unique_topic(kafka_bootstrap, "orders")
    sink, dlq = create_unique_topic(kafka_bootstrap, "totals"), create_unique_topic(kafka_bootstrap, "late")
    config = window_config(tmp_path, name=topic, topic=topic, sink=sink, dlq=dlq)
    batches = [[order(1, 1.0, 1), order(2, 2.0, 4, "bob"), order(3, 3.0, 9)], [order(4, 4.0, 12)],
               [order(5, 5.0, 3), order(6, 6.0, 25, "bob")]]
    spec = FormatSpec(format="json", schema=tmp_path / "orders.schema.json")
    with TransformTestDriver(config) as driver:
        for rows in batches:
            driver.send(rows)
            driver.output()
        on_driver = (sorted(r.value or b"" for r in driver.output()), [r.value for r in driver.dead_letters()])

    for rows in batches:  # one run per batch, as the driver committed once per batch
        produce_rows(kafka_bootstrap, topic, rows, spec)
        run_pipeline(config.base_dir / f"{topic}.yaml", kafka_bootstrap)

    on_broker = (sorted(v or b"" for v in read_values(kafka_bootstrap, sink)), read_values(kafka_bootstrap, dlq))
    assert on_driver == on_broker
    assert read_topic(kafka_bootstrap, sink, FormatSpec(format="json")).num_rows == 3


def quiet_partition_config(tmp_path: Path, idle_timeout_ms: int) -> ConnectorConfig:
    schema = tmp_path / "orders.schema.json"
    schema.write_bytes((EXAMPLES / "orders.schema.json").read_bytes())
    return load_config(write_config(tmp_path / str(idle_timeout_ms), {
        "name": "driver-quiet",
        "source": {"topic": "orders", "format": "json", "schema": str(schema),
                   "event_time": {"column": "ts", "allowed_lateness": "0s", "idle_timeout": idle_timeout_ms}},
        "transform": {"window": {"kind": "tumbling", "size": "10s", "key": ["__kafka_key", "user"],
                                 "time_column": "ts", "aggregates": {"total": "sum(amount)", "n": "count(*)"}}},
        "sink": {"topic": "order-totals", "format": "json"},
        "dead_letter": {"topic": "orders-late"},
    }))


def test_a_row_behind_what_its_partitions_windows_already_emitted_is_dead_lettered_not_lost(
        tmp_path: Path) -> None:
    with TransformTestDriver(quiet_partition_config(tmp_path, 1), partitions=2) as driver:
        driver.send([order(1, 1.0, 1)], partition=0, key=b"ada")
        driver.send([order(2, 2.0, 25, "bob")], partition=1, key=b"bob")
        time.sleep(0.05)
        driver.send([order(3, 3.0, 30, "bob")], partition=1, key=b"bob")  # partition 0 follows: [0, 10) closes
        assert ("ada", "2026-01-01T00:00:00.000Z", 1.0, 1) in totals(driver.output_rows())
        snapshot = driver.snapshot()
    # A new owner of partition 0: its own event time (1 s, from the offset metadata) is behind what its window
    # state (from the changelog) already emitted (10 s: its quiet windows closed, no further); a row at 5 s is
    # late, not silently ignored.
    with TransformTestDriver(quiet_partition_config(tmp_path, 3_600_000), partitions=2, restore=snapshot) as owner:
        owner.send([order(4, 4.0, 5)], partition=0, key=b"ada")
        assert [orjson.loads(letter.value or b"")["id"] for letter in owner.dead_letters()] == [4]
        assert owner.output_rows() == []


# -- event time judges only what holds event-time state ------------------------------------------------------

def test_a_stateless_connector_never_judges_a_row_by_its_timestamp(tmp_path: Path) -> None:
    """Kafka timestamps going backwards by hours, on two partitions, one of them quiet for a while: every
    row is output, nothing is late (the orders example has no window)."""
    hour = 3_600_000
    with TransformTestDriver(EXAMPLES / "orders-clean.yaml", partitions=2) as driver:
        for i in range(6):
            driver.send([order(i, 1.0 + i)], partition=i % 2, timestamp_ms=1_800_000_000_000 - i * hour)
            driver.output()
        time.sleep(0.05)
        driver.send([order(9, 9.0)], partition=0, timestamp_ms=1_000)  # decades behind the rest
        assert sorted(row["id"] for row in driver.output_rows()) == [0, 1, 2, 3, 4, 5, 9]
        assert driver.dead_letters() == []
        counters = driver.metrics.counters()
        assert counters.late_rows_diverted == counters.late_rows_dropped == 0


def window_totals_reference(rows: list[tuple[int, dict[str, Any]]], size_s: int = 10) -> dict[tuple, tuple]:
    """Per (partition, user, window start): (sum of amounts, count) over ``rows`` (partition, order)."""
    windows: dict[tuple, tuple] = {}
    for partition, row in rows:
        seconds = (dt.datetime.fromisoformat(row["ts"]) - dt.datetime(2026, 1, 1, tzinfo=UTC)).total_seconds()
        key = (partition, row["user"], int(seconds // size_s) * size_s)
        total, count = windows.get(key, (0.0, 0))
        windows[key] = (total + row["amount"], count + 1)
    return windows


def test_a_quiet_partition_that_wakes_with_rows_of_the_others_moment_has_none_judged_late(tmp_path: Path) -> None:
    """Partition 0 goes quiet past idle_timeout while partition 1 moves on: partition 0's open window is
    emitted (closed by the others' progress, no further than its own end), and the rows it delivers when it
    wakes, of the moment partition 1 is at, are on time. Windows checked against a Python reference."""
    sent: list[tuple[int, dict[str, Any]]] = []
    with TransformTestDriver(quiet_partition_config(tmp_path, 1), partitions=2) as driver:
        def send(partition: int, rows: list[dict[str, Any]]) -> None:
            sent.extend((partition, row) for row in rows)
            driver.send(rows, partition=partition, key=b"k")
            driver.output()

        send(0, [order(1, 1.0, 1), order(2, 2.0, 5)])
        send(1, [order(3, 3.0, 2)])
        time.sleep(0.05)  # both quiet past the idle timeout (1 ms)
        send(1, [order(4, 4.0, 20), order(5, 5.0, 21), order(6, 6.0, 33)])  # partition 1 moves on to 33 s
        emitted = {(row["window_start"], row["total"]) for row in driver.output_rows()}
        assert ("2026-01-01T00:00:00.000Z", 3.0) in emitted  # partition 0's quiet window [0, 10 s) came out
        send(0, [order(7, 7.0, 20), order(8, 8.0, 21), order(9, 9.0, 25)])  # it wakes at partition 1's moment
        driver.advance_event_time(int(dt.datetime(2026, 1, 1, 0, 1, tzinfo=UTC).timestamp() * 1000))

        assert driver.dead_letters() == []
        emitted_windows = {}
        for row in driver.output_rows():
            start = int((dt.datetime.fromisoformat(row["window_start"]) - dt.datetime(2026, 1, 1, tzinfo=UTC))
                        .total_seconds())
            emitted_windows.setdefault((row["user"], start), []).append((row["total"], row["n"]))
    reference: dict[tuple, list[tuple]] = {}
    for (_, user, start), value in sorted(window_totals_reference(sent).items()):
        reference.setdefault((user, start), []).append(value)
    assert {key: sorted(values) for key, values in emitted_windows.items()} == {
        key: sorted(values) for key, values in reference.items()}
