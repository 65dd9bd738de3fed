"""Window operator behaviours, one at a time (the randomised comparisons are in test_windows_properties.py).

Rows carry their source partition (``__kafka_partition``): window state is kept, snapshotted, restored and
dropped per partition (``engine.state.KeyedState``)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from connectors.metadata import PARTITION
from engine.state import KeyedState
from engine.transforms import OperatorConfigError, OperatorRuntimeError
from engine.transforms.windows import (
    DEFAULT_TIME_COLUMN,
    END_OF_INPUT_WATERMARK,
    STATE_FORMAT,
    WindowOperator,
    WindowSpec,
)

SCHEMA = pa.schema([("k", pa.string()), ("ts", pa.int64()), ("x", pa.int64()), (PARTITION, pa.int32())])
ALL_AGGREGATES = {"n": "count(*)", "c": "count(x)", "s": "sum(x)", "lo": "min(x)", "hi": "max(x)", "a": "avg(x)"}


def rows(*items: tuple[str | None, int | None, int | None], partition: int = 0) -> pa.Table:
    """Rows (k, ts, x) of one source partition."""
    columns = {name: [item[i] for item in items] for i, name in enumerate(("k", "ts", "x"))}
    return pa.table({**columns, PARTITION: [partition] * len(items)}, schema=SCHEMA)


def cycle(*parts: pa.Table) -> pa.Table:
    """One cycle's rows from several partitions."""
    return pa.concat_tables(parts)


def tumbling(size: int = 10, aggregates: dict[str, str] | None = None, key: list[str] | None = None) -> WindowOperator:
    spec = WindowSpec("tumbling", size, None, ["k"] if key is None else key, "ts", aggregates or {"n": "count(*)"})
    operator = WindowOperator(spec)
    operator.validate(SCHEMA)
    return operator


def plain(table: pa.Table) -> list[dict]:
    """Rows with window bounds as epoch ms, for compact expectations."""
    columns = {name: table[name] for name in table.column_names}
    for bound in ("window_start", "window_end"):
        columns[bound] = table[bound].cast(pa.int64())
    return pa.table(columns).to_pylist()


def test_output_is_keys_then_window_bounds_then_aggregates_in_the_given_order() -> None:
    schema = WindowOperator(WindowSpec("tumbling", 10, None, ["k"], "ts", ALL_AGGREGATES)).validate(SCHEMA)
    assert schema.names == ["k", "window_start", "window_end", "n", "c", "s", "lo", "hi", "a"]
    assert schema.field("window_start").type == pa.timestamp("ms", tz="UTC")
    assert schema.field("window_end").type == pa.timestamp("ms", tz="UTC")
    assert [schema.field(n).type for n in ("n", "c", "s", "lo", "hi", "a")] == [
        pa.int64(), pa.int64(), pa.int64(), pa.int64(), pa.int64(), pa.float64()]


def test_a_window_is_emitted_once_the_watermark_reaches_its_end() -> None:
    operator = tumbling()
    assert operator.process(rows(("a", 3, 1), ("a", 9, 1)), watermark=9).num_rows == 0
    assert plain(operator.process(SCHEMA.empty_table(), watermark=10)) == [
        {"k": "a", "window_start": 0, "window_end": 10, "n": 2}]
    assert operator.process(SCHEMA.empty_table(), watermark=11).num_rows == 0


def test_every_aggregate_over_one_window_with_a_null_value() -> None:
    operator = tumbling(aggregates=ALL_AGGREGATES)
    result = operator.process(rows(("a", 1, 4), ("a", 2, None), ("a", 3, 1)), watermark=10)
    assert plain(result) == [{"k": "a", "window_start": 0, "window_end": 10,
                              "n": 3, "c": 2, "s": 5, "lo": 1, "hi": 4, "a": 2.5}]


def test_aggregates_of_only_null_values_are_null_and_counts_zero() -> None:
    operator = tumbling(aggregates=ALL_AGGREGATES)
    [row] = plain(operator.process(rows(("a", 1, None)), watermark=10))
    assert (row["n"], row["c"], row["s"], row["lo"], row["hi"], row["a"]) == (1, 0, None, None, None, None)


