"""Specifications of bench/scale_out.py's own parts that need no broker (the runs themselves need one)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from rich.console import Console

from bench.contenders import Epochline, JobSpec
from bench.report import FAILED, OK, Result
from bench.scale_out import InstanceUsage, ScaleResult, assignment_changes, parse_args, render_table, settled_after

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

    changes, assigned, left = assignment_changes(log, started=100.0, topic=TOPIC)

    assert changes == ["+0,1 @0.5s", "-1 @3.2s", "+1 @4.0s"]
    assert assigned == [0.5, 4.0]
    assert left == 3.25


def test_the_group_settles_before_the_first_instance_leaves() -> None:
    """At the end instances leave one after the other and the last ones take over what the first hand back
    (here at 9.7 s, just after i1 left): that is the group shrinking, not settling."""
    i1 = InstanceUsage("i1", 0, 9.74, 6.1, 326.0, "i1.log", assigned_after_s=[0.6], left_after_s=9.7)
    i2 = InstanceUsage("i2", 0, 9.89, 5.1, 335.0, "i2.log", assigned_after_s=[2.7, 9.71], left_after_s=9.8)

    assert settled_after([i1, i2]) == 2.7
    assert settled_after([InstanceUsage("i1", 0, 1.0, 0.1, 1.0, "i1.log")]) is None


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


def test_each_repetition_is_compared_with_its_own_raw_copy_by_records_visible() -> None:
    one = ScaleResult(1, 1, OK, wall_seconds=10.0, records_per_s=50_000.0, visible_records_per_s=55_000.0)
    two = ScaleResult(2, 1, OK, wall_seconds=8.0, records_per_s=62_500.0, visible_records_per_s=66_000.0)
    again = ScaleResult(2, 2, OK, wall_seconds=8.0, records_per_s=62_500.0, visible_records_per_s=66_000.0)
    raw = {1: Result("raw-eos", OK, "", records_per_s=50_000.0),
           2: Result("raw-eos", FAILED, "", records_per_s=None, reason="3 ids missing")}
    console = Console(width=300, record=True)

    console.print(render_table([one, two, again], "scale-out", raw))

    rows = [line for line in console.export_text().splitlines() if "│ ok" in line]
    assert "1.10x" in rows[0] and "1.32x" in rows[1]
    assert "x" not in rows[2].split("│")[7], "a failed raw copy gives no ratio"


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
