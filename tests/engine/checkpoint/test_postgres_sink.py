"""Kafka into a PostgreSQL table exactly once, proven by real ``epochline run`` processes on the real broker
and a real PostgreSQL, SIGKILLed at each moment of the two-phase commit.

Each test accounts for every input id: the rows an independent psycopg query finds in the table plus the
dead letters (read ``read_committed``) equal the input, once each, and ``pg_prepared_xacts`` holds nothing
of the connector at the end.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from pathlib import Path

import orjson
import psycopg
import pytest

from connectors.admin import create_topic
from engine.config import load_config
from engine.testing.accounting import assert_dead_letters, count_problems
from engine.testing.connectors import (
    Connector,
    LiveInput,
    committing_or_ended,
    produce_values,
    start_connector,
    write_config,
)
from engine.testing.postgres import throwaway_postgres
from engine.validation import validate_online

RECORDS = 3_000
PARTITIONS = 3
REFUSED_ID = 1_234
"""The input row the table's CHECK constraint refuses: dead-lettered with PostgreSQL's reason."""
DSN_VARIABLE = "EPOCHLINE_TEST_SINK_DSN"


def order(i: int) -> bytes:
    return orjson.dumps({"id": i, "name": "refused" if i == REFUSED_ID else f"n{i}"})


SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
          "required": ["id", "name"]}


@pytest.fixture
def pipeline(kafka_bootstrap: str, unique_topic: str, postgres_dsn: str, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """The input topic (all records written), the dead-letter topic, the table (with a CHECK constraint) and a
    connector config whose DSN is a ``${env:...}`` reference."""
    source, dlq, table = f"{unique_topic}-in", f"{unique_topic}-dlq", f"t_{uuid.uuid4().hex}"
    create_topic(kafka_bootstrap, source, PARTITIONS)
    create_topic(kafka_bootstrap, dlq, 1)
    produce_values(kafka_bootstrap, source, [order(i) for i in range(RECORDS)], PARTITIONS)
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {table} (id bigint, name text CHECK (name <> 'refused'))")
    monkeypatch.setenv(DSN_VARIABLE, postgres_dsn)  # the connector process inherits it
    schema = tmp_path / "order.schema.json"
    schema.write_bytes(orjson.dumps(SCHEMA))
    name = f"pg-{unique_topic}"
    config = write_config(tmp_path, {
        "name": name,
        "source": {"topic": source, "format": "json", "schema": str(schema), "max_batch_records": 500},
        "transform": [{"sql": "SELECT id, name, __kafka_partition, __kafka_offset FROM input"}],
        "sink": {"type": "postgres", "dsn": f"${{env:{DSN_VARIABLE}}}", "table": table},
        "dead_letter": {"topic": dlq},
        "checkpoint": {"interval": "300ms", "dir": str(tmp_path / "state")},
    })
    return {"config": config, "table": table, "dlq": dlq, "name": name, "source": source}


def table_ids(dsn: str, table: str) -> Counter[int]:
    with psycopg.connect(dsn) as connection:
        return Counter(row[0] for row in connection.execute(f"SELECT id FROM {table}"))


def prepared_of(dsn: str, connector: str) -> list[str]:
    with psycopg.connect(dsn) as connection:
        return [row[0] for row in connection.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)", (f"epochline:{connector}:",))]


def finish(config: Path, bootstrap: str) -> Connector:
    final = start_connector(config, bootstrap, stop_at_end=True, log_name="final")
    assert final.wait(120) == 0, final.log_tail()
    return final


def assert_every_input_once(bootstrap: str, dsn: str, pipeline: dict[str, object], records: int = RECORDS) -> None:
    letters = assert_dead_letters(bootstrap, str(pipeline["dlq"]), {REFUSED_ID: "violates check constraint"},
                                  stage="sink")
    dead_lettered = Counter(i for letter in letters for i in letter.ids)
    in_table = table_ids(dsn, str(pipeline["table"]))
    problems = count_problems(in_table + dead_lettered, Counter(range(records)), "table rows + dead letters")
    assert not problems, "\n".join(problems)
    assert REFUSED_ID not in in_table
    assert prepared_of(dsn, str(pipeline["name"])) == [], "a prepared epoch was left behind"


def test_records_reach_the_table_exactly_once_with_the_refused_row_dead_lettered(
        kafka_bootstrap: str, postgres_dsn: str, pipeline: dict[str, object]) -> None:
    finish(pipeline["config"], kafka_bootstrap)  # type: ignore[arg-type]
    assert_every_input_once(kafka_bootstrap, postgres_dsn, pipeline)


@pytest.mark.parametrize(("moment", "left_prepared"), [
    ("before-prepare", False),   # rows written in the open transaction: they die with the connection
    ("after-prepare", True),     # prepared, Kafka did not commit: recovery rolls it back
    ("before-finish", True),     # Kafka committed, COMMIT PREPARED never ran: recovery commits it
])
def test_a_kill_at_each_moment_of_the_two_phase_commit_loses_and_duplicates_nothing(
        kafka_bootstrap: str, postgres_dsn: str, pipeline: dict[str, object], moment: str,
        left_prepared: bool) -> None:
    config: Path = pipeline["config"]  # type: ignore[assignment]
    crashed = start_connector(config, kafka_bootstrap, faults=f"{moment}:1.0", log_name=moment)
    assert crashed.wait_for_exit(60), f"no crash at {moment}:\n{crashed.log_tail()}"
    assert crashed.crashed_by_fault(), crashed.log_tail()
    prepared = prepared_of(postgres_dsn, str(pipeline["name"]))
    assert len(prepared) == (1 if left_prepared else 0), prepared
    assert table_ids(postgres_dsn, str(pipeline["table"])) == Counter(), "rows were published before the finish"

    finish(config, kafka_bootstrap)
    assert_every_input_once(kafka_bootstrap, postgres_dsn, pipeline)


def test_random_kills_while_the_input_streams_in_lose_and_duplicate_nothing(
        kafka_bootstrap: str, postgres_dsn: str, pipeline: dict[str, object]) -> None:
    """Runs killed by injected faults at the three moments or by a SIGKILL at a random time, one after the
    other for as long as more input streams in; the last run finishes the input."""
    config: Path = pipeline["config"]  # type: ignore[assignment]
    more = LiveInput(kafka_bootstrap, str(pipeline["source"]), [order(i) for i in range(RECORDS, 2 * RECORDS)],
                     PARTITIONS, seconds=20.0)
    rng = random.Random(5)
    runs = faulted = 0
    while more.streaming:
        run = start_connector(config, kafka_bootstrap, log_name=f"run{runs}",
                              faults="before-prepare:0.3,after-prepare:0.3,before-finish:0.3")
        committing_or_ended(run, more)
        if not run.wait_for_exit(rng.uniform(1.0, 4.0)):
            run.kill()
        runs, faulted = runs + 1, faulted + run.crashed_by_fault()
    more.join()
    finish(config, kafka_bootstrap)
    assert_every_input_once(kafka_bootstrap, postgres_dsn, pipeline, records=2 * RECORDS)
    assert faulted >= 1, f"none of {runs} runs died at a moment of the two-phase commit"


def test_a_server_without_prepared_transactions_stops_the_run_with_one_line_naming_the_setting(
        kafka_bootstrap: str, pipeline: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    with throwaway_postgres(max_prepared_transactions=0) as server:
        monkeypatch.setenv(DSN_VARIABLE, server.dsn)
        run = start_connector(pipeline["config"], kafka_bootstrap, stop_at_end=True)  # type: ignore[arg-type]
        assert run.wait(60) != 0
    errors = [line for line in run.log_tail().splitlines() if line.startswith("epochline: ")]
    assert len(errors) == 1 and "max_prepared_transactions = 0" in errors[0], run.log_tail()
    assert "Traceback" not in run.log_path.read_text()


def test_validate_online_names_a_missing_table_and_writes_nothing(kafka_bootstrap: str, postgres_dsn: str,
                                                                  pipeline: dict[str, object]) -> None:
    config = load_config(pipeline["config"])  # type: ignore[arg-type]
    assert validate_online(config, kafka_bootstrap) == []
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(f"DROP TABLE {pipeline['table']}")
    assert validate_online(config, kafka_bootstrap) == [
        f"sink: PostgreSQL table {pipeline['table']!r} does not exist: create it, or set create_table: true"]
    assert prepared_of(postgres_dsn, str(pipeline["name"])) == []
