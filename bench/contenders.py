"""The contenders: each turns one job description into the command line of its own subprocess.

A contender never runs inside the harness process, so the CPU seconds and peak RSS the harness reads from
``wait4`` belong to the contender (and its children) alone.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import yaml

from bench import kafka_streams
from bench.workload import FORMATS, INPUT_SCHEMA, OUTPUT_SCHEMA, SCHEMA_IDS, SQL, schemas_by_id

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
# Splits kcat's stdout into messages; Avro values may hold any single byte, so the delimiter is long.
KCAT_DELIMITER = r"\x1e\x1f\x1d\x1c\x1e\x1f\x1d\x1c"
RAW_FORMAT = {"format": "raw"}  # epochline's copy contender: values as bytes, nothing decoded


@dataclass(frozen=True)
class JobSpec:
    """One run of one contender: where it reads and writes, and whether it stops at the input's end."""

    bootstrap: str
    input_topic: str
    output_topic: str
    dead_letter_topic: str
    format: str
    name: str  # unique per run: consumer group, transactional.id and connector name derive from it
    workdir: Path
    input_schema: Path
    output_schema: Path
    expected_outputs: int
    bounded: bool  # True: stop after the input present at start; False: run until SIGTERM
    profile_to: Path | None = None  # epochline only: write a pyinstrument HTML profile of the run here
    producer: dict[str, str] = field(default_factory=dict)  # epochline only: sink.producer settings
    consumer: dict[str, str] = field(default_factory=dict)  # epochline only: source.consumer settings


class Contender(Protocol):
    name: str
    transforms: bool  # True: writes the job's projected rows; False: copies the input bytes
    runs_live: bool  # False: it can only copy a bounded input, so its latency is not measured
    formats: tuple[str, ...]  # the benchmark formats it can run (the harness reports the others "not available")
    note: str

    def unavailable_reason(self) -> str | None:
        """Why this contender cannot run here, or None when it can."""

    def command(self, job: JobSpec) -> list[str]:
        """The argv of the contender's process for ``job`` (files it needs are written to ``job.workdir``)."""


@functools.cache
def _epochline_run_missing() -> str | None:
    """None when ``epochline run`` exists in this checkout; otherwise what the CLI said."""
    probe = subprocess.run([sys.executable, "-m", "engine.cli", "run", "--help"], cwd=REPO_DIR,
                           capture_output=True, text=True, timeout=120, check=False)
    if probe.returncode == 0:
        return None
    last_line = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
    return f"not available: 'epochline run --help' exited {probe.returncode}: {last_line}"


@dataclass(frozen=True)
class Epochline:
    """``epochline run CONFIG --bootstrap-servers X [--stop-at-end]`` with the job's SQL transform."""

    name: str
    delivery: str
    transforms: bool = True
    runs_live: bool = True
    formats: tuple[str, ...] = FORMATS
    note: str = "epochline run CLI, SQL transform, 1 s checkpoints"

    def unavailable_reason(self) -> str | None:
        return _epochline_run_missing()

    def config(self, job: JobSpec) -> dict:
        """The job's connector config; without ``transforms`` the raw format in and out and no transform:
        the byte copy of raw-eos, through the engine."""
        source_format = _format_config(job, job.input_schema, INPUT_SCHEMA) if self.transforms else RAW_FORMAT
        sink_format = _format_config(job, job.output_schema, OUTPUT_SCHEMA) if self.transforms else RAW_FORMAT
        return {
            "name": job.name,
            "source": {"topic": job.input_topic, **source_format,
                       **({"consumer": dict(job.consumer)} if job.consumer else {})},
            **({"transform": {"sql": SQL}} if self.transforms else {}),
            "sink": {"topic": job.output_topic, **sink_format, "delivery": self.delivery,
                     "producer": dict(job.producer)},
            "dead_letter": {"topic": job.dead_letter_topic},
            "checkpoint": {"interval": "1s", "dir": str(job.workdir / "state")},
        }

    def command(self, job: JobSpec) -> list[str]:
        config_path = job.workdir / "epochline.yaml"
        config_path.write_text(yaml.safe_dump(self.config(job), sort_keys=False))
        command = [sys.executable, "-m", "engine.cli", "run", str(config_path), "--bootstrap-servers", job.bootstrap]
        if job.profile_to is not None:
            command[1:3] = ["-m", "pyinstrument", "-r", "html", "-o", str(job.profile_to), "-m", "engine.cli"]
        return command + (["--stop-at-end"] if job.bounded else [])


def _format_config(job: JobSpec, schema_file: Path, schema: dict) -> dict:
    """The format keys of a source or sink: the ``.avsc`` file, or for avro-confluent the directory of
    schemas by id and the id this side's records carry."""
    if job.format == "avro-confluent":
        return {"format": job.format, "schema_dir": str(schemas_by_id(schema_file.parent)),
                "schema_id": SCHEMA_IDS[schema["name"]]}
    return {"format": job.format, "schema": str(schema_file)}


