"""Specifications of the benchmark harness itself: it must catch wrong output, not only time it.

Run: ``KAFKA_BOOTSTRAP=127.0.0.1:9092 python -m pytest bench/test_bench.py -q`` (the last test needs Kafka).
"""

from __future__ import annotations

import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer

from bench import kafka_streams
from bench.contenders import BY_NAME, Epochline, JobSpec, KafkaStreams, QuixStreams, RawCopy
from bench.measure import (
    ChildProcess,
    CpuWindow,
    LatencyPlan,
    OutputTailer,
    measure_latency,
    read_committed_ids,
    run_to_completion,
    verify_ids,
)
from bench.report import FAILED, NOT_AVAILABLE, OK, Result, render_table, write_json
from bench.run import Bench, byte_compile_project, exit_on_sigterm, median_run, parse_args, repetition_order
from bench.workload import (
    FORMATS,
    INPUT_SCHEMA,
    NEGATIVE_SHARE,
    OUTPUT_SCHEMA,
    Workload,
    codec,
    generate_input,
    iso_millis,
    make_record,
    new_producer,
    produce_paced,
    write_schema_files,
)
from connectors.admin import create_topic, matching_topics
from engine.testing.accounting import assert_exactly_once
from engine.testing.local_broker import KAFKA_VERSION
from tests.helpers.worker_process import wait_for

REPO = Path(__file__).resolve().parents[1]


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


@pytest.mark.parametrize("format_name", FORMATS)
def test_input_rows_round_trip_through_their_codec(format_name: str) -> None:
    row = make_record(42, random.Random(3))
    input_codec = codec(format_name, INPUT_SCHEMA)
    assert input_codec.decode(input_codec.encode(row))["id"] == 42


def test_confluent_framed_avro_is_the_schemaless_body_after_the_magic_byte_and_the_schemas_id() -> None:
    row = make_record(42, random.Random(3))
    framed, bare = codec("avro-confluent", INPUT_SCHEMA).encode(row), codec("avro", INPUT_SCHEMA).encode(row)
    assert framed == b"\x00\x00\x00\x00\x01" + bare


def test_output_ids_are_read_with_the_output_schema() -> None:
    output_codec = codec("avro", OUTPUT_SCHEMA)
    row = {"id": 7, "user": "u", "amount2": 2.0, "ts": 1}
    assert output_codec.decode(output_codec.encode(row))["id"] == 7


def test_the_table_shows_ratios_to_raw_eos() -> None:
    results = [Result("raw-eos", OK, "", records_per_s=100.0), Result("quix-eos", OK, "", records_per_s=25.0)]
    table = render_table(results, "t")
    records_column = next(c for c in table.columns if c.header == "records/s")
    assert list(records_column.cells) == ["100 (1.00x)", "25 (0.25x)"]


def cells_of(result: Result) -> dict[str, str]:
    return {str(column.header): next(iter(column.cells)) for column in render_table([result], "t").columns}


def test_the_table_splits_the_cpu_between_the_contender_and_the_broker() -> None:
    result = Result("raw-eos", OK, "")
    result.set_cpu(client_seconds=2.0, broker_seconds=1.0, records=100_000)

    cells = cells_of(result)

    assert (cells["client CPU s"], cells["broker CPU s"]) == ("2.0", "1.0")
    assert cells["client CPU µs/record"] == "20.0 (1.00x)"
    assert cells["broker CPU µs/record"] == "10.0 (1.00x)"
    assert cells["records/CPU-s"] == "33,333 (1.00x)"  # 100k records / (2 + 1) CPU s


def test_without_the_brokers_cpu_its_columns_and_the_whole_systems_rate_are_empty() -> None:  # --bootstrap
    result = Result("epochline-eos", OK, "")
    result.set_cpu(client_seconds=3.0, broker_seconds=None, records=100_000)

    assert result.client_cpu_us_per_record == 30.0
    assert (result.broker_cpu_seconds, result.broker_cpu_us_per_record, result.records_per_cpu_second) == (
        None, None, None)
    cells = cells_of(result)
    assert (cells["broker CPU s"], cells["broker CPU µs/record"], cells["records/CPU-s"]) == ("-", "-", "-")


