"""Running ``epochline run`` as a real subprocess and reading what it committed, for crash tests and the
sink conformance kit.

The connector runs as its own process so that SIGKILL is a real crash: nothing in this test process
can flush, commit or clean up on its behalf.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml
from confluent_kafka import Producer

from connectors.admin import end_offsets
from connectors.batch import SourceBatch
from connectors.source import KafkaSource, SourceSettings
from schemas import FormatSpec
from sinks import produce_waiting


@dataclass
class Connector:
    """One ``epochline run`` process; stderr goes to a file so a test can show why it failed."""

    process: subprocess.Popen[bytes]
    log_path: Path

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"connector did not finish in {timeout}s; log tail:\n{self.log_tail()}") from None

    def wait_for_exit(self, seconds: float) -> bool:
        """True when the process ended by itself within ``seconds`` (it is left running otherwise)."""
        try:
            self.process.wait(seconds)
        except subprocess.TimeoutExpired:
            return False
        return True

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def crashed_by_fault(self) -> bool:
        return '"injected crash"' in self.log_path.read_text(errors="replace")


PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""Where ``python -m engine.cli`` finds this checkout's packages (and ``examples``)."""


def write_config(directory: Path, config: Mapping[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{config['name']}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def start_connector(config_path: Path, bootstrap: str, *, stop_at_end: bool = False,
                    faults: str = "", log_name: str = "connector", command: Sequence[str] = ("run",),
                    extra_args: Sequence[str] = ()) -> Connector:
    """``epochline <command> CONFIG --bootstrap-servers B [extra_args]`` as its own process."""
    log_path = config_path.parent / f"{log_name}-{time.monotonic_ns()}.log"
    argv = [sys.executable, "-m", "engine.cli", *command, str(config_path), "--bootstrap-servers", bootstrap,
            *extra_args]
    if stop_at_end:
        argv.append("--stop-at-end")
    env = {**os.environ, "EPOCHLINE_TEST_FAULTS": faults}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=PROJECT_ROOT)
    return Connector(process, log_path)


KeyOf = Callable[[int], tuple[int, bytes]]
"""Record index -> (partition, key): rows keyed like a keyed producer would write them."""


def produce_values(bootstrap: str, topic: str, rows: list[bytes], partitions: int, seconds: float = 0.0,
                   key_of: KeyOf | None = None) -> None:
    """Write ``rows`` round-robin over the partitions (or where ``key_of`` puts them, with its key), spread
    evenly over ``seconds`` (a live stream)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4",
                         "enable.idempotence": True})  # a broker bounce must not duplicate the input
    started = time.monotonic()
    for index, value in enumerate(rows):
        partition, key = key_of(index) if key_of is not None else (index % partitions, None)
        produce_waiting(producer, topic, value, key, partition=partition, wait_s=0.1)
        if seconds and index % 1000 == 0:
            producer.poll(0)
            ahead = started + seconds * index / len(rows) - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
    assert producer.flush(60) == 0, f"could not write the input to {topic}"


class LiveInput:
    """A producer thread writing the input while connectors are started and killed."""

    def __init__(self, bootstrap: str, topic: str, rows: list[bytes], partitions: int, seconds: float,
                 key_of: KeyOf | None = None) -> None:
        self._thread = threading.Thread(target=produce_values, args=(bootstrap, topic, rows, partitions, seconds,
                                                                     key_of), daemon=True)
        self._thread.start()

    @property
    def streaming(self) -> bool:
        """Whether the input is still being written."""
        return self._thread.is_alive()

    def join(self, timeout: float = 120) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the input producer did not finish"


def committing_or_ended(run: Connector, more: LiveInput, timeout: float = 60.0) -> None:
    """Until the run committed an epoch, ended, or the input stopped streaming: a random lifetime counts from
    there, so a slow start (a busy machine) does not use it up before any epoch reaches a commit."""
    deadline = time.monotonic() + timeout
    while (run.process.poll() is None and more.streaming
           and "checkpoint committed" not in run.log_path.read_text(errors="replace")):
        if time.monotonic() > deadline:
            raise AssertionError(f"no epoch committed in {timeout} s:\n{run.log_tail()}")
        time.sleep(0.1)


def json_field_counts(values: list[bytes], field: str) -> Counter[Any]:
    return Counter(orjson.loads(value)[field] for value in values)


def read_until(source: KafkaSource, ends: Mapping[int, int], deadline_s: float = 60.0) -> list[SourceBatch]:
    """Every batch ``source`` hands out until its position reaches ``ends`` (bounded by a deadline)."""
    batches = []
    deadline = time.monotonic() + deadline_s
    while not source.reached(ends):
        assert time.monotonic() < deadline, f"source stuck at {source.position()} before ends {ends}"
        batch = source.poll_batch(0.5)
        if batch is not None:
            batches.append(batch)
    return batches


def produce_keyed(bootstrap: str, topic: str, values: Iterable[bytes | None]) -> None:
    """Write ``values`` as they come, record i keyed ``str(i)``, and wait until every one is acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20})
    for i, value in enumerate(values):
        produce_waiting(producer, topic, value, str(i).encode())
    assert producer.flush(60) == 0, f"could not write the input to {topic}"


def read_batches(bootstrap: str, topic: str, spec: FormatSpec, deadline_s: float = 180.0) -> list[SourceBatch]:
    """Every batch a ``KafkaSource`` with format ``spec`` hands out, from the start to today's end offsets."""
    settings = SourceSettings(name="src", topic=topic, format=spec)
    with KafkaSource(settings, bootstrap, f"group-{topic}") as source:
        source.open()
        return read_until(source, end_offsets(bootstrap, topic), deadline_s)
