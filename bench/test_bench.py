"""Specifications of the benchmark harness itself: it must catch wrong output, not only time it.

Run: ``KAFKA_BOOTSTRAP=127.0.0.1:9092 python -m pytest bench/test_bench.py -q`` (the last test needs Kafka).
"""

from __future__ import annotations

import random
import shlex
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.contenders import Epochline, JobSpec, RawCopy
from bench.measure import read_committed_ids, run_to_completion, verify_ids
from bench.report import FAILED, OK, Result, render_table
from bench.workload import (
    INPUT_SCHEMA,
    NEGATIVE_SHARE,
    OUTPUT_SCHEMA,
    codec,
    generate_input,
    iso_millis,
    make_record,
)
from connectors.admin import create_topic


def test_a_complete_output_passes_verification() -> None:
    assert verify_ids([3, 1, 2], {1, 2, 3}).ok


def test_a_missing_record_fails_verification() -> None:
    verdict = verify_ids([1, 2], {1, 2, 3})
    assert not verdict.ok and "1 ids missing" in verdict.problem


def test_a_duplicated_record_fails_verification_even_when_the_count_is_right() -> None:
    verdict = verify_ids([1, 1, 2], {1, 2, 3})
    assert not verdict.ok and "1 duplicated" in verdict.problem


def test_an_unexpected_record_fails_verification() -> None:
    verdict = verify_ids([1, 2, 99], {1, 2, 3})
    assert not verdict.ok and "1 unexpected" in verdict.problem


def test_about_a_tenth_of_the_input_is_filtered_out() -> None:
    rng = random.Random(1)
    negative = sum(make_record(i, rng)["amount"] < 0 for i in range(20_000))
    assert abs(negative / 20_000 - NEGATIVE_SHARE) < 0.01


@pytest.mark.parametrize("format_name", ["json", "avro"])
def test_input_rows_round_trip_through_their_codec(format_name: str) -> None:
    row = make_record(42, random.Random(3))
    input_codec = codec(format_name, INPUT_SCHEMA)
    assert input_codec.decode(input_codec.encode(row))["id"] == 42


def test_output_ids_are_read_with_the_output_schema() -> None:
    output_codec = codec("avro", OUTPUT_SCHEMA)
    row = {"id": 7, "user": "u", "amount2": 2.0, "ts": 1}
    assert output_codec.decode(output_codec.encode(row))["id"] == 7


def test_the_table_shows_ratios_to_raw_eos() -> None:
    results = [Result("raw-eos", OK, "", records_per_s=100.0), Result("quix-eos", OK, "", records_per_s=25.0)]
    table = render_table(results, "t")
    records_column = next(c for c in table.columns if c.header == "records/s")
    assert list(records_column.cells) == ["100 (1.00x)", "25 (0.25x)"]


def test_a_failed_run_shows_its_reason_instead_of_numbers() -> None:
    table = render_table([Result("epochline-eos", FAILED, "note", reason="3 ids missing")], "t")
    note_column = table.columns[-1]
    assert list(note_column.cells) == ["3 ids missing"]


@dataclass(frozen=True)
class CopiesTwice:
    """A broken contender: two independent transactional copies of the same input, i.e. every record twice."""

    name: str = "copies-twice"
    transforms: bool = False
    runs_live: bool = False
    note: str = "test double"

    def unavailable_reason(self) -> str | None:
        return None

    def command(self, job: JobSpec) -> list[str]:
        first = RawCopy().command(job)
        second = RawCopy().command(JobSpec(**{**job.__dict__, "name": f"{job.name}-again"}))
        return ["sh", "-c", f"{shlex.join(first)} && {shlex.join(second)}"]


@pytest.mark.timeout(180)
def test_a_contender_that_duplicates_records_is_caught(kafka_bootstrap: str, tmp_path: Path) -> None:
    prefix = f"bench-test-{uuid.uuid4().hex[:8]}"
    input_topic, output_topic = f"{prefix}-in", f"{prefix}-out"
    for topic in (input_topic, output_topic):
        create_topic(kafka_bootstrap, topic, 4)
    workload = generate_input(kafka_bootstrap, input_topic, 2_000, "json")
    job = JobSpec(kafka_bootstrap, input_topic, output_topic, f"{prefix}-dlq", "json", prefix, tmp_path,
                  tmp_path / "in.avsc", tmp_path / "out.avsc", expected_outputs=2_000, bounded=True)

    run_to_completion(CopiesTwice(), job, timeout=120)
    decode = codec("json", INPUT_SCHEMA).decode
    seen = read_committed_ids(kafka_bootstrap, output_topic, lambda value: decode(value)["id"])
    verdict = verify_ids(seen, workload.all_ids)

    assert not verdict.ok
    assert verdict.problem.startswith("4000 records for 2000 expected: 0 ids missing, 2000 duplicated")


@pytest.mark.parametrize("delivery", ["exactly-once", "at-least-once"])
def test_the_epochline_contender_writes_a_config_epochline_accepts(delivery: str, tmp_path: Path) -> None:
    config_module = pytest.importorskip("engine.config")
    job = JobSpec("127.0.0.1:9", "in", "out", "dlq", "avro", "bench-x", tmp_path, tmp_path / "in.avsc",
                  tmp_path / "out.avsc", expected_outputs=1, bounded=True)
    command = Epochline("epochline", delivery).command(job)

    config = config_module.load_config(command[command.index("run") + 1])

    assert (config.sink.delivery, config.checkpoint.interval, config.source.start_from) == (delivery, 1000, "earliest")
    assert command[-1] == "--stop-at-end"


def test_a_profiled_epochline_run_is_wrapped_in_pyinstrument(tmp_path: Path) -> None:
    job = JobSpec("127.0.0.1:9", "in", "out", "dlq", "json", "bench-x", tmp_path, tmp_path / "in.avsc",
                  tmp_path / "out.avsc", expected_outputs=1, bounded=True, profile_to=tmp_path / "p.html")
    command = Epochline("epochline-eos", "exactly-once").command(job)
    assert command[1:8] == ["-m", "pyinstrument", "-r", "html", "-o", str(tmp_path / "p.html"), "-m"]
    assert command[8:10] == ["engine.cli", "run"]


def test_json_timestamps_use_epochlines_wire_form() -> None:
    assert iso_millis(1_764_000_000_123) == "2025-11-24T16:00:00.123Z"