def test_the_json_holds_the_cpu_split_and_its_ratios(tmp_path: Path) -> None:
    raw, streams = Result("raw-eos", OK, ""), Result("kafka-streams-eos", OK, "")
    raw.set_cpu(1.0, 1.0, 1_000)
    streams.set_cpu(3.0, 1.0, 1_000)

    write_json(tmp_path / "r.json", {}, [raw, streams])

    row = orjson.loads((tmp_path / "r.json").read_bytes())["results"][1]
    assert (row["client_cpu_seconds"], row["broker_cpu_seconds"], row["records_per_cpu_second"]) == (3.0, 1.0, 250.0)
    assert row["ratio_to_raw_eos"]["records_per_cpu_second"] == 0.5


def test_the_broker_cpu_window_reads_a_live_process_and_nothing_without_one() -> None:
    window = CpuWindow(os.getpid())  # this process stands in for the broker JVM
    sum(i * i for i in range(200_000))

    span = window.close()

    assert span.broker_seconds is not None and span.broker_seconds >= 0
    assert CpuWindow(None).close().broker_seconds is None


def test_repetitions_alternate_the_order_so_no_contender_always_runs_first() -> None:
    contenders = [RawCopy(), BY_NAME["epochline-eos"], BY_NAME["epochline-alo"]]

    orders = [[c.name for c in repetition_order(contenders, repetition)] for repetition in range(3)]

    assert orders == [["raw-eos", "epochline-eos", "epochline-alo"],
                      ["epochline-alo", "epochline-eos", "raw-eos"],
                      ["raw-eos", "epochline-eos", "epochline-alo"]]


def test_a_repeated_contender_reports_its_median_run_with_every_runs_rate_and_median_latencies() -> None:
    runs = [Result("epochline-eos", OK, "", records_per_s=rate, wall_seconds=1e6 / rate) for rate in (300.0, 100.0,
                                                                                                       200.0, 400.0)]
    for run, first_output in zip(runs, (0.9, 0.7, 1.1, 0.8)):
        run.latency_p50_ms, run.first_output_s = first_output * 100, first_output

    chosen = median_run(runs)

    assert (chosen.records_per_s, chosen.wall_seconds) == (200.0, 5000.0)  # the lower middle run's numbers
    assert chosen.runs_records_per_s == [300.0, 100.0, 200.0, 400.0]
    assert (chosen.latency_p50_ms, chosen.first_output_s) == (80.0, 0.8)  # the lower middle of each
    assert chosen.latency_p99_ms is None  # measured by no run
    assert "records/s of each run: 300, 100, 200, 400" in cells_of(chosen)["note"]


def test_one_failed_repetition_is_the_contenders_result() -> None:
    runs = [Result("epochline-eos", OK, "", records_per_s=300.0),
            Result("epochline-eos", FAILED, "", reason="2 ids duplicated")]

    chosen = median_run(runs)

    assert (chosen.status, chosen.reason, chosen.runs_records_per_s) == (FAILED, "2 ids duplicated", [300.0, None])


def test_a_single_run_is_reported_as_it_is() -> None:
    run = Result("raw-eos", OK, "", records_per_s=250.0)

    assert median_run([run]) is run and run.runs_records_per_s == []


def test_a_repeat_below_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--repeat", "0"])
    assert "--repeat must be at least 1" in capsys.readouterr().err


def test_a_failed_run_shows_its_reason_instead_of_numbers() -> None:
    table = render_table([Result("epochline-eos", FAILED, "note", reason="3 ids missing")], "t")
    note_column = table.columns[-1]
    assert list(note_column.cells) == ["3 ids missing"]


def test_a_contenders_peak_rss_is_its_own_not_the_harnesses(tmp_path: Path) -> None:
    held_by_the_harness = bytearray(400 * 1024 * 1024)  # touched: all 400 MiB resident
    child = ChildProcess([sys.executable, "-c", "import time; blob = b'x' * (30 * 1024 * 1024); time.sleep(1)"],
                         tmp_path / "child.log", tmp_path)
    usage = child.wait(30.0)

    assert usage is not None and usage.exit_code == 0
    assert 30 < usage.peak_rss_mb < 150, f"{usage.peak_rss_mb:.0f} MB for a 30 MB child"
    del held_by_the_harness


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


