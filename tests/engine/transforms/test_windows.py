"""Window operator behaviours, one at a time (the randomised comparisons are in test_windows_properties.py)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from engine.transforms import OperatorConfigError
from engine.transforms.windows import (
    DEFAULT_TIME_COLUMN,
    END_OF_INPUT_WATERMARK,
    WindowOperator,
    WindowSpec,
)

SCHEMA = pa.schema([("k", pa.string()), ("ts", pa.int64()), ("x", pa.int64())])
ALL_AGGREGATES = {"n": "count(*)", "c": "count(x)", "s": "sum(x)", "lo": "min(x)", "hi": "max(x)", "a": "avg(x)"}


def rows(*items: tuple[str, int, int | None], schema: pa.Schema = SCHEMA) -> pa.Table:
    return pa.table({name: [item[i] for item in items] for i, name in enumerate(schema.names)}, schema=schema)


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
    schema = pa.schema([("k", pa.string()), ("ts", arrow_type), ("x", pa.int64())])
    operator = WindowOperator(WindowSpec("tumbling", 1000, None, [], "ts", {"n": "count(*)"}))
    operator.validate(schema)
    table = pa.table({"k": ["a"], "ts": pa.array([value], arrow_type), "x": [1]}, schema=schema)
    [row] = operator.process(table, END_OF_INPUT_WATERMARK).to_pylist()
    assert row["window_start"] == dt.datetime(1970, 1, 1, 0, 0, 12, tzinfo=dt.UTC)


def test_time_column_defaults_to_the_kafka_timestamp() -> None:
    schema = pa.schema([("k", pa.string()), (DEFAULT_TIME_COLUMN, pa.timestamp("ms", tz="UTC"))])
    operator = WindowOperator(WindowSpec("tumbling", 10, None, ["k"], None, {"n": "count(*)"}))
    assert operator.validate(schema).names == ["k", "window_start", "window_end", "n"]


def test_rows_for_already_emitted_windows_are_ignored_and_counted() -> None:
    operator = tumbling()
    first = operator.process(rows(("a", 1, 1)), watermark=10)
    late = operator.process(rows(("a", 2, 1), ("a", 11, 1)), watermark=10)
    rest = operator.process(SCHEMA.empty_table(), watermark=END_OF_INPUT_WATERMARK)
    assert [(r["window_start"], r["n"]) for r in plain(first) + plain(late) + plain(rest)] == [(0, 1), (10, 1)]
    assert operator.ignored_late_assignments == 1


def test_rows_without_event_time_are_dropped_and_counted() -> None:
    operator = tumbling()
    result = operator.process(rows(("a", None, 1), ("a", 4, 1)), watermark=10)
    assert [r["n"] for r in plain(result)] == [1]
    assert operator.rows_without_event_time == 1


def test_a_watermark_moving_backwards_changes_nothing() -> None:
    operator = tumbling()
    operator.process(rows(("a", 1, 1)), watermark=10)
    assert operator.process(rows(("a", 15, 1)), watermark=3).num_rows == 0
    assert operator.state.emitted_through == 10


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


def test_snapshots_of_equal_state_are_equal_bytes() -> None:
    left, right = tumbling(aggregates=ALL_AGGREGATES), tumbling(aggregates=ALL_AGGREGATES)
    left.process(rows(("b", 1, 1), ("a", 2, 5)), watermark=None)
    left.process(rows(("a", 13, 7)), watermark=None)
    right.process(rows(("a", 13, 7), ("a", 2, 5), ("b", 1, 1)), watermark=None)
    assert left.state.snapshot() == right.state.snapshot()


def test_restored_state_snapshots_to_the_same_bytes() -> None:
    operator = tumbling(aggregates=ALL_AGGREGATES)
    operator.process(rows(("a", 1, 1), ("b", 22, None)), watermark=5)
    restored = tumbling(aggregates=ALL_AGGREGATES)
    restored.state.restore(operator.state.snapshot())
    assert restored.state.snapshot() == operator.state.snapshot()
    assert restored.state.emitted_through == 5


def test_state_snapshotted_before_any_row_restores_to_empty_state() -> None:
    operator = WindowOperator(WindowSpec("tumbling", 10, None, ["k"], "ts", {"n": "count(*)"}))
    restored = WindowOperator(operator.spec)
    restored.state.restore(operator.state.snapshot())
    assert (restored.state.partials, restored.state.emitted_through) == (None, None)


def test_restoring_state_of_an_incompatible_spec_is_a_config_error() -> None:
    operator = tumbling(size=10)
    operator.process(rows(("a", 1, 1)), watermark=None)
    other = tumbling(size=20)
    with pytest.raises(OperatorConfigError, match="checkpointed window state was written for spec"):
        other.state.restore(operator.state.snapshot())


def test_renaming_an_output_column_keeps_the_state_restorable() -> None:
    operator = tumbling(aggregates={"n": "count(*)"})
    operator.process(rows(("a", 1, 1)), watermark=None)
    renamed = tumbling(aggregates={"events": "count(*)"})
    renamed.state.restore(operator.state.snapshot())
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


