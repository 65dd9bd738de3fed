"""Specifications of bench/worker_start.py: a connector created over a worker's API, timed to its first output."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.run import delete_or_warn
from bench.worker_start import INPUT_ROWS, KINDS, start_worker, time_connector_start
from bench.workload import generate_input
from connectors.admin import create_topics


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_connector_created_on_a_worker_is_timed_from_the_call_to_its_first_committed_output(
        kafka_bootstrap: str, tmp_path: Path, kind: str) -> None:
    topics = [f"worker-start-{kind}-{tmp_path.name}-{role}" for role in ("in", "out", "dlq")]
    create_topics(kafka_bootstrap, topics)
    generate_input(kafka_bootstrap, topics[0], INPUT_ROWS, "json")
    try:
        worker = start_worker(kind, kafka_bootstrap, tmp_path)
        try:
            seconds = time_connector_start(worker, kafka_bootstrap, topics, f"start-{kind}")
            with worker.client() as client:
                [task] = client.status(f"start-{kind}")["tasks"]
            command = Path(f"/proc/{task['pid']}/cmdline").read_bytes().split(b"\0")
        finally:
            exit_code = worker.stop(60)
    finally:
        delete_or_warn(kafka_bootstrap, topics)
    assert 0 < seconds < 60
    assert task["state"] == "RUNNING" and exit_code == 0
    assert (b"engine.worker.warm" in command) == (kind == "warm"), f"the {kind} worker's task ran {command}"