def test_hopping_windows_count_a_row_in_every_window_containing_it() -> None:
    operator = WindowOperator(WindowSpec("hopping", 10, 5, [], "ts", {"n": "count(*)"}))
    operator.validate(SCHEMA)
    result = operator.process(rows(("a", 7, None), ("b", 12, None)), watermark=END_OF_INPUT_WATERMARK)
    assert [(r["window_start"], r["window_end"], r["n"]) for r in plain(result)] == [
        (0, 10, 1), (5, 15, 2), (10, 20, 1)]


def test_emission_is_ordered_by_window_end_then_key() -> None:
    operator = tumbling(key=["k"])
    result = operator.process(rows(("b", 12, 1), ("c", 1, 1), ("a", 15, 1), ("b", 2, 1)), watermark=20)
    assert [(r["window_start"], r["k"]) for r in plain(result)] == [(0, "b"), (0, "c"), (10, "a"), (10, "b")]


def test_event_times_before_the_epoch_fall_in_the_window_below_them() -> None:
    operator = tumbling()
    assert [(r["window_start"], r["window_end"]) for r in plain(operator.process(rows(("a", -1, 1)), 0))] == [(-10, 0)]


@pytest.mark.parametrize("arrow_type, value", [
    (pa.timestamp("s"), 12),
    (pa.timestamp("ms", tz="UTC"), 12_000),
    (pa.timestamp("us", tz="Europe/Paris"), 12_000_999),
    (pa.timestamp("ns", tz="America/New_York"), 12_000_999_999),
])
def test_timestamp_time_columns_of_any_unit_and_zone_are_floored_to_ms(arrow_type: pa.DataType, value: int) -> None:
    schema = pa.schema([("k", pa.string()), ("ts", arrow_type), ("x", pa.int64()), (PARTITION, pa.int32())])
    operator = WindowOperator(WindowSpec("tumbling", 1000, None, [], "ts", {"n": "count(*)"}))
    operator.validate(schema)
    table = pa.table({"k": ["a"], "ts": pa.array([value], arrow_type), "x": [1], PARTITION: [0]}, schema=schema)
    [row] = operator.process(table, END_OF_INPUT_WATERMARK).to_pylist()
    assert row["window_start"] == dt.datetime(1970, 1, 1, 0, 0, 12, tzinfo=dt.UTC)


def test_time_column_defaults_to_the_kafka_timestamp() -> None:
    schema = pa.schema([("k", pa.string()), (DEFAULT_TIME_COLUMN, pa.timestamp("ms", tz="UTC")),
                        (PARTITION, pa.int32())])
    operator = WindowOperator(WindowSpec("tumbling", 10, None, ["k"], None, {"n": "count(*)"}))
    assert operator.validate(schema).names == ["k", "window_start", "window_end", "n"]


def test_a_row_for_an_already_emitted_window_fails_the_cycle_instead_of_vanishing() -> None:
    """The engine dead-letters such rows before the window; one that still gets here is an error, never a
    row dropped with only a counter to show for it."""
    operator = tumbling()
    first = operator.process(rows(("a", 1, 1)), watermark=10)
    assert [(r["window_start"], r["n"]) for r in plain(first)] == [(0, 1)]
    with pytest.raises(OperatorRuntimeError, match=r"1 row\(s\) of partition\(s\) \[0\] belong to windows already"):
        operator.process(rows(("a", 2, 1), ("a", 11, 1)), watermark=10)


def test_a_row_without_event_time_fails_the_cycle_instead_of_vanishing() -> None:
    operator = tumbling()
    with pytest.raises(OperatorRuntimeError, match=r"1 row\(s\) have no event time in 'ts'"):
        operator.process(rows(("a", None, 1), ("a", 4, 1)), watermark=10)


def test_a_watermark_moving_backwards_changes_nothing() -> None:
    operator = tumbling()
    operator.process(rows(("a", 1, 1)), watermark=10)
    assert operator.process(rows(("a", 15, 1)), watermark=3).num_rows == 0
    assert operator.state.emitted_through == {0: 10}


