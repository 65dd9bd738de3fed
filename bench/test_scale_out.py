"""Specifications of bench/scale_out.py's own parts that need no broker (the runs themselves need one)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from rich.console import Console

from bench.contenders import Epochline, JobSpec
from bench.report import FAILED, OK
from bench.scale_out import InstanceUsage, ScaleResult, assignment_changes, parse_args, render_table

TOPIC = "bench-in"


def log_line(ts: float, event: str, **fields: object) -> str:
    return orjson.dumps({"ts": ts, "level": "info", "event": event, **fields}).decode()


def test_an_instances_assignments_are_read_from_its_json_log(tmp_path: Path) -> None:
    log = tmp_path / "i1.log"
    log.write_text("\n".join([
        "not json: a librdkafka line before logging was configured",
        log_line(100.5, "partitions assigned", source="source", offsets={"0": 0, "1": 0}),  # pipeline's line
        log_line(100.5, "partitions assigned", source="source", topic=TOPIC, offsets={"1": 0, "0": 0}),
        log_line(101.0, "partitions assigned", source="source", topic="another-topic", offsets={"0": 0}),
        log_line(103.25, "partitions revoked", source="source", topic=TOPIC, partitions=[1]),
        log_line(104.0, "partitions assigned", source="source", topic=TOPIC, offsets={"1": 7}),
    ]))

    changes, last_assigned = assignment_changes(log, started=100.0, topic=TOPIC)

    assert changes == ["+0,1 @0.5s", "-1 @3.2s", "+1 @4.0s"]
    assert last_assigned == 4.0


def test_a_failed_run_shows_its_reason_and_a_scaled_run_its_ratio_to_one_instance() -> None:
    one = ScaleResult(1, 1, OK, wall_seconds=10.0, records_per_s=50_000.0,
                      per_instance=[InstanceUsage("i1", 0, 10.0, 4.0, 250.0, "i1.log")])
    two = ScaleResult(2, 1, OK, wall_seconds=8.0, records_per_s=62_500.0)
    three = ScaleResult(3, 1, FAILED, reason="12 ids missing")
    console = Console(width=300, record=True)

    console.print(render_table([one, two, three], "scale-out"))

    text = console.export_text()
    assert "62,500 (1.25x)" in text
    assert "12 ids missing" in text


def test_consumer_settings_reach_the_source_section_of_the_config(tmp_path: Path) -> None:
    args = parse_args(["--consumer", "heartbeat.interval.ms=500"])
    job = JobSpec("127.0.0.1:9092", "in", "out", "dlq", "json", "name", tmp_path, tmp_path / "in.avsc",
                  tmp_path / "out.avsc", 10, bounded=True, consumer=dict(args.consumer))
    contender = Epochline("epochline-eos", "exactly-once")

    assert contender.config(job)["source"]["consumer"] == {"heartbeat.interval.ms": "500"}
    assert "consumer" not in contender.config(replace(job, consumer={}))["source"]


def test_more_instances_than_input_partitions_are_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--instances", "1", "7"])


def test_the_arguments_answer_everything_the_shared_bench_job_asks() -> None:
    """scale_out reuses run.py's ``Bench.job``, which reads ``profile``, ``producer`` and ``consumer`` from the
    arguments."""
    args = parse_args([])
    assert (args.profile, args.producer, args.consumer) == (False, [], [])
