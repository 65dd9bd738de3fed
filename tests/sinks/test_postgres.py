"""The PostgreSQL sink against a real PostgreSQL: nothing visible before ``commit``, a prepared epoch survives
its process and is resolved by ``recover`` by what Kafka committed, upserts converge, refused rows come back
to be dead-lettered, and a server or table that cannot work is one line naming what to change.

Every claim is checked with an independent psycopg connection, never through the sink itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from decimal import Decimal

import psycopg
import pyarrow as pa
import pytest

from engine.testing.postgres import throwaway_postgres
from sinks import Guarantee, SinkAssignment, SinkMisconfigured, SinkSettingsError
from sinks.postgres import PostgresSink, PostgresSinkError, parse_settings, postgres_type


@pytest.fixture
def table(postgres_dsn: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:10]}"
    yield name
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(f"DROP TABLE IF EXISTS {name}")


def make_sink(dsn: str, table: str, instance: str = "i0", **settings: object) -> PostgresSink:
    sink = PostgresSink(parse_settings({"dsn": dsn, "table": table, "create_table": True, **settings}))
    sink.open(SinkAssignment(f"conn-{table}", instance))
    return sink


def rows(ids: range, value: str = "v") -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "name": [f"{value}{i}" for i in ids],
                     "__kafka_offset": pa.array(list(ids), pa.int64())})


def table_rows(dsn: str, table: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as connection:
        return connection.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()


def prepared(dsn: str, table: str) -> list[str]:
    with psycopg.connect(dsn) as connection:
        return [row[0] for row in connection.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s ORDER BY gid", (f"%conn-{table}%",)).fetchall()]


def test_rows_become_visible_only_when_the_prepared_epoch_commits(postgres_dsn: str, table: str) -> None:
    sink = make_sink(postgres_dsn, table)
    assert sink.guarantee is Guarantee.EXACTLY_ONCE
    assert sink.write(rows(range(3))) == []
    sink.write(rows(range(3, 5)))
    sink.prepare(7)

    assert prepared(postgres_dsn, table) == [f"epochline:conn-{table}:i0:7"]
    with psycopg.connect(postgres_dsn) as connection:  # the table itself was created in the prepared epoch
        assert connection.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (None,)
    sink.commit(7)
    assert table_rows(postgres_dsn, table) == [(i, f"v{i}") for i in range(5)]
    assert prepared(postgres_dsn, table) == []
    sink.close()


def test_an_aborted_epoch_leaves_nothing_prepared_or_written(postgres_dsn: str, table: str) -> None:
    sink = make_sink(postgres_dsn, table)
    sink.write(rows(range(2)))
    sink.prepare(1)
    sink.commit(1)
    sink.write(rows(range(2, 4)))
    sink.prepare(2)
    sink.abort(2)  # the Kafka transaction of checkpoint 2 was aborted
    sink.write(rows(range(4, 6)))
    sink.abort(None)  # abandoned before any id was reserved
    sink.close()
    assert table_rows(postgres_dsn, table) == [(0, "v0"), (1, "v1")]
    assert prepared(postgres_dsn, table) == []


def test_recover_commits_what_kafka_committed_and_rolls_back_the_rest(postgres_dsn: str, table: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    first = make_sink(postgres_dsn, table)
    first.write(rows(range(3)))
    first.prepare(1)
    first.commit(1)
    first.write(rows(range(3, 6)))
    first.prepare(2)
    first.close()  # died after prepare: the prepared epoch outlives the connection
    other = make_sink(postgres_dsn, table, instance="i1")  # another instance's epochs are not this one's
    other.write(rows(range(100, 101)))
    other.prepare(2)
    other.close()
    assert len(prepared(postgres_dsn, table)) == 2

    make_sink(postgres_dsn, table).recover(2)
    assert [row[0] for row in table_rows(postgres_dsn, table)] == list(range(6))
    assert prepared(postgres_dsn, table) == [f"epochline:conn-{table}:i1:2"]
    warned = [record for record in caplog.records if "other instances" in record.getMessage()]
    assert [record.gids for record in warned] == [[f"epochline:conn-{table}:i1:2"]]  # type: ignore[attr-defined]

    make_sink(postgres_dsn, table, instance="i1").recover(1)  # Kafka committed only up to 1 for i1
    assert [row[0] for row in table_rows(postgres_dsn, table)] == list(range(6))
    assert prepared(postgres_dsn, table) == []


def test_recover_with_nothing_committed_rolls_every_prepared_epoch_back(postgres_dsn: str, table: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {table} (id bigint, name text)")
    sink = make_sink(postgres_dsn, table)
    sink.write(rows(range(3)))
    sink.prepare(1)
    sink.close()
    make_sink(postgres_dsn, table).recover(None)
    assert table_rows(postgres_dsn, table) == []
    assert prepared(postgres_dsn, table) == []


def test_upsert_converges_to_the_last_value_per_key(postgres_dsn: str, table: str) -> None:
    sink = make_sink(postgres_dsn, table, mode="upsert", key=["id"])
    sink.write(rows(range(5), "a"))
    sink.write(rows(range(3), "b"))  # the same keys again within the epoch
    sink.prepare(1)
    sink.commit(1)
    sink.write(pa.table({"id": pa.array([1, 4, 1], pa.int64()), "name": ["c1", "c4", "d1"]}))
    sink.prepare(2)
    sink.commit(2)
    sink.close()
    assert table_rows(postgres_dsn, table) == [(0, "b0"), (1, "d1"), (2, "b2"), (3, "a3"), (4, "c4")]


def test_a_row_postgresql_refuses_comes_back_and_the_others_commit(postgres_dsn: str, table: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {table} (id bigint, name text CHECK (name <> 'v3'))")
    sink = make_sink(postgres_dsn, table)
    refused = sink.write(rows(range(6)))
    sink.prepare(1)
    sink.commit(1)
    sink.close()
    assert [row.index for row in refused] == [3]
    assert "check constraint" in refused[0].reason and table in refused[0].reason
    assert [row[0] for row in table_rows(postgres_dsn, table)] == [0, 1, 2, 4, 5]


def test_a_constraint_failing_only_at_prepare_fails_the_epoch_and_leaves_nothing(postgres_dsn: str,
                                                                                table: str) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {table} (id bigint UNIQUE DEFERRABLE INITIALLY DEFERRED, name text)")
    sink = make_sink(postgres_dsn, table)
    assert sink.write(rows(range(2))) == [] and sink.write(rows(range(1, 2))) == []  # deferred: not yet refused
    with pytest.raises(PostgresSinkError, match=f"table '{table}': duplicate key") as caught:
        sink.prepare(1)
    assert "\n" not in str(caught.value)
    sink.abort(1)
    sink.close()
    assert table_rows(postgres_dsn, table) == []
    assert prepared(postgres_dsn, table) == []


def test_a_missing_table_is_one_line_naming_it(postgres_dsn: str, table: str) -> None:
    sink = PostgresSink(parse_settings({"dsn": postgres_dsn, "table": table}))
    with pytest.raises(SinkMisconfigured, match=f"table '{table}' does not exist.*create_table: true") as caught:
        sink.open(SinkAssignment("c", "i"))
    assert "\n" not in str(caught.value)


def test_a_missing_privilege_is_one_line_naming_it(postgres_dsn: str, table: str) -> None:
    role = f"r_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {table} (id bigint, name text)")
        connection.execute(f"CREATE ROLE {role} LOGIN")
        connection.execute(f"GRANT SELECT ON {table} TO {role}")
    dsn = postgres_dsn.replace("postgres@", f"{role}@")
    sink = PostgresSink(parse_settings({"dsn": dsn, "table": table}))
    with pytest.raises(SinkMisconfigured, match=f"lacks the INSERT privilege.*GRANT INSERT ON {table}"):
        sink.open(SinkAssignment("c", "i"))


def test_a_server_without_prepared_transactions_is_one_line_naming_the_setting() -> None:
    with throwaway_postgres(max_prepared_transactions=0) as server:
        sink = PostgresSink(parse_settings({"dsn": server.dsn, "table": "t", "create_table": True}))
        with pytest.raises(SinkMisconfigured, match="max_prepared_transactions = 0") as caught:
            sink.open(SinkAssignment("c", "i"))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("settings", "problem"), [
    ({"table": "t"}, "dsn"),
    ({"dsn": "postgresql://h/db"}, "table"),
    ({"dsn": "postgresql://h/db", "table": "t", "mode": "merge"}, "mode"),
    ({"dsn": "postgresql://h/db", "table": "t", "mode": "upsert"}, "key"),
    ({"dsn": "postgresql://h/db", "table": "t", "tabel": "x"}, "tabel"),
])
def test_settings_name_the_setting_that_is_wrong(settings: dict[str, object], problem: str) -> None:
    with pytest.raises(SinkSettingsError, match=problem):
        parse_settings(settings)


def test_created_tables_follow_the_type_map(postgres_dsn: str, table: str) -> None:
    batch = pa.table({
        "id": pa.array([1], pa.int32()), "small": pa.array([1], pa.int16()), "big": pa.array([1], pa.int64()),
        "ratio": pa.array([0.5], pa.float64()), "flag": [True], "label": ["x"], "blob": [b"\x00"],
        "at": pa.array([0], pa.timestamp("ms", tz="UTC")), "price": pa.array([Decimal("1.50")], pa.decimal128(9, 2)),
    })
    sink = make_sink(postgres_dsn, table)
    sink.write(batch)
    sink.prepare(1)
    sink.commit(1)
    sink.close()
    with psycopg.connect(postgres_dsn) as connection:
        types = dict(connection.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s", (table,)))
    assert types == {"id": "integer", "small": "smallint", "big": "bigint", "ratio": "double precision",
                     "flag": "boolean", "label": "text", "blob": "bytea", "at": "timestamp with time zone",
                     "price": "numeric"}
    with pytest.raises(SinkMisconfigured, match="no PostgreSQL type for Arrow type list"):
        postgres_type(pa.list_(pa.int64()))
