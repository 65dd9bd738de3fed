"""A connector's start through a worker: from the REST call that creates it to its first committed output,
on a worker with its warm task process (the default) and on one without (``--no-warm-task``).

    python bench/worker_start.py [--starts 5] [--gap 10] [--bootstrap HOST:PORT]

Two workers of two clusters, started here and stopped by their PIDs. Each start creates a connector of its
own (JSON in, the SQL of ``bench.workload``, exactly-once out) on one of them, in rounds whose order flips
every round, on fresh one-partition topics whose input already holds rows (a deploy onto a live topic);
a ``read_committed`` reader times its first output row from the create call. So the time holds what a user
waits for: the configs topic, the worker's next tick (0.25 s at most), the task's start and its first
epoch. Starts are ``--gap`` seconds apart: a warm worker makes its next warm process 5 s after a start,
whose imports (1-1.5 s) must be over before the other worker's start is timed.
Without ``--bootstrap`` a private broker is started and stopped; topics made are deleted at the end.
Results: a table on stdout and ``bench/results/<timestamp>-worker-start.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo's packages (bench, connectors) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Consumer, TopicPartition

from bench.report import machine
from bench.run import RESULTS_DIR, broker, byte_compile_project, delete_or_warn, versions
from bench.workload import INPUT_SCHEMA, SQL, generate_input
from connectors.admin import create_topics
from engine.testing import LocalWorker, WorkerProcessFailed, start_local_worker

KINDS = {"warm": (), "cold": ("--no-warm-task",)}
"""Each kind of worker and the flags that make it."""
INPUT_ROWS = 10


def start_worker(kind: str, bootstrap: str, workdir: Path) -> LocalWorker:
    """A worker of a cluster of its own (``engine.testing.start_local_worker``), answering its API."""
    return start_local_worker(workdir, bootstrap, f"bench-{kind}-{uuid.uuid4().hex[:8]}", kind, cwd=workdir,
                              extra_args=KINDS[kind])


def connector_config(topics: Sequence[str]) -> dict[str, object]:
    source, sink, dead_letter = topics
    return {"source": {"topic": source, "format": "json", "schema": INPUT_SCHEMA}, "transform": {"sql": SQL},
            "sink": {"topic": sink}, "dead_letter": {"topic": dead_letter}}


def time_connector_start(worker: LocalWorker, bootstrap: str, topics: Sequence[str], name: str) -> float:
    """Seconds from the create call to the first committed output row (a reader assigned beforehand)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{name}",
                       "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        reader.assign([TopicPartition(topics[1], 0, 0)])
        reader.poll(0.5)  # connected and fetching before the clock starts
        with worker.client() as client:
            began = time.monotonic()
            client.create(name, connector_config(topics))
            while time.monotonic() - began < 60:
                message = reader.poll(0.5)
                if message is not None and message.error() is None:
                    return time.monotonic() - began
            raise RuntimeError(f"{name} on the {worker.name} worker wrote nothing within 60 s")
    finally:
        reader.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=5, help="starts on each worker (default 5)")
    parser.add_argument("--gap", type=float, default=10.0, help="seconds before each start (default 10)")
    parser.add_argument("--bootstrap", help="use this broker instead of starting a private one")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    byte_compile_project()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    workdir = Path(tempfile.mkdtemp(prefix="epochline-worker-start-"))
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    made: list[str] = []
    with broker(args.bootstrap) as (bootstrap, _):
        workers: list[LocalWorker] = []
        try:
            for kind in KINDS:  # one by one: a second that fails to start leaves the first to be stopped
                workers.append(start_worker(kind, bootstrap, workdir))
            for number in range(args.starts):
                for worker in workers if number % 2 == 0 else reversed(workers):
                    name = f"start-{worker.name}-{number}"
                    topics = [f"bench-{stamp}-{name}-{role}" for role in ("in", "out", "dlq")]
                    made.extend(topics)
                    create_topics(bootstrap, topics)
                    generate_input(bootstrap, topics[0], INPUT_ROWS, "json")
                    time.sleep(args.gap)
                    seconds = time_connector_start(worker, bootstrap, topics, name)
                    times[worker.name].append(round(seconds, 3))
                    print(f"  {worker.name}: created -> first output {seconds:.3f} s")
        finally:
            for worker in workers:
                try:
                    worker.stop(60)
                except WorkerProcessFailed as error:  # killed by then: report it, stop the others
                    print(f"warning: {error}", file=sys.stderr)
            delete_or_warn(bootstrap, made)
    medians = {kind: round(statistics.median(values), 3) for kind, values in times.items() if values}
    print("median seconds from the create call to the first committed output: "
          + ", ".join(f"{kind} {seconds:.3f}" for kind, seconds in medians.items()))
    output = RESULTS_DIR / f"{stamp}-worker-start.json"
    output.write_text(json.dumps({"meta": {"timestamp": stamp, "command": " ".join(sys.argv), "gap_s": args.gap,
                                           "machine": machine(), "versions": versions()},
                                  "medians": medians, "starts": times}, indent=2) + "\n")
    print(f"results: {output}")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
