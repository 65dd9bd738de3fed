"""The sink conformance kit: ``check_sink`` SIGKILLs ``epochline run`` at each moment of the two-phase commit on
the real broker and accounts for every input id in what the sink published.

It passes the PostgreSQL sink and the example JSON-lines sink, and fails a sink that publishes in ``write``,
naming the duplicated ids: a kit that passed everything would prove nothing.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import psycopg
import pytest

from engine.testing import CRASH_POINTS, ConformanceReport, CrashFinding, check_sink


def jsonl_ids(directory: Path) -> list[int]:
    """The ids of every row in the published files of a JSON-lines sink writing to ``directory``."""
    return [orjson.loads(line)["id"] for path in sorted((directory / "published").glob("*.jsonl"))
            for line in path.read_bytes().splitlines()]


def test_the_postgres_sink_is_exactly_once_at_every_crash_point(kafka_bootstrap: str, postgres_dsn: str,
                                                               tmp_path: Path) -> None:
    table = f"t_{uuid.uuid4().hex}"
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {table} (id bigint, name text)")

    def published() -> list[int]:
        with psycopg.connect(postgres_dsn) as connection:
            return [row[0] for row in connection.execute(f"SELECT id FROM {table}")]

    report = check_sink({"type": "postgres", "dsn": postgres_dsn, "table": table}, published,
                        bootstrap=kafka_bootstrap, workdir=tmp_path)
    assert report.exactly_once, report
    assert [finding.crash_point for finding in report.findings] == list(CRASH_POINTS)


def test_the_example_jsonl_sink_is_exactly_once_at_every_crash_point(kafka_bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report = check_sink({"type": "examples.jsonl_sink:PLUGIN", "directory": str(out)}, lambda: jsonl_ids(out),
                        bootstrap=kafka_bootstrap, workdir=tmp_path)
    assert report.exactly_once, report
    assert list((out / "prepared").iterdir()) == [], "a prepared epoch was left behind"


def test_a_sink_publishing_in_write_is_caught_with_its_duplicated_ids(kafka_bootstrap: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report = check_sink({"type": "tests.helpers.publishing_sink:PLUGIN", "directory": str(out)},
                        lambda: jsonl_ids(out), bootstrap=kafka_bootstrap, workdir=tmp_path,
                        crash_points=("before-prepare",))
    assert not report.exactly_once
    [finding] = report.findings
    assert finding.crashed and finding.duplicated and not finding.missing, finding
    assert set(finding.duplicated) <= set(range(500))
    assert "NOT exactly once" in str(report) and "ids duplicated" in str(report)


@pytest.mark.slow
def test_the_example_jsonl_sink_survives_random_kills_while_input_streams_in(kafka_bootstrap: str,
                                                                               tmp_path: Path) -> None:
    out = tmp_path / "out"
    report = check_sink({"type": "examples.jsonl_sink:PLUGIN", "directory": str(out)}, lambda: jsonl_ids(out),
                        bootstrap=kafka_bootstrap, workdir=tmp_path, crash_points=(), streaming_seconds=15.0)
    assert report.exactly_once, report


def test_a_scenario_whose_crash_never_happened_proves_nothing() -> None:
    report = ConformanceReport("x", (CrashFinding("before-prepare", crashed=True),
                                     CrashFinding("after-prepare", crashed=False)))
    assert not report.exactly_once
    assert "after-prepare: the injected crash never happened" in str(report)
