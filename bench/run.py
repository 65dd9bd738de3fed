"""epochline benchmark: the same Kafka → decode → filter → project → encode → Kafka job, run by epochline
(exactly-once and at-least-once), Quix Streams (exactly-once), Kafka Streams (exactly_once_v2, JVM; JSON
only), a raw confluent-kafka transactional copy loop (the Python ceiling) and kcat (the client-side
ceiling), each in its own process.

    python bench/run.py [--records 1000000] [--format json|avro|avro-confluent] [--only NAME ...]
                        [--bootstrap HOST:PORT]

Without ``--bootstrap`` a private broker (engine.testing.local_broker.LocalBroker) is started in a temp dir on a
free port and stopped at the end. Every run's output is verified under ``read_committed`` (each expected
id exactly once) before its numbers count; the measurement methods are described in bench/measure.py.
Each result splits the CPU: the contender's own (client) and the private broker's over the same span, each
also per input record, and input records per CPU-second of both together.
Results: one table on stdout and ``bench/results/<timestamp>-<format>.json``.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import logging
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo's packages (bench, connectors) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import confluent_kafka
from confluent_kafka import KafkaException

from bench import contenders as contender_catalogue
from bench.contenders import Contender, Epochline, JobSpec, RawCopy
from bench.measure import (
    ContenderFailed,
    LatencyPlan,
    PacedProduce,
    measure_latency,
    read_committed_ids,
    run_to_completion,
    verify_ids,
)
from bench.report import (
    FAILED,
    NOT_AVAILABLE,
    OK,
    Result,
    machine,
    print_table,
    write_json,
)
from bench.workload import (
    FORMATS,
    INPUT_PRODUCER_CONFIG,
    INPUT_SCHEMA,
    OUTPUT_SCHEMA,
    SQL,
    Workload,
    codec,
    generate_input,
    produce_paced,
    write_schema_files,
)
from connectors.admin import (
    KafkaUnreachable,
    TopicAdminError,
    create_topic,
    create_topics,
    delete_topics,
    partitions_of,
)
from engine.logs import configure_logging
from engine.ports import free_port
from engine.testing.local_broker import KAFKA_VERSION, BrokerState, LocalBroker

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO / "bench" / "results"
PARTITIONS = 4
PROJECT_PACKAGES = ("connectors", "engine", "schemas", "sinks", "bench")


def byte_compile_project(checkout: Path = REPO) -> None:
    """Compile the project's modules (of this checkout, or another) to bytecode once, before any contender
    starts.

    Why: an installed package has its ``.pyc`` files, so its processes start without compiling; a checkout
    run with ``PYTHONDONTWRITEBYTECODE`` (or read-only) would compile every module in every contender process
    and count that as start-up. Python reads existing ``.pyc`` files even when it may not write them."""
    for package in PROJECT_PACKAGES:
        compileall.compile_dir(checkout / package, quiet=1)


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[tuple[str, int | None]]:
    """(bootstrap, broker PID): the given address (its PID unknown, so its CPU is not measured), or a private
    local broker that is stopped (by its API) afterwards, also when the harness is sent SIGTERM (by
    ``timeout``, say): Python's default for it would exit without cleaning up and leave the JVM running."""
    if bootstrap:
        yield bootstrap, None
        return
    with private_broker() as state, exit_on_sigterm():
        yield state.bootstrap, state.pid


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM raises SystemExit (exit status 143), so enclosing cleanup runs."""
    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def private_broker() -> Iterator[BrokerState]:
    """A local broker in a temp dir on a free port (its state names its PID), stopped by its API afterwards."""
    data_dir = Path(tempfile.mkdtemp(prefix="epochline-bench-broker-"))
    local = LocalBroker(data_dir)
    state = local.start(port=free_port())
    try:
        yield state
    finally:
        local.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def delete_or_warn(bootstrap: str, topics: list[str]) -> None:
    """Delete ``topics`` (made by a benchmark); a failure is reported on stderr, not raised: the results
    stand, and a cleanup error must not hide the error that ended the run."""
    try:
        delete_topics(bootstrap, topics, timeout=60)
    except (TopicAdminError, KafkaUnreachable) as error:
        print(f"warning: topics of this run are left on {bootstrap}: {error}", file=sys.stderr)


class Bench:
    """One benchmark run: one input topic, then each contender against it, then the report."""

    output_partitions = PARTITIONS  # of every job's output topic; raw-eos copies partition i to partition i

    def __init__(self, args: argparse.Namespace, bootstrap: str, workdir: Path, broker_pid: int | None = None) -> None:
        self.args = args
        self.bootstrap = bootstrap
        self.broker_pid = broker_pid  # the private broker's JVM, whose CPU is measured; None with --bootstrap
        self.workdir = workdir
        self.stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        self.prefix = f"bench-{self.stamp}-{args.format}"
        self.input_schema, self.output_schema = write_schema_files(workdir / "schemas")
        self.topics: list[str] = []
        self.input_id = codec(args.format, INPUT_SCHEMA).decode
        self.output_id = codec(args.format, OUTPUT_SCHEMA).decode
        self.warm_up_rates: list[float] = []

    def topic(self, name: str, partitions: int = PARTITIONS) -> str:
        """Create the topic and wait until its partitions show in metadata (creation is acknowledged first)."""
        full = f"{self.prefix}-{name}"
        create_topic(self.bootstrap, full, partitions)
        self.topics.append(full)
        deadline = time.monotonic() + 30.0
        while True:
            try:
                if len(partitions_of(self.bootstrap, full)) == partitions:
                    return full
            except TopicAdminError:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise TopicAdminError(f"topic {full!r} does not show {partitions} partitions on {self.bootstrap}")
            time.sleep(0.2)

    def job(self, contender: Contender, phase: str, input_topic: str, expected: int, bounded: bool) -> JobSpec:
        workdir = self.workdir / contender.name / phase
        workdir.mkdir(parents=True, exist_ok=True)
        profile_to = None
        if self.args.profile and bounded and isinstance(contender, Epochline):
            profile_to = RESULTS_DIR / f"{self.stamp}-{self.args.format}-{contender.name}-profile.html"
        return JobSpec(
            bootstrap=self.bootstrap, input_topic=input_topic,
            output_topic=self.topic(f"{contender.name}-{phase}-out", partitions=self.output_partitions),
            dead_letter_topic=self.topic(f"{contender.name}-{phase}-dlq", partitions=1),
            format=self.args.format, name=f"{self.prefix}-{contender.name}-{phase}", workdir=workdir,
            input_schema=self.input_schema, output_schema=self.output_schema,
            expected_outputs=expected, bounded=bounded, profile_to=profile_to, producer=dict(self.args.producer),
            consumer=dict(self.args.consumer),
        )

    def id_reader(self, contender: Contender) -> Callable[[bytes], int]:
        decode = self.output_id if contender.transforms else self.input_id
        return lambda value: decode(value)["id"]

    def warm_up(self, input_topic: str, workload: Workload) -> None:
        """Copy the input ``--warm-up-copies`` times, unmeasured, so the first measured contender does not
        pay for a cold broker (JIT, page cache, transaction coordinator): on 2026-12-04 five raw copies in a
        row after one warm-up copy ran at 185k, 211k, 250k, 231k and 236k records/s (bench/README.md, "Run
        order"). Each copy's records/s goes to ``warm_up_rates`` (and the results' meta); outputs are not
        verified, and a failed copy is reported and the run goes on."""
        for copy in range(1, self.args.warm_up_copies + 1):
            job = self.job(RawCopy(), f"warm-up-{copy}", input_topic, workload.records, bounded=True)
            try:
                rate = workload.records / run_to_completion(RawCopy(), job, self.args.timeout).wall_seconds
            except ContenderFailed as failure:
                print(f"  warm-up copy {copy} failed (numbers may include broker warm-up): {failure}")
                continue
            self.warm_up_rates.append(rate)
            print(f"  warm-up copy {copy}: {rate:,.0f} records/s")

    def run_contender(self, contender: Contender, input_topic: str, workload: Workload,
                      run_name: str = "") -> Result:
        """Run ``contender`` over the whole input once, verify its output, measure it (and its latency run).
        ``run_name`` goes into its jobs' names (topics, group, transactional id): a second run of a
        contender needs another."""
        if self.args.format not in contender.formats:
            return Result(contender.name, NOT_AVAILABLE, contender.note,
                          reason=f"not available: {' and '.join(contender.formats)} only")
        reason = contender.unavailable_reason()
        if reason is not None:
            return Result(contender.name, NOT_AVAILABLE, contender.note, reason=reason)
        expected = workload.expected_ids if contender.transforms else workload.all_ids
        result = Result(contender.name, FAILED, contender.note, expected_count=len(expected))
        log.info("contender starting", extra={"contender": contender.name})
        try:
            job = self.job(contender, f"throughput{run_name}", input_topic, len(expected), bounded=True)
            run = run_to_completion(contender, job, self.args.timeout, self.broker_pid)
            verdict = verify_ids(read_committed_ids(self.bootstrap, job.output_topic, self.id_reader(contender)),
                                 expected)
            result.output_count = verdict.output_count
            result.wall_seconds = run.wall_seconds
            result.records_per_s = workload.records / run.wall_seconds
            result.set_cpu(run.usage.cpu_seconds, run.cpu.broker_seconds, workload.records)
            result.peak_rss_mb = run.usage.peak_rss_mb
            if not verdict.ok:
                raise ContenderFailed(verdict.problem)
            if contender.runs_live and not self.args.skip_latency:
                self.measure_latency(contender, result, f"latency{run_name}")
            result.status = OK
        except (ContenderFailed, KafkaException, TopicAdminError) as failure:
            result.reason = f"{failure} (logs: {self.workdir / contender.name})"
        log.info("contender finished", extra={"contender": contender.name, "status": result.status})
        return result

    def run_repeated(self, selected: list[Contender], input_topic: str, workload: Workload) -> list[Result]:
        """Every contender ``--repeat`` times, in ``repetition_order``. One result per contender: its
        median run (``median_run``)."""
        runs: dict[str, list[Result]] = {contender.name: [] for contender in selected}
        for repetition in range(self.args.repeat):
            for contender in repetition_order(selected, repetition):
                started = time.monotonic()
                run_name = "" if repetition == 0 else f"-{repetition + 1}"
                result = self.run_contender(contender, input_topic, workload, run_name)
                runs[contender.name].append(result)
                print(f"  {contender.name}: {result.status} ({time.monotonic() - started:.0f}s)")
        return [median_run(runs[contender.name]) for contender in selected]

    def measure_latency(self, contender: Contender, result: Result, phase: str) -> None:
        plan = LatencyPlan(records=self.args.latency_records, rate=self.args.latency_rate)
        live_input = self.topic(f"{contender.name}-{phase}-in")
        job = self.job(contender, phase, live_input, plan.records, bounded=False)
        latency = measure_latency(contender, job, self.id_reader(contender), plan, self.paced_input(live_input))
        result.latency_p50_ms, result.latency_p99_ms = latency.p50_ms, latency.p99_ms
        result.latency_samples, result.first_output_s = latency.samples, latency.first_output_s

    def paced_input(self, topic: str) -> PacedProduce:
        """Writes rows of this run's format to ``topic`` at a given rate (``bench.workload.produce_paced``)."""
        def produce(ids: range, rate: float, stamps: dict[int, int], until: Callable[[], bool] | None = None) -> None:
            produce_paced(self.bootstrap, topic, self.args.format, ids, rate, stamps, until)

        return produce

    def filler_topics(self, count: int) -> None:
        """``count`` empty one-partition topics, deleted with the run's: the other topics of a shared cluster,
        which a metadata request for every topic grows with."""
        names = [f"{self.prefix}-filler-{number}" for number in range(count)]
        self.topics.extend(names)  # first: those made before a failure are deleted too
        create_topics(self.bootstrap, names, timeout=120)

    def delete_topics(self) -> None:
        """Delete every topic this run made, so a broker given with ``--bootstrap`` keeps none of them."""
        delete_or_warn(self.bootstrap, self.topics)

    def warm_up_meta(self) -> dict[str, object]:
        """How the broker was warmed up and how fast each warm-up copy ran (both benchmarks' results)."""
        return {"broker_warm_up_copies": 0 if self.args.no_warm_up else self.args.warm_up_copies,
                "warm_up_records_per_s": [round(rate) for rate in self.warm_up_rates]}

    def meta(self, workload: Workload) -> dict[str, object]:
        return {
            "timestamp": self.stamp,
            "command": " ".join(sys.argv),
            "format": self.args.format,
            "records": workload.records,
            "expected_outputs": len(workload.expected_ids),
            "input_mean_record_bytes": round(workload.mean_record_bytes, 1),
            "input_produce_seconds": round(workload.produce_seconds, 2),
            "input_partitions": PARTITIONS,
            "input_producer_config": INPUT_PRODUCER_CONFIG,
            "sql": SQL,
            "latency_probe": {"records": self.args.latency_records, "rate_per_s": self.args.latency_rate},
            "epochline_profiled": self.args.profile,
            "epochline_producer": dict(self.args.producer),
            "epochline_consumer": dict(self.args.consumer),
            **self.warm_up_meta(),
            "repeat": self.args.repeat,
            "machine": machine(),
            "versions": versions(),
        }


def repetition_order(selected: list[Contender], repetition: int) -> list[Contender]:
    """The given order, reversed on every second repetition (A B, B A, A B, ...): whatever drifts during a
    run (the broker still warming up, a neighbour's load) then favours no contender. Measured on
    2026-12-04: with the same order every time, the contender right after the warm-up copy was 10-15%
    slower, whichever it was (bench/README.md, "Run order")."""
    return list(selected) if repetition % 2 == 0 else list(reversed(selected))


def median_run(runs: list[Result]) -> Result:
    """A contender's result over its repetitions: the run with the median records/s (the lower middle one
    of an even count), holding every run's records/s, and each latency number as the median (low) of the
    runs that measured it. A run that did not finish OK is the result instead: a failure is never averaged
    away."""
    unfinished = next((run for run in runs if run.status != OK), None)
    if unfinished is not None or len(runs) == 1:
        chosen = unfinished or runs[0]
    else:
        chosen = sorted(runs, key=lambda run: run.records_per_s or 0.0)[(len(runs) - 1) // 2]
        for name in LATENCY_FIELDS:
            measured = [value for run in runs if (value := getattr(run, name)) is not None]
            setattr(chosen, name, statistics.median_low(measured) if measured else None)
    if len(runs) > 1:
        chosen.runs_records_per_s = [run.records_per_s if run.status == OK else None for run in runs]
    return chosen


LATENCY_FIELDS = ("latency_p50_ms", "latency_p99_ms", "latency_samples", "first_output_s")


def versions() -> dict[str, str]:
    found = {"confluent-kafka": confluent_kafka.__version__, "librdkafka": confluent_kafka.libversion()[0]}
    with contextlib.suppress(ImportError), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quixstreams' dependencies warn about their own deprecations
        import quixstreams

        found["quixstreams"] = quixstreams.__version__
    found["kafka-streams"] = KAFKA_VERSION  # kafka-streams-eos runs the broker's version (bench/kafka_streams.py)
    if shutil.which("java"):
        banner = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False).stderr
        found["java"] = (banner.splitlines() or [""])[0]  # 'openjdk version "17.0.15" 2025-04-15'
    if shutil.which("kcat"):
        banner = subprocess.run(["kcat", "-V"], capture_output=True, text=True, check=False).stdout
        # "Version 1.7.1 (JSON, Transactions, ..., librdkafka 2.0.2 builtin.features=...)"
        line = next((text for text in banner.splitlines() if text.startswith("Version")), "")
        librdkafka = next((part.strip() for part in line.split(",") if part.strip().startswith("librdkafka")), "")
        found["kcat"] = f"{line.split(' (')[0].removeprefix('Version ')} ({librdkafka.split(' builtin')[0]})"
    return found


def setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return key, value


def add_warm_up_arguments(parser: argparse.ArgumentParser) -> None:
    """``--no-warm-up`` and ``--warm-up-copies``, for ``Bench.warm_up`` (here and in scale_out.py)."""
    parser.add_argument("--no-warm-up", action="store_true",
                        help="skip the unmeasured raw copies of the input that warm the broker up")
    parser.add_argument("--warm-up-copies", type=int, default=3, metavar="N",
                        help="unmeasured raw copies of the input before the first measured run (default 3)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000, help="input records (default 1M)")
    parser.add_argument("--format", choices=FORMATS, default="json")
    parser.add_argument("--only", nargs="+", choices=list(contender_catalogue.BY_NAME), metavar="NAME",
                        help=f"run only these contenders: {', '.join(contender_catalogue.BY_NAME)}")
    parser.add_argument("--bootstrap", help="use this broker instead of starting a private one")
    parser.add_argument("--timeout", type=float, help="seconds per contender run (default 120 + records/1000)")
    parser.add_argument("--latency-records", type=int, default=2_000, help="probe records per latency run")
    parser.add_argument("--latency-rate", type=float, default=1_000.0, help="probe records per second")
    parser.add_argument("--skip-latency", action="store_true", help="measure throughput only")
    add_warm_up_arguments(parser)
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run the contenders N times, the order reversed every second time; each row "
                             "shows the median run, and the median of each latency number (default 1)")
    parser.add_argument("--profile", action="store_true",
                        help="run the epochline contenders under pyinstrument (HTML next to the results); "
                             "their numbers then include the profiler's overhead")
    parser.add_argument("--keep-logs", action="store_true", help="keep the contenders' logs and configs")
    parser.add_argument("--producer", nargs="+", default=[], metavar="KEY=VALUE", type=setting,
                        help="librdkafka settings for the epochline contenders' sink.producer, e.g. "
                             "compression.type=none linger.ms=20")
    parser.add_argument("--consumer", nargs="+", default=[], metavar="KEY=VALUE", type=setting,
                        help="librdkafka settings for the epochline contenders' source.consumer, e.g. "
                             "max.partition.fetch.bytes=8388608")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.timeout is None:
        args.timeout = 120 + args.records / 1000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(args.log_level)
    selected = [contender_catalogue.BY_NAME[name] for name in args.only] if args.only else contender_catalogue.ALL
    byte_compile_project()
    workdir = Path(tempfile.mkdtemp(prefix="epochline-bench-"))
    with broker(args.bootstrap) as (bootstrap, broker_pid):
        bench = Bench(args, bootstrap, workdir, broker_pid)
        try:
            input_topic = bench.topic("input")
            print(f"writing {args.records:,} {args.format} records to {input_topic} on {bootstrap} ...")
            workload = generate_input(bootstrap, input_topic, args.records, args.format)
            print(f"  {workload.produce_seconds:.1f}s, {workload.mean_record_bytes:.0f} bytes/record, "
                  f"{len(workload.expected_ids):,} pass the filter")
            if not args.no_warm_up:
                bench.warm_up(input_topic, workload)
            results = bench.run_repeated(selected, input_topic, workload)
            meta = bench.meta(workload)
        finally:
            if args.bootstrap:
                bench.delete_topics()
    print_table(results, f"epochline bench: {args.records:,} {args.format} records, {PARTITIONS} partitions")
    output = RESULTS_DIR / f"{bench.stamp}-{args.format}.json"
    write_json(output, meta, results)
    print(f"results: {output}")
    failed = [r for r in results if r.status == FAILED]
    if failed or args.keep_logs:
        print(f"contender logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
