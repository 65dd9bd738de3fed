"""Specifications of bench/startup.py: where a start's phases are read from, and one live start."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from bench.run import Bench
from bench.startup import (
    PHASES,
    WARM,
    Start,
    alternating,
    code_environment,
    parse_args,
    phase_times,
    summary,
    time_one_start,
)


def test_each_phase_is_the_first_line_of_its_event_in_seconds_from_the_start(tmp_path: Path) -> None:
    log = tmp_path / "contender.log"
    lines = [
        "a line that is not JSON",
        orjson.dumps({"ts": 100.9, "event": "transactional producer ready"}).decode(),
        orjson.dumps({"ts": 101.0, "event": "partitions assigned", "source": "source"}).decode(),
        orjson.dumps({"ts": 101.01, "event": "partitions assigned", "topic": "in"}).decode(),
        orjson.dumps({"ts": 101.2, "event": "checkpoint committed", "checkpoint_id": 1}).decode(),
        orjson.dumps({"ts": 102.2, "event": "checkpoint committed", "checkpoint_id": 2}).decode(),
    ]
    log.write_text("\n".join(lines))

    assert phase_times(log, started_at=100.0) == {"fenced": 0.9, "assigned": 1.0, "first commit": 1.2}


def test_the_summary_is_each_columns_median_over_the_starts_that_logged_it() -> None:
    starts = [Start("this", 1.0, 0.7, {"fenced": 0.8}), Start("this", 1.2, 0.8, {}),
              Start("this", 0.9, 0.9, {"fenced": 0.6})]
    assert summary(starts) == {"first output": 1.0, "imports": 0.8, "fenced": 0.7}


def test_the_summary_says_how_long_each_start_took_after_its_first_log_line() -> None:
    """Each start's first output less its own ``started``, then the median: not the difference of medians."""
    starts = [Start("this", 1.0, 0.7, {"started": 0.9}), Start("this", 1.5, 0.8, {"started": 1.2}),
              Start("this", 0.8, 0.9, {"started": 0.6}), Start("this", 2.0, 0.9, {})]
    assert summary(starts)["from started"] == pytest.approx(0.2)


def test_a_baseline_checkout_goes_first_on_the_module_path_and_this_one_runs_as_installed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert code_environment(tmp_path)["PYTHONPATH"] == f"{tmp_path}:/elsewhere"
    assert code_environment(None) == dict(os.environ)


def test_starts_alternate_the_order_of_the_two_codes_every_round() -> None:
    this, baseline = {"PYTHONPATH": ""}, {"PYTHONPATH": "/old"}
    order = [code for code, _ in alternating({"this": this, "baseline": baseline}, 3)]
    assert order == ["this", "baseline", "baseline", "this", "this", "baseline"]
    assert [code for code, _ in alternating({"this": this}, 2)] == ["this", "this"]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("code", ["this", WARM])
def test_a_live_start_times_its_first_output_after_every_phase_it_logged(kafka_bootstrap: str, tmp_path: Path,
                                                                         code: str) -> None:
    """Cold, or handed to a warm task process (what a worker starts its tasks in): timed from the hand-off,
    whose first log line then comes before an idle interpreter has even imported a task's modules."""
    bench = Bench(parse_args(["--warm"] if code == WARM else []), kafka_bootstrap, tmp_path)
    try:
        start = time_one_start(bench, 0, code, code_environment(None))
    finally:
        bench.delete_topics()
    assert set(start.phases_s) == set(PHASES.values())
    steps = [start.phases_s[column] for column in PHASES.values()]
    assert steps[0] > 0 and steps == sorted(steps)  # the connector logs them in this order (same ms possible)
    # Visible only once its epoch's barrier is past; it may show before the connector logs its commit (the
    # line is written after commit_transaction returns, and a reader can see the records just before that).
    assert start.phases_s["first barrier"] < start.first_output_s < 60
    assert 0 < start.imports_s < 60
    if code == WARM:
        assert start.phases_s["started"] < start.imports_s
