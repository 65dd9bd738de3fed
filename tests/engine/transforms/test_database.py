"""The process's one DuckDB database: opened once, on a thread of its own, as soon as a step will need it.

Each check runs in a fresh interpreter, since the database belongs to the process."""

from __future__ import annotations

from tests.helpers.processes import WATCH_CONNECT, run_python


def test_making_a_sql_step_opens_the_database_on_another_thread_before_its_first_use() -> None:
    out = run_python(WATCH_CONNECT + """
from engine.transforms.sql import SqlOperator
import pyarrow as pa
step = SqlOperator("SELECT x * 2 AS y FROM input")
deadline = time.monotonic() + 10
while not opened_on and time.monotonic() < deadline:
    time.sleep(0.005)
print(opened_on)
other = SqlOperator("SELECT x + 1 AS y FROM input")
rows = pa.table({"x": [1, 2]})
print(step.process(rows, None)["y"].to_pylist(), other.process(rows, None)["y"].to_pylist(), opened_on)
""")
    assert out.splitlines() == ["['duckdb-open']", "[2, 4] [2, 3] ['duckdb-open']"]


def test_a_database_that_cannot_open_fails_every_step_that_asks_for_a_connection() -> None:
    out = run_python("""
import duckdb
def connect(*args, **kwargs):
    raise duckdb.IOException("no memory for a database")
duckdb.connect = connect
from engine.transforms.database import duckdb_connection, open_database_soon
open_database_soon()
for _ in range(2):
    try:
        duckdb_connection()
    except duckdb.IOException as error:
        print(error)
""")
    assert out.splitlines() == ["no memory for a database"] * 2