def test_end_of_input_flush_emits_every_open_window_with_a_columnless_table() -> None:
    operator = tumbling()
    operator.process(rows(("a", 1, 1), ("b", 55, 1)), watermark=None)
    result = operator.process(pa.table({}), watermark=END_OF_INPUT_WATERMARK)
    assert [(r["k"], r["window_start"]) for r in plain(result)] == [("a", 0), ("b", 50)]
    assert operator.state.partials.num_rows == 0


def test_empty_cycle_without_open_windows_gives_empty_output_of_the_output_schema() -> None:
    operator = tumbling(aggregates=ALL_AGGREGATES)
    schema = WindowOperator(WindowSpec("tumbling", 10, None, ["k"], "ts", ALL_AGGREGATES)).validate(SCHEMA)
    result = operator.process(SCHEMA.empty_table(), watermark=100)
    assert result.num_rows == 0 and result.schema.equals(schema)


def test_renaming_an_output_column_keeps_the_state_restorable() -> None:
    operator = tumbling(aggregates={"n": "count(*)"})
    operator.process(rows(("a", 1, 1)), watermark=None)
    renamed = tumbling(aggregates={"events": "count(*)"})
    renamed.state.restore_partition(0, operator.state.snapshot_partition(0))
    assert plain(renamed.process(SCHEMA.empty_table(), watermark=10))[0]["events"] == 1


@pytest.mark.parametrize("spec, problem", [
    (WindowSpec("sliding", 10, None, [], "ts", {"n": "count(*)"}), "kind 'sliding'"),
    (WindowSpec("tumbling", 0, None, [], "ts", {"n": "count(*)"}), "size_ms 0 must be positive"),
    (WindowSpec("hopping", 10, None, [], "ts", {"n": "count(*)"}), "hopping slide_ms None"),
    (WindowSpec("hopping", 10, 20, [], "ts", {"n": "count(*)"}), "hopping slide_ms 20"),
    (WindowSpec("tumbling", 10, 5, [], "ts", {"n": "count(*)"}), "tumbling windows take no slide_ms"),
    (WindowSpec("tumbling", 10, None, [], "ts", {}), "no aggregates"),
    (WindowSpec("tumbling", 10, None, ["k"], "ts", {"k": "count(*)"}), r"output columns \['k'\]"),
    (WindowSpec("tumbling", 10, None, [], "ts", {"n": "median(x)"}), "'n' = 'median\\(x\\)' is not one of"),
    (WindowSpec("tumbling", 10, None, [], "ts", {"n": "sum(*)"}), "only count takes"),
])
def test_bad_window_spec_is_a_config_error_naming_the_operator(spec: WindowSpec, problem: str) -> None:
    with pytest.raises(OperatorConfigError, match=rf"'per_key'.*{problem}"):
        WindowOperator(spec, name="per_key")


@pytest.mark.parametrize("spec, problem", [
    (WindowSpec("tumbling", 10, None, ["nope"], "ts", {"n": "count(*)"}), r"no column\(s\) \['nope'\]"),
    (WindowSpec("tumbling", 10, None, [], "ts", {"n": "max(missing)"}), r"no column\(s\) \['missing'\]"),
    (WindowSpec("tumbling", 10, None, [], "k", {"n": "count(*)"}), "time column 'k' is string"),
    (WindowSpec("tumbling", 10, None, [], "ts", {"s": "sum(k)"}), r"sum\(k\) needs a numeric column"),
])
def test_spec_not_matching_the_input_schema_is_a_config_error_at_validate(spec: WindowSpec, problem: str) -> None:
    with pytest.raises(OperatorConfigError, match=rf"'per_key'.*{problem}"):
        WindowOperator(spec, name="per_key").validate(SCHEMA)




# -- state per source partition ------------------------------------------------------------------------


def with_format(snapshot: bytes, version: str) -> bytes:
    """``snapshot`` with its format version replaced."""
    return with_metadata(snapshot, "epochline.window.format", version)