@dataclass(frozen=True)
class QuixStreams:
    """Quix Streams, ``processing_guarantee="exactly-once"``, ``commit_interval=1.0`` (bench/quix_job.py)."""

    name: str = "quix-eos"
    transforms: bool = True
    runs_live: bool = True
    formats: tuple[str, ...] = ("json", "avro")  # its Confluent Avro serializers need a Schema Registry
    note: str = "Quix Streams exactly-once, per-record transform, commit_interval 1 s"

    python: Path = REPO_DIR / ".venv-quix" / "bin" / "python"  # made by `make bench`

    def unavailable_reason(self) -> str | None:
        """Quix runs from a venv of its own: it pins an older confluent-kafka than epochline's, which
        installed beside epochline would downgrade the client every other contender runs on."""
        if not self.python.exists():
            return f"not available: no Quix Streams venv at {self.python.parent.parent.name}/ (make bench makes it)"
        probe = subprocess.run([str(self.python), "-c", "import quixstreams"], capture_output=True, text=True,
                               timeout=120, check=False)
        if probe.returncode != 0:
            return f"not available: {(probe.stderr.strip().splitlines() or ['import failed'])[-1]}"
        return None

    def command(self, job: JobSpec) -> list[str]:
        return [
            str(self.python), str(BENCH_DIR / "quix_job.py"), "--bootstrap", job.bootstrap,
            "--input", job.input_topic, "--output", job.output_topic, "--group", job.name,
            "--format", job.format, "--input-schema", str(job.input_schema),
            "--output-schema", str(job.output_schema), "--state-dir", str(job.workdir / "quix-state"),
            "--count", str(job.expected_outputs if job.bounded else 0),
        ]


@dataclass(frozen=True)
class RawCopy:
    """The raw confluent-kafka transactional copy loop, 1 s transactions (bench/raw_copy.py)."""

    name: str = "raw-eos"
    transforms: bool = False
    runs_live: bool = True
    formats: tuple[str, ...] = FORMATS
    note: str = "confluent-kafka transactional byte copy, no decoding, 1 s transactions"

    def unavailable_reason(self) -> str | None:
        return None

    def command(self, job: JobSpec) -> list[str]:
        command = [
            sys.executable, str(BENCH_DIR / "raw_copy.py"), "--bootstrap", job.bootstrap,
            "--input", job.input_topic, "--output", job.output_topic, "--group", job.name,
            "--transactional-id", job.name, "--commit-interval", "1.0",
        ]
        return command + (["--stop-at-end"] if job.bounded else [])


@dataclass(frozen=True)
class Kcat:
    """``kcat -C -e | kcat -P``: the client-side ceiling; NOT transactional (no exactly-once).

    Bounded only: ``kcat -P`` reads stdin in blocks, so in a live pipe records wait until a block fills
    (or the pipe closes) and a latency figure would measure kcat's stdin buffer, not the copy.
    """

    name: str = "kcat"
    transforms: bool = False
    runs_live: bool = False
    formats: tuple[str, ...] = FORMATS
    note: str = "kcat -C -e | kcat -P; non-transactional; latency not measured (kcat -P buffers stdin)"

    def unavailable_reason(self) -> str | None:
        return None if shutil.which("kcat") else "not available: kcat is not installed (apt-get install kcat)"

    def command(self, job: JobSpec) -> list[str]:
        consume = ["kcat", "-C", "-e", "-q", "-b", job.bootstrap, "-t", job.input_topic, "-o", "beginning",
                   "-X", "isolation.level=read_committed", "-D", KCAT_DELIMITER]
        produce = ["kcat", "-P", "-q", "-b", job.bootstrap, "-t", job.output_topic, "-D", KCAT_DELIMITER,
                   "-X", "linger.ms=5", "-X", "compression.type=none"]
        return ["sh", "-c", f"{shlex.join(consume)} | {shlex.join(produce)}"]


@dataclass(frozen=True)
class KafkaStreams:
    """A Kafka Streams application (bench/kstreams/BenchStreams.java, JVM) with ``exactly_once_v2``,
    ``commit.interval.ms=1000`` and one stream thread per core; built once by bench/kafka_streams.py.

    Its command is ``java`` itself, so the JVM's start-up is inside its measured time, as every contender's
    process start is, and ``wait4`` reports the JVM's own CPU and RSS. JSON only."""

    name: str = "kafka-streams-eos"
    transforms: bool = True
    runs_live: bool = True
    formats: tuple[str, ...] = ("json",)
    note: str = (f"Kafka Streams {kafka_streams.KAFKA_VERSION} (JVM) exactly_once_v2, commit.interval.ms 1000, "
                 "one stream thread per core")
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)

    def unavailable_reason(self) -> str | None:
        missing = kafka_streams.missing_tool()
        if missing is None:
            try:
                kafka_streams.build()
            except kafka_streams.KafkaStreamsBuildError as error:
                missing = f"building it failed: {error}"
        return None if missing is None else f"not available: {missing}"

    def command(self, job: JobSpec) -> list[str]:
        return kafka_streams.java_command(
            kafka_streams.build(), bootstrap=job.bootstrap, input_topic=job.input_topic,
            output_topic=job.output_topic, dead_letter_topic=job.dead_letter_topic, application_id=job.name,
            threads=self.threads, state_dir=job.workdir / "kstreams-state", bounded=job.bounded,
        )


ALL: tuple[Contender, ...] = (
    RawCopy(),
    Kcat(),
    Epochline("epochline-eos", "exactly-once"),
    Epochline("epochline-alo", "at-least-once"),
    Epochline("epochline-eos-copy", "exactly-once", transforms=False,
              note="epochline run CLI, raw format in and out, no transform: raw-eos's copy through the engine"),
    QuixStreams(),
    KafkaStreams(),
)
BY_NAME: dict[str, Contender] = {contender.name: contender for contender in ALL}