@pytest.mark.timeout(120)
@pytest.mark.parametrize("by_id", [False, True], ids=["counting", "by-id"])
def test_the_tailer_counts_committed_records_and_never_aborted_ones(by_id: bool, kafka_bootstrap: str) -> None:
    topic = f"bench-test-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 4)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    tailer = OutputTailer(kafka_bootstrap, topic, target=300, id_of=int if by_id else None)
    tailer.start()
    try:
        for ids, commit in ((range(200), True), (range(200, 300), False), (range(300, 400), True)):
            producer.begin_transaction()
            for i in ids:
                producer.produce(topic, str(i).encode(), partition=i % 4)
            producer.commit_transaction(30) if commit else producer.abort_transaction(30)
        deadline = time.monotonic() + 60
        while tailer.target_reached_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # nothing more may arrive
    finally:
        tailer.halt()

    assert tailer.target_reached_at is not None and tailer.count == 300
    if by_id:
        assert sorted(tailer.arrivals) == [*range(200), *range(300, 400)]


@pytest.mark.timeout(120)
def test_the_tailer_stamps_a_record_when_it_becomes_visible_not_when_its_read_times_out(kafka_bootstrap: str) -> None:
    """A read that may wait 3 s must still hand out one committed record at once: first-output and latency
    numbers are the tailer's arrival stamps."""
    topic = f"bench-test-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    tailer = OutputTailer(kafka_bootstrap, topic, target=1, id_of=int, read_wait_s=3.0)
    tailer.start()
    try:
        time.sleep(0.5)  # the tailer is inside a read
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        producer.produce(topic, b"7")
        producer.flush(30)
        committed_at = time.time()
        deadline = time.monotonic() + 30
        while tailer.target_reached_at is None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        tailer.halt()
    assert tailer.target_reached_at is not None
    assert tailer.arrivals[7] - committed_at < 1.5, "the read waited for more records than one"


@pytest.mark.timeout(180)
def test_the_warm_up_copies_the_input_as_often_as_asked_and_keeps_each_copys_rate(kafka_bootstrap: str,
                                                                                tmp_path: Path) -> None:
    bench = Bench(parse_args(["--warm-up-copies", "2"]), kafka_bootstrap, tmp_path)
    input_topic = bench.topic("input")
    workload = generate_input(kafka_bootstrap, input_topic, 1_000, "json")

    bench.warm_up(input_topic, workload)

    assert len(bench.warm_up_rates) == 2 and all(rate > 0 for rate in bench.warm_up_rates)
    copies = [topic for topic in bench.topics if "warm-up" in topic and topic.endswith("-out")]
    assert [topic.removeprefix(bench.prefix) for topic in copies] == ["-raw-eos-warm-up-1-out",
                                                                      "-raw-eos-warm-up-2-out"]
    assert all(len(read_committed_ids(kafka_bootstrap, topic, bench.id_reader(RawCopy()))) == 1_000
               for topic in copies)
    bench.delete_topics()


@pytest.mark.timeout(120)
def test_the_bench_deletes_the_topics_it_made_fillers_included(kafka_bootstrap: str, tmp_path: Path) -> None:
    """A broker given with --bootstrap keeps no topic of a run (once, a dropped admin client's deletions
    were destroyed unsent and every run's topics stayed)."""
    bench = Bench(parse_args([]), kafka_bootstrap, tmp_path)
    bench.topic("kept")
    bench.filler_topics(3)
    made = set(bench.topics)

    def listed() -> set[str]:
        return made & set(matching_topics(kafka_bootstrap, bench.prefix))

    assert len(made) == 4
    wait_for("the run's four topics", lambda: listed() == made, timeout_s=30, every_s=0.2)
    bench.delete_topics()
    wait_for("the run's topics deleted", lambda: not listed(), timeout_s=30, every_s=0.2)