def with_metadata(snapshot: bytes, key: str, value: str) -> bytes:
    """``snapshot`` with one entry of its schema metadata replaced."""
    table = pa.ipc.open_stream(snapshot).read_all()
    metadata = {**(table.schema.metadata or {}), key.encode(): value.encode()}
    sink = pa.BufferOutputStream()
    table = table.replace_schema_metadata(metadata)
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_window_state_is_keyed_state() -> None:
    state = tumbling().state
    keyed: KeyedState = state
    assert isinstance(keyed, KeyedState)


def test_an_input_without_the_kafka_partition_is_a_config_error_saying_to_keep_it() -> None:
    schema = pa.schema([("k", pa.string()), ("ts", pa.int64())])
    operator = WindowOperator(WindowSpec("tumbling", 10, None, ["k"], "ts", {"n": "count(*)"}), name="per_key")
    with pytest.raises(OperatorConfigError,
                       match=r"'per_key'.*no '__kafka_partition' column.*keep __kafka_partition in the preceding step"):
        operator.validate(schema)


def test_a_non_integer_kafka_partition_is_a_config_error() -> None:
    schema = pa.schema([("k", pa.string()), ("ts", pa.int64()), (PARTITION, pa.string())])
    operator = WindowOperator(WindowSpec("tumbling", 10, None, ["k"], "ts", {"n": "count(*)"}), name="per_key")
    with pytest.raises(OperatorConfigError, match=r"'per_key'.*'__kafka_partition' is string"):
        operator.validate(schema)


def test_rows_without_a_partition_fail_the_cycle() -> None:
    table = rows(("a", 1, 1)).set_column(3, PARTITION, pa.array([None], pa.int32()))
    with pytest.raises(OperatorRuntimeError, match=r"1 row\(s\) have no __kafka_partition"):
        tumbling().process(table, watermark=None)


def test_the_same_key_in_two_partitions_gives_one_window_per_partition_ordered_by_partition() -> None:
    operator = tumbling(aggregates={"s": "sum(x)"})
    result = operator.process(cycle(rows(("a", 1, 2), partition=1), rows(("a", 2, 5), ("a", 11, 1))), watermark=20)
    assert result.column_names == ["k", "window_start", "window_end", "s"]
    assert [(r["window_start"], r["s"]) for r in plain(result)] == [(0, 5), (0, 2), (10, 1)]


def test_a_partition_snapshot_restores_into_a_fresh_operator_with_the_same_bytes_and_windows() -> None:
    operator = tumbling(aggregates=ALL_AGGREGATES)
    operator.process(cycle(rows(("a", 1, 1), ("b", 22, None)), rows(("a", 3, 4), ("c", 12, 2), partition=1)),
                     watermark=10)
    snapshot = operator.state.snapshot_partition(1)

    restored = tumbling(aggregates=ALL_AGGREGATES)
    restored.state.restore_partition(1, snapshot)
    assert restored.state.snapshot_partition(1) == snapshot
    assert (restored.state.partitions(), restored.state.emitted_through) == ({1}, {1: 10})
    flush = SCHEMA.empty_table()
    assert plain(restored.process(flush, END_OF_INPUT_WATERMARK)) == [
        row for row in plain(operator.process(flush, END_OF_INPUT_WATERMARK)) if row["k"] == "c"]


def test_restoring_partition_1_and_feeding_the_rest_equals_one_operator_that_saw_all_of_partition_1() -> None:
    partition_0 = [rows(("a", 1, 1), ("z", 14, 3)), rows(("a", 25, 2)), rows(("z", 31, 9))]
    partition_1 = [rows(("a", 2, 5), ("b", 8, 1), partition=1), rows(("b", 12, 7), partition=1),
                   rows(("a", 18, 2), ("b", 33, 4), partition=1)]
    watermarks = [5, 15, END_OF_INPUT_WATERMARK]
    everything = tumbling(aggregates=ALL_AGGREGATES)
    everything.process(cycle(partition_0[0], partition_1[0]), watermarks[0])

    moved = tumbling(aggregates=ALL_AGGREGATES)
    moved.state.restore_partition(1, everything.state.snapshot_partition(1))
    only_partition_1 = tumbling(aggregates=ALL_AGGREGATES)
    only_partition_1.process(partition_1[0], watermarks[0])
    for table, watermark in zip(partition_1[1:], watermarks[1:], strict=True):
        assert plain(moved.process(table, watermark)) == plain(only_partition_1.process(table, watermark))
    assert moved.state.partitions() == only_partition_1.state.partitions() == {1}


