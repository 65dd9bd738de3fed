"""The process's one in-memory DuckDB database, and a connection to it for each user.

Opening an in-memory database costs 30-60 ms (DuckDB 2.0, measured on the 2-core bench machine), a connection
to an open one (``cursor``) about 0.03 ms. So every DuckDB user in the engine (each SQL step, the repartition
hash of every cycle) takes a connection here instead of a database of its own. A name registered on one
connection (``register``: a cycle's Arrow table) is seen by that connection only, so steps never see each
other's tables. Connections may be used from different threads, each by one thread at a time.

The database opens on a thread of its own, started by the first ``open_database_soon`` (a step that will
need it calls it when it is made) or the first connection: DuckDB releases the GIL while it opens (a Python
loop beside it kept 77% of its speed), so the opening overlaps a connector's first calls to Kafka (the
fence, describing the topic) instead of coming before or after them.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from functools import cache

import duckdb

_FIRST_CALL = threading.Lock()


def open_database_soon() -> None:
    """Start opening the process's database in the background, unless that has started already."""
    _opening()


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    """A new connection to the process's database (waiting for it to be open); the database's error, if
    DuckDB could not open it."""
    return _opening().result().cursor()


def _opening() -> Future[duckdb.DuckDBPyConnection]:
    with _FIRST_CALL:  # two first callers on two threads must not open two databases
        return _open_in_background()


@cache
def _open_in_background() -> Future[duckdb.DuckDBPyConnection]:
    database: Future[duckdb.DuckDBPyConnection] = Future()

    def open_database() -> None:
        try:
            database.set_result(duckdb.connect())
        except BaseException as error:  # noqa: BLE001 - handed to whoever asks for a connection
            database.set_exception(error)

    threading.Thread(target=open_database, name="duckdb-open").start()
    return database