@pytest.mark.timeout(180)
def test_a_live_run_times_the_probe_records_and_the_start_up_to_the_first_output(kafka_bootstrap: str,
                                                                                 tmp_path: Path) -> None:
    prefix = f"bench-test-{uuid.uuid4().hex[:8]}"
    input_topic, output_topic = f"{prefix}-in", f"{prefix}-out"
    for topic in (input_topic, output_topic):
        create_topic(kafka_bootstrap, topic, 4)
    job = JobSpec(kafka_bootstrap, input_topic, output_topic, f"{prefix}-dlq", "json", prefix, tmp_path,
                  tmp_path / "in.avsc", tmp_path / "out.avsc", expected_outputs=100, bounded=False)
    decode = codec("json", INPUT_SCHEMA).decode

    def produce(ids: range, rate: float, stamps: dict[int, int], until: Callable[[], bool] | None = None) -> None:
        produce_paced(kafka_bootstrap, input_topic, "json", ids, rate, stamps, until)

    latency = measure_latency(RawCopy(), job, lambda value: decode(value)["id"],
                              LatencyPlan(records=100, rate=200.0), produce)

    assert latency.samples == 100
    assert 0 < latency.p50_ms <= latency.p99_ms < 10_000
    assert 0.05 < latency.first_output_s < 60, "a Python process needs more than 50 ms to put out a record"


@pytest.mark.timeout(180)
def test_epochline_copies_confluent_framed_avro_exactly_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The avro-confluent contender end to end: framed input in, framed output with the output's id out."""
    prefix = f"bench-test-{uuid.uuid4().hex[:8]}"
    input_topic, output_topic = f"{prefix}-in", f"{prefix}-out"
    for topic in (input_topic, output_topic, f"{prefix}-dlq"):
        create_topic(kafka_bootstrap, topic, 4)
    workload = generate_input(kafka_bootstrap, input_topic, 2_000, "avro-confluent")
    input_schema, output_schema = write_schema_files(tmp_path / "avro-schemas")
    job = JobSpec(kafka_bootstrap, input_topic, output_topic, f"{prefix}-dlq", "avro-confluent", prefix,
                  tmp_path / "job", input_schema, output_schema, expected_outputs=len(workload.expected_ids),
                  bounded=True)
    job.workdir.mkdir()

    run_to_completion(Epochline("epochline-eos", "exactly-once"), job, timeout=120)
    values = read_committed_ids(kafka_bootstrap, output_topic, bytes)

    assert {value[:5] for value in values} == {b"\x00\x00\x00\x00\x02"}
    decode = codec("avro-confluent", OUTPUT_SCHEMA).decode
    assert_exactly_once(kafka_bootstrap, output_topic, f"{prefix}-dlq", workload.expected_ids,
                        output_ids_of=lambda value: [decode(value or b"")["id"]])


@pytest.mark.timeout(180)
def test_the_epochline_copy_contender_copies_every_input_value_byte_for_byte(kafka_bootstrap: str,
                                                                           tmp_path: Path) -> None:
    """The copy contender is raw-eos's job through the engine: every input value, tombstone-free, once."""
    prefix = f"bench-test-{uuid.uuid4().hex[:8]}"
    input_topic, output_topic = f"{prefix}-in", f"{prefix}-out"
    for topic in (input_topic, output_topic, f"{prefix}-dlq"):
        create_topic(kafka_bootstrap, topic, 4)
    workload = generate_input(kafka_bootstrap, input_topic, 2_000, "json")
    job = JobSpec(kafka_bootstrap, input_topic, output_topic, f"{prefix}-dlq", "json", prefix, tmp_path / "job",
                  tmp_path / "in.avsc", tmp_path / "out.avsc", expected_outputs=len(workload.all_ids), bounded=True)
    job.workdir.mkdir()

    run_to_completion(BY_NAME["epochline-eos-copy"], job, timeout=120)

    copied = read_committed_ids(kafka_bootstrap, output_topic, bytes)
    originals = read_committed_ids(kafka_bootstrap, input_topic, bytes)
    assert sorted(copied) == sorted(originals)
    assert_exactly_once(kafka_bootstrap, output_topic, f"{prefix}-dlq", workload.all_ids)