def test_drop_partition_forgets_only_that_partition_and_marks_nothing_changed() -> None:
    operator = tumbling()
    operator.process(cycle(rows(("a", 1, 1), ("a", 12, 1)), rows(("b", 3, 1), partition=1)), watermark=10)
    kept = operator.state.snapshot_partition(1)
    operator.state.clear_changed()

    operator.state.drop_partition(0)
    assert operator.state.partitions() == {1}
    assert operator.state.changed_partitions() == set()
    assert operator.state.snapshot_partition(1) == kept
    assert operator.state.snapshot_partition(0) == tumbling().state.snapshot_partition(0)
    assert operator.state.emitted_through == {1: 10}
    assert plain(operator.process(SCHEMA.empty_table(), END_OF_INPUT_WATERMARK)) == []  # b's window went at 10


def test_changed_partitions_are_exactly_those_that_absorbed_rows_emitted_or_saw_a_higher_watermark() -> None:
    operator = tumbling()
    state = operator.state

    def changed_by(table: pa.Table, watermark: int | None) -> set[int]:
        state.clear_changed()
        operator.process(table, watermark)
        return state.changed_partitions()

    assert changed_by(cycle(rows(("a", 1, 1)), rows(("b", 2, 1), partition=1)), None) == {0, 1}
    assert changed_by(rows(("b", 3, 1), partition=1), None) == {1}
    assert changed_by(SCHEMA.empty_table(), None) == set()
    assert changed_by(SCHEMA.empty_table(), 5) == {0, 1}  # emitted_through moved: part of the snapshot
    assert changed_by(SCHEMA.empty_table(), 5) == set()
    assert changed_by(rows(("c", 4, 1), partition=2), 5) == {2}
    assert changed_by(SCHEMA.empty_table(), 10) == {0, 1, 2}  # every window [0, 10) emitted
    state.clear_changed()
    state.restore_partition(0, state.snapshot_partition(0))
    state.restore_partition(1, None)
    assert state.changed_partitions() == set()


def test_restoring_or_dropping_a_partition_forgets_that_it_changed() -> None:
    operator = tumbling()
    operator.process(cycle(rows(("a", 1, 1)), rows(("b", 2, 1), partition=1), rows(("c", 2, 1), partition=2)), None)
    operator.state.restore_partition(1, None)
    operator.state.drop_partition(2)
    assert operator.state.changed_partitions() == {0}


def test_a_restored_partition_that_emitted_further_refuses_rows_its_neighbours_accept() -> None:
    ahead = tumbling()
    ahead.process(rows(("a", 1, 1), partition=1), watermark=20)
    operator = tumbling()
    operator.process(rows(("a", 2, 1)), watermark=10)
    operator.state.restore_partition(1, ahead.state.snapshot_partition(1))
    assert operator.state.emitted_through == {0: 10, 1: 20}

    operator.process(rows(("b", 15, 1)), watermark=None)
    with pytest.raises(OperatorRuntimeError, match=r"partition\(s\) \[1\]"):
        operator.process(rows(("b", 16, 1), partition=1), watermark=None)
    result = operator.process(SCHEMA.empty_table(), END_OF_INPUT_WATERMARK)
    assert [(r["k"], r["window_start"]) for r in plain(result)] == [("b", 10)]  # partition 0's only


def test_a_partition_without_state_when_the_watermark_passed_has_emitted_nothing() -> None:
    operator = tumbling()
    operator.process(rows(("a", 1, 1)), watermark=50)
    assert operator.state.emitted_through == {0: 50}
    result = operator.process(rows(("b", 3, 1), partition=1), watermark=50)
    assert [(r["k"], r["window_start"]) for r in plain(result)] == [("b", 0)]
    assert operator.state.emitted_through == {0: 50, 1: 50}


