"""SQL and Python operators and the chain that runs them: the contract the engine's cycle relies on."""

from __future__ import annotations

import textwrap
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from engine.transforms import (
    OperatorConfigError,
    OperatorRuntimeError,
    PythonOperator,
    SqlOperator,
    build_chain,
)
from engine.transforms.database import duckdb_connection
from engine.transforms.windows import END_OF_INPUT_WATERMARK, WindowOperator, WindowSpec
from tests.helpers import REPO_ROOT

ORDERS_SCHEMA = pa.schema([("customer", pa.string()), ("amount_cents", pa.int64()), ("ts", pa.int64()),
                           ("__kafka_partition", pa.int32())])


def orders(rows: list[tuple[str | None, int, int]]) -> pa.Table:
    customers, amounts, times = zip(*rows) if rows else ((), (), ())
    return pa.table({"customer": list(customers), "amount_cents": list(amounts), "ts": list(times),
                     "__kafka_partition": [0] * len(rows)}, schema=ORDERS_SCHEMA)


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write a module of user functions under a unique name and make it importable."""
    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        monkeypatch.syspath_prepend(str(tmp_path))
        return name
    return write


# -- SQL -----------------------------------------------------------------------------------------------


def test_sql_filters_projects_and_computes() -> None:
    operator = SqlOperator(
        "SELECT upper(customer) AS customer, amount_cents / 100.0 AS amount FROM input WHERE amount_cents > 500"
    )
    operator.validate(ORDERS_SCHEMA)
    result = operator.process(orders([("ann", 1000, 1), ("bob", 200, 2), ("cy", 750, 3)]), watermark=None)
    assert result.column_names == ["customer", "amount"]
    assert result.to_pylist() == [{"customer": "ANN", "amount": 10.0}, {"customer": "CY", "amount": 7.5}]


def test_sql_reads_each_cycles_rows_not_the_previous_ones() -> None:
    operator = SqlOperator("SELECT sum(amount_cents) AS total FROM input")
    operator.validate(ORDERS_SCHEMA)
    first = operator.process(orders([("ann", 1, 1), ("bob", 2, 2)]), watermark=None)
    second = operator.process(orders([("cy", 40, 3)]), watermark=None)
    assert (first["total"].to_pylist(), second["total"].to_pylist()) == ([3], [40])


def test_sql_steps_share_one_database_but_each_sees_only_its_own_input() -> None:
    """One in-memory DuckDB database per process (opening one costs tens of milliseconds), a connection per
    step: ``input`` is registered per connection, so two steps' cycles never read each other's rows."""
    totals = SqlOperator("SELECT sum(amount_cents) AS total FROM input", name="totals")
    names = SqlOperator("SELECT string_agg(customer, ',') AS names FROM input", name="names")
    totals.validate(ORDERS_SCHEMA)
    names.validate(ORDERS_SCHEMA)
    first = totals.process(orders([("ann", 1, 1), ("bob", 2, 2)]), watermark=None)
    second = names.process(orders([("cy", 40, 3)]), watermark=None)
    third = totals.process(orders([("dee", 7, 4)]), watermark=None)
    assert (first["total"].to_pylist(), second["names"].to_pylist(), third["total"].to_pylist()) == ([3], ["cy"], [7])
    one, other = duckdb_connection(), duckdb_connection()
    one.execute("CREATE TEMP TABLE seen_by_one AS SELECT 1 AS x")
    one.execute("CREATE TABLE shared_by_both AS SELECT 2 AS x")
    assert other.sql("SELECT x FROM shared_by_both").fetchall() == [(2,)]
    with pytest.raises(duckdb.CatalogException):
        other.sql("SELECT x FROM seen_by_one")
    one.execute("DROP TABLE shared_by_both")


def test_sql_validate_returns_the_schema_process_emits() -> None:
    operator = SqlOperator("SELECT customer, amount_cents * 2 AS doubled FROM input")
    schema = operator.validate(ORDERS_SCHEMA)
    result = operator.process(orders([("ann", 3, 1)]), watermark=None)
    assert result.schema.equals(schema)


def test_sql_empty_input_gives_empty_output_with_the_query_schema() -> None:
    operator = SqlOperator("SELECT customer, amount_cents + 1 AS next FROM input")
    schema = operator.validate(ORDERS_SCHEMA)
    result = operator.process(ORDERS_SCHEMA.empty_table(), watermark=None)
    assert result.num_rows == 0
    assert result.schema.equals(schema)
    assert schema.names == ["customer", "next"]


def test_sql_syntax_error_is_a_config_error_naming_operator_and_query() -> None:
    operator = SqlOperator("SELEC customer FROM input", name="clean")
    with pytest.raises(OperatorConfigError, match=r"'clean'.*SELEC customer FROM input.*syntax error"):
        operator.validate(ORDERS_SCHEMA)


def test_sql_unknown_column_is_a_config_error_with_duckdbs_message() -> None:
    operator = SqlOperator("SELECT nope FROM input", name="clean")
    with pytest.raises(OperatorConfigError, match=r"'clean'.*\"nope\" not found"):
        operator.validate(ORDERS_SCHEMA)


def test_sql_statement_that_is_not_a_single_select_is_a_config_error() -> None:
    operator = SqlOperator("CREATE TABLE t AS SELECT * FROM input", name="writer")
    with pytest.raises(OperatorConfigError, match=r"'writer'.*exactly one SELECT.*CREATE"):
        operator.validate(ORDERS_SCHEMA)


def test_sql_failure_during_a_cycle_is_a_runtime_error_naming_the_operator() -> None:
    operator = SqlOperator("SELECT CAST(customer AS INTEGER) AS n FROM input", name="caster")
    operator.validate(ORDERS_SCHEMA)
    with pytest.raises(OperatorRuntimeError, match=r"'caster'.*Conversion Error"):
        operator.process(orders([("not a number", 1, 1)]), watermark=None)


# -- Python --------------------------------------------------------------------------------------------


def test_python_operator_runs_module_function_on_a_record_batch(user_module) -> None:
    module = user_module("double_mod", """
        import pyarrow as pa, pyarrow.compute as pc
        def double(batch):
            assert isinstance(batch, pa.RecordBatch)
            return pa.record_batch({"doubled": pc.multiply(batch.column("amount_cents"), 2)})
    """)
    operator = PythonOperator(f"{module}:double")
    operator.validate(ORDERS_SCHEMA)
    result = operator.process(orders([("ann", 3, 1), ("bob", 4, 2)]), watermark=None)
    assert result.to_pylist() == [{"doubled": 6}, {"doubled": 8}]


def test_python_operator_accepts_a_table_result_and_multi_chunk_input(user_module) -> None:
    module = user_module("table_mod", """
        import pyarrow as pa
        def rows(batch):
            return pa.Table.from_batches([batch]).select(["customer"])
    """)
    operator = PythonOperator(f"{module}:rows")
    operator.validate(ORDERS_SCHEMA)
    two_chunks = pa.concat_tables([orders([("ann", 1, 1)]), orders([("bob", 2, 2)])])
    assert operator.process(two_chunks, watermark=None).to_pylist() == [{"customer": "ann"}, {"customer": "bob"}]


def test_python_operator_runs_the_example_transform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    operator = PythonOperator("examples.transforms:tag_large_orders", name="tag")
    schema = operator.validate(ORDERS_SCHEMA)
    result = operator.process(orders([("ann", 250_00, 1), (None, 5, 2), ("bob", 99, 3)]), watermark=None)
    assert schema.names == ["customer", "amount_cents", "ts", "__kafka_partition", "amount", "large"]
    assert [(r["customer"], r["amount"], r["large"]) for r in result.to_pylist()] == [
        ("ann", 250.0, True), ("bob", 0.99, False)]


@pytest.mark.parametrize("target, problem", [
    ("no_colon_here", "must look like 'package.module:function'"),
    ("epochline_no_such_module:f", "cannot import module 'epochline_no_such_module'"),
    ("json:no_such_function", "has no attribute 'no_such_function'"),
    ("math:pi", "is a float, not a callable"),
])
def test_python_operator_bad_function_path_is_a_config_error(target: str, problem: str) -> None:
    with pytest.raises(OperatorConfigError, match=rf"'enrich'.*{problem}"):
        PythonOperator(target, name="enrich")


def test_python_function_raising_is_a_runtime_error_naming_the_operator(user_module) -> None:
    module = user_module("boom_mod", """
        def explode(batch):
            if batch.num_rows:
                raise ValueError("bad row")
            return batch
    """)
    operator = PythonOperator(f"{module}:explode", name="enrich")
    operator.validate(ORDERS_SCHEMA)
    with pytest.raises(OperatorRuntimeError, match=r"'enrich'.*ValueError: bad row"):
        operator.process(orders([("ann", 1, 1)]), watermark=None)


def test_python_function_failing_on_the_empty_probe_is_a_config_error(user_module) -> None:
    module = user_module("probe_mod", """
        def first_row(batch):
            return batch.slice(0, 1).column(99)
    """)
    with pytest.raises(OperatorConfigError, match=r"'probe'.*fails on an empty batch"):
        PythonOperator(f"{module}:first_row", name="probe").validate(ORDERS_SCHEMA)


def test_python_function_changing_its_output_schema_is_a_runtime_error(user_module) -> None:
    module = user_module("drift_mod", """
        import pyarrow as pa
        def drift(batch):
            if batch.num_rows:
                return pa.record_batch({"other": [1]})
            return batch
    """)
    operator = PythonOperator(f"{module}:drift", name="drift")
    operator.validate(ORDERS_SCHEMA)
    with pytest.raises(OperatorRuntimeError, match=r"'drift'.*returned schema"):
        operator.process(orders([("ann", 1, 1)]), watermark=None)


def test_python_function_returning_a_non_arrow_value_is_rejected_at_start(user_module) -> None:
    module = user_module("none_mod", """
        def nothing(batch):
            return None
    """)
    with pytest.raises(OperatorConfigError, match=r"'n'.*returned NoneType"):
        PythonOperator(f"{module}:nothing", name="n").validate(ORDERS_SCHEMA)


# -- chain ---------------------------------------------------------------------------------------------


def test_chain_runs_steps_in_order_and_chains_schemas() -> None:
    chain = build_chain([
        SqlOperator("SELECT customer, amount_cents * 10 AS x FROM input", name="scale"),
        SqlOperator("SELECT customer FROM input WHERE x > 100", name="big"),
    ])
    assert chain.validate(ORDERS_SCHEMA).names == ["customer"]
    result = chain.process(orders([("ann", 5, 1), ("bob", 50, 2)]), watermark=None)
    assert result.to_pylist() == [{"customer": "bob"}]
    assert set(chain.last_cycle_ns) == {"scale", "big"}


def test_chain_exposes_the_states_of_stateful_steps_by_name() -> None:
    window = WindowOperator(
        WindowSpec("tumbling", 10, None, ["customer"], "ts", {"n": "count(*)"}), name="per_customer")
    chain = build_chain([SqlOperator("SELECT * FROM input"), window])
    assert chain.states == {"per_customer": window.state}


def test_chain_feeds_the_watermark_to_windows_and_flushes_at_end_of_input() -> None:
    chain = build_chain([
        SqlOperator("SELECT * FROM input WHERE customer IS NOT NULL"),
        WindowOperator(WindowSpec("tumbling", 10, None, ["customer"], "ts", {"total": "sum(amount_cents)"})),
    ])
    chain.validate(ORDERS_SCHEMA)
    assert chain.process(orders([("ann", 1, 1), ("ann", 2, 12)]), watermark=5).num_rows == 0
    closed = chain.process(orders([(None, 7, 3)]), watermark=10)
    rest = chain.process(ORDERS_SCHEMA.empty_table(), watermark=END_OF_INPUT_WATERMARK)
    assert [(r["customer"], r["total"]) for r in closed.to_pylist() + rest.to_pylist()] == [("ann", 1), ("ann", 2)]


def test_chain_rejects_duplicate_operator_names() -> None:
    with pytest.raises(OperatorConfigError, match="'sql' is used twice"):
        build_chain([SqlOperator("SELECT * FROM input"), SqlOperator("SELECT * FROM input")])


def test_chain_wraps_an_unexpected_exception_in_a_runtime_error_naming_the_step() -> None:
    class Broken:
        name = "broken"
        state = None

        def validate(self, input_schema: pa.Schema) -> pa.Schema:
            return input_schema

        def process(self, table: pa.Table, watermark: int | None) -> pa.Table:
            raise KeyError("gone")

    with pytest.raises(OperatorRuntimeError, match=r"'broken' failed: KeyError"):
        build_chain([Broken()]).process(ORDERS_SCHEMA.empty_table(), watermark=None)


def test_chain_empty_input_has_the_validated_input_schema() -> None:
    chain = build_chain([SqlOperator("SELECT customer FROM input")])
    chain.validate(ORDERS_SCHEMA)
    empty = chain.empty_input()
    assert (empty.num_rows, empty.schema) == (0, ORDERS_SCHEMA)
    assert chain.process(empty, watermark=7).schema.names == ["customer"]


def test_chain_passes_a_columnless_cycle_through_before_any_schema_is_known() -> None:
    chain = build_chain([SqlOperator("SELECT customer FROM input")])
    assert chain.empty_input().num_columns == 0
    assert chain.process(chain.empty_input(), watermark=7).num_columns == 0
    assert chain.process(orders([("ann", 1, 1)]), watermark=8).to_pylist() == [{"customer": "ann"}]
    assert chain.empty_input().schema == ORDERS_SCHEMA


def test_python_operator_passes_a_columnless_cycle_through_before_any_schema_is_known(user_module) -> None:
    module = user_module("strict_mod", """
        def needs_customer(batch):
            return batch.select(["customer"])
    """)
    operator = PythonOperator(f"{module}:needs_customer")
    assert operator.process(pa.table({}), watermark=3).num_columns == 0