@pytest.mark.parametrize("delivery", ["exactly-once", "at-least-once"])
def test_the_epochline_contender_writes_a_config_epochline_accepts(delivery: str, tmp_path: Path) -> None:
    config_module = pytest.importorskip("engine.config")
    job = JobSpec("127.0.0.1:9", "in", "out", "dlq", "avro", "bench-x", tmp_path, tmp_path / "in.avsc",
                  tmp_path / "out.avsc", expected_outputs=1, bounded=True)
    command = Epochline("epochline", delivery).command(job)

    config = config_module.load_config(command[command.index("run") + 1])

    assert (config.sink.delivery, config.checkpoint.interval, config.source.start_from) == (delivery, 1000, "earliest")
    assert command[-1] == "--stop-at-end"


def test_quix_runs_from_its_own_venv_and_is_unavailable_without_it(tmp_path: Path) -> None:
    missing = QuixStreams(python=tmp_path / "no-venv" / "bin" / "python")
    job = JobSpec("127.0.0.1:9", "in", "out", "dlq", "json", "bench-x", tmp_path, tmp_path / "in.avsc",
                  tmp_path / "out.avsc", expected_outputs=1, bounded=True)

    assert missing.unavailable_reason() == "not available: no Quix Streams venv at no-venv/ (make bench makes it)"
    assert missing.command(job)[:2] == [str(tmp_path / "no-venv" / "bin" / "python"),
                                        str(REPO / "bench" / "quix_job.py")]


def test_a_profiled_epochline_run_is_wrapped_in_pyinstrument(tmp_path: Path) -> None:
    job = JobSpec("127.0.0.1:9", "in", "out", "dlq", "json", "bench-x", tmp_path, tmp_path / "in.avsc",
                  tmp_path / "out.avsc", expected_outputs=1, bounded=True, profile_to=tmp_path / "p.html")
    command = Epochline("epochline-eos", "exactly-once").command(job)
    assert command[1:8] == ["-m", "pyinstrument", "-r", "html", "-o", str(tmp_path / "p.html"), "-m"]
    assert command[8:10] == ["engine.cli", "run"]


def test_sigterm_exits_through_the_cleanup_that_stops_the_private_broker() -> None:
    import signal

    cleaned = []
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exit_:
        try:
            with exit_on_sigterm():
                os.kill(os.getpid(), signal.SIGTERM)
        finally:
            cleaned.append(True)

    assert (exit_.value.code, cleaned, signal.getsignal(signal.SIGTERM)) == (143, [True], before)


def test_the_projects_modules_are_byte_compiled_before_the_contenders_start() -> None:
    """So a contender's start-up is an installed package's, not a compile of every module."""
    import importlib.util

    cached = Path(importlib.util.cache_from_source(str(REPO / "engine" / "ports.py")))
    cached.unlink(missing_ok=True)

    byte_compile_project()

    assert cached.is_file()


def test_json_timestamps_use_epochlines_wire_form() -> None:
    assert iso_millis(1_764_000_000_123) == "2025-11-24T16:00:00.123Z"


def test_kafka_streams_uses_the_brokers_kafka_version() -> None:
    def kafka_version(pom: Path) -> str:
        found = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom.read_text())
        assert found, pom
        return found.group(1)

    assert kafka_version(REPO / "bench" / "kstreams" / "pom.xml") == KAFKA_VERSION
    assert kafka_version(REPO / "engine" / "testing" / "kafka" / "pom.xml") == KAFKA_VERSION


def test_kafka_streams_is_not_available_without_javac(monkeypatch: pytest.MonkeyPatch) -> None:
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None if name == "javac" else which(name))
    monkeypatch.setattr(kafka_streams, "build", lambda: pytest.fail("built without javac"))

    reason = KafkaStreams().unavailable_reason()

    assert reason is not None and reason.startswith("not available: 'javac' is not on PATH; it is needed to compile")