def test_open_until_is_the_end_of_each_partitions_last_open_window() -> None:
    operator = tumbling()
    operator.process(cycle(rows(("a", 1, 1), ("b", 14, 1)), rows(("a", 3, 1), partition=1)), watermark=None)
    assert operator.state.open_until() == {0: 20, 1: 10}
    operator.process(SCHEMA.empty_table(), watermark={0: 10, 1: 10})
    assert operator.state.open_until() == {0: 20}


def test_partition_snapshots_of_equal_state_are_equal_bytes_whatever_the_other_partitions_hold() -> None:
    left, right = tumbling(aggregates=ALL_AGGREGATES), tumbling(aggregates=ALL_AGGREGATES)
    left.process(cycle(rows(("b", 1, 1), ("a", 2, 5), partition=1), rows(("a", 4, 4))), watermark=None)
    left.process(rows(("a", 13, 7), partition=1), watermark=None)
    right.process(rows(("a", 13, 7), ("a", 2, 5), ("b", 1, 1), partition=1), watermark=None)
    assert left.state.snapshot_partition(1) == right.state.snapshot_partition(1)
    assert left.state.snapshot_partition(0) != right.state.snapshot_partition(0)


def test_a_partition_without_state_has_a_small_snapshot_that_restores_to_nothing() -> None:
    operator = tumbling()
    snapshot = operator.state.snapshot_partition(7)
    assert len(snapshot) < 1024
    operator.state.restore_partition(7, snapshot)
    assert (operator.state.partitions(), operator.state.emitted_through) == (set(), {})


def test_a_partition_snapshot_restored_as_another_partition_is_refused() -> None:
    operator = tumbling()
    operator.process(rows(("a", 1, 1), partition=1), watermark=None)
    with pytest.raises(OperatorRuntimeError, match="state of partition 1 cannot be restored as partition 2"):
        tumbling().state.restore_partition(2, operator.state.snapshot_partition(1))


def test_a_refused_partition_snapshot_leaves_that_partition_as_it_was() -> None:
    operator = tumbling()
    operator.process(rows(("a", 1, 1), partition=1), watermark=None)
    before = operator.state.snapshot_partition(1)
    with pytest.raises(OperatorConfigError, match="written for spec"):
        operator.state.restore_partition(1, tumbling(size=20).state.snapshot_partition(1))
    assert operator.state.snapshot_partition(1) == before


def test_a_partition_snapshot_of_another_input_type_is_a_config_error() -> None:
    other_schema = pa.schema([("k", pa.string()), ("ts", pa.int64()), ("x", pa.float64()), (PARTITION, pa.int32())])
    other = WindowOperator(WindowSpec("tumbling", 10, None, ["k"], "ts", {"s": "sum(x)"}))
    other.validate(other_schema)
    other.process(pa.table({"k": ["a"], "ts": [1], "x": [1.5], PARTITION: [0]}, schema=other_schema), None)
    with pytest.raises(OperatorConfigError, match="restored window state has columns"):
        tumbling(aggregates={"s": "sum(x)"}).state.restore_partition(0, other.state.snapshot_partition(0))


def test_a_partition_snapshot_of_another_format_version_is_refused() -> None:
    operator = tumbling()
    operator.process(rows(("a", 1, 1)), watermark=None)
    with pytest.raises(OperatorRuntimeError, match=rf"format '1', this version reads '{STATE_FORMAT}'"):
        tumbling().state.restore_partition(0, with_format(operator.state.snapshot_partition(0), "1"))


def test_a_snapshot_that_does_not_hold_one_partition_is_refused() -> None:
    operator = tumbling()
    operator.process(rows(("a", 1, 1)), watermark=None)
    whole = with_metadata(operator.state.snapshot_partition(0), "epochline.window.content", "all-partitions")
    with pytest.raises(OperatorRuntimeError, match="holds 'all-partitions', expected 'partition'"):
        tumbling().state.restore_partition(0, whole)