@pytest.mark.parametrize(("outcome", "said"), [
    (subprocess.CompletedProcess([], 1, "[ERROR] Could not resolve dependencies", ""), "exited 1:\n[ERROR] Could not"),
    (subprocess.TimeoutExpired(["mvn"], 600), "did not finish within 600s"),
])
def test_a_failed_kafka_streams_build_names_its_step(outcome: object, said: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def run(*args: object, **kwargs: object) -> object:
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    monkeypatch.setenv("EPOCHLINE_CACHE", str(tmp_path))  # no cached build to find
    monkeypatch.setattr(kafka_streams, "missing_tool", lambda: None)
    monkeypatch.setattr(subprocess, "run", run)

    reason = KafkaStreams().unavailable_reason()

    assert reason is not None
    assert reason.startswith("not available: building it failed: mvn dependency:copy-dependencies")
    assert said in reason
    assert list(tmp_path.glob("kstreams-*/*")) == []  # nothing half-built is left to be taken for a build


def test_kafka_streams_reports_itself_unavailable_for_avro(tmp_path: Path) -> None:
    bench = Bench(parse_args(["--format", "avro"]), "127.0.0.1:9", tmp_path)

    result = bench.run_contender(KafkaStreams(), "in", Workload(1, 100, {0}, range(1)))

    assert (result.status, result.reason) == (NOT_AVAILABLE, "not available: json only")


@pytest.mark.parametrize("bounded", [True, False])
def test_the_kafka_streams_command_runs_the_jvm_itself(bounded: bool, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    built = kafka_streams.Build(tmp_path / "libs", tmp_path / "classes")
    monkeypatch.setattr(kafka_streams, "build", lambda: built)
    job = JobSpec("127.0.0.1:9", "in", "out", "dlq", "json", "bench-x", tmp_path, tmp_path / "in.avsc",
                  tmp_path / "out.avsc", expected_outputs=1, bounded=bounded)

    command = KafkaStreams(threads=2).command(job)

    assert Path(command[0]).name == "java"  # no shell between: wait4 sees the JVM's own CPU and RSS
    assert command[command.index("-cp") + 1] == f"{tmp_path / 'classes'}:{tmp_path / 'libs'}/*"
    assert [command[command.index(flag) + 1] for flag in ("--application-id", "--threads", "--dead-letter")] == [
        "bench-x", "2", "dlq"]
    assert ("--bounded" in command) is bounded


@pytest.mark.timeout(300)
def test_kafka_streams_writes_the_jobs_rows_once_and_dead_letters_malformed_input(kafka_bootstrap: str,
                                                                                  tmp_path: Path) -> None:
    contender = KafkaStreams()
    reason = contender.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    prefix = f"bench-test-{uuid.uuid4().hex[:8]}"
    input_topic, output_topic, dead_letters = f"{prefix}-in", f"{prefix}-out", f"{prefix}-dlq"
    for topic, partitions in ((input_topic, 4), (output_topic, 4), (dead_letters, 1)):
        create_topic(kafka_bootstrap, topic, partitions)
    workload = generate_input(kafka_bootstrap, input_topic, 2_000, "json")
    malformed = [b"not json", orjson.dumps({**make_record(5_000, random.Random(1)), "amount": "12.5"})]
    producer = new_producer(kafka_bootstrap)
    for value in malformed:
        producer.produce(input_topic, value)
    assert producer.flush(30) == 0
    job = JobSpec(kafka_bootstrap, input_topic, output_topic, dead_letters, "json", prefix, tmp_path,
                  tmp_path / "in.avsc", tmp_path / "out.avsc", expected_outputs=len(workload.expected_ids),
                  bounded=True)

    run = run_to_completion(contender, job, timeout=240)

    assert run.usage.exit_code == 0  # it stopped by itself at the input's end
    rows = {row["id"]: row for row in read_committed_ids(kafka_bootstrap, output_topic, orjson.loads)}
    rng = random.Random(7)  # generate_input's seed: the same rows again
    inputs = [make_record(i, rng) for i in range(2_000)]
    assert rows == {row["id"]: {"id": row["id"], "user": row["user"], "amount2": row["amount"] * 2,
                                "ts": iso_millis(row["ts"])} for row in inputs if row["amount"] >= 0}
    assert verify_ids(read_committed_ids(kafka_bootstrap, output_topic, lambda v: orjson.loads(v)["id"]),
                      workload.expected_ids).ok
    assert sorted(read_committed_ids(kafka_bootstrap, dead_letters, bytes)) == sorted(malformed)
