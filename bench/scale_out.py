"""Scaling out on one machine: the epochline exactly-once job of bench/run.py on 1, 2 (and 3) instances.

    python bench/scale_out.py [--records 500000] [--instances 1 2 [3]] [--repeat 1] [--no-raw] [--bootstrap HOST:PORT]

One 6-partition input topic with N records (the JSON rows and SQL of bench/run.py). For each instance count
k: a fresh output topic, dead-letter topic, connector name (so a fresh consumer group) and state dir; then k
``epochline run CONFIG --instance iN --stop-at-end`` processes are started at once. They share the input's
partitions through the connector's consumer group, each with its own transactional producer, and each exits
0 once the group committed everything up to the end offsets captured at its start.

Measured per k (bench/measure.py's process helpers; nothing here runs inside a contender's process):

- **wall s**: from just before the first process is started to the last one's exit; **records/s** = N / that.
  Also **visible s**: until the last expected output record was visible to a ``read_committed`` reader,
  the window bench/run.py uses (an instance exits up to about a second later: it learns that the *group*
  is done from the committed offsets, which it asks for at most once a second).
- **client CPU**: user+sys of every instance process from ``wait4`` (their rusage), summed; also per input
  record. **peak RSS** per process (its ``VmHWM``, see ``bench.measure``).
- **broker CPU**: user+sys of the private broker's JVM over the same window, from ``/proc/<pid>/stat``
  (not measured with ``--bootstrap``). **machine busy**: the share of all cores' time that was not idle over
  the window (``/proc/stat``): everything on the machine, including the harness's tailer and other users.

Each k's output is verified with ``read_committed`` before its numbers count: every expected id exactly once
(bench/measure.verify_ids). Results: a table on stdout and ``bench/results/<timestamp>-scale-out-<format>.json``.

Before the instance counts of each repetition, bench/run.py's ``raw-eos`` (one confluent-kafka transactional
copy loop) copies the same input (``--no-raw`` leaves it out), so each run's "vs raw-eos" compares records/s
(visible) with the Python ceiling measured minutes apart on the same topic and broker.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo's packages (bench, connectors) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson
from confluent_kafka import KafkaException
from rich.console import Console
from rich.table import Table

from bench.contenders import Epochline, JobSpec, RawCopy
from bench.measure import (
    ChildProcess,
    ContenderFailed,
    CpuWindow,
    OutputTailer,
    log_records,
    read_committed_ids,
    verify_ids,
)
from bench.report import FAILED, OK, Result, machine
from bench.run import RESULTS_DIR, Bench, add_warm_up_arguments, broker, byte_compile_project, setting, versions
from bench.workload import FORMATS, INPUT_PRODUCER_CONFIG, SQL, Workload, generate_input
from connectors.admin import TopicAdminError, end_offsets
from engine.logs import configure_logging

INPUT_PARTITIONS = 6


@dataclass
class InstanceUsage:
    """One instance process: when it exited (seconds after the start) and its own rusage."""

    name: str
    exit_code: int
    exited_after_s: float
    cpu_seconds: float
    peak_rss_mb: float
    log: str
    assignments: list[str] = field(default_factory=list)  # "+0,1,2 @0.4s", "-2 @1.3s" from its log
    assigned_after_s: list[float] = field(default_factory=list)  # when it was given partitions
    left_after_s: float | None = None  # its last revocation: leaving the group at the end


@dataclass
class ScaleResult:
    """One run of k instances; the numbers are None when it failed before they were measured."""

    instances: int
    run: int
    status: str = FAILED
    reason: str = ""
    expected_count: int = 0
    output_count: int | None = None
    wall_seconds: float | None = None
    records_per_s: float | None = None
    visible_seconds: float | None = None
    visible_records_per_s: float | None = None
    client_cpu_seconds: float | None = None
    client_cpu_us_per_record: float | None = None
    peak_rss_mb: float | None = None  # the largest of the instances'
    settled_seconds: float | None = None  # the group's last assignment before an instance left: its final shape
    broker_cpu_seconds: float | None = None
    harness_cpu_seconds: float | None = None
    machine_busy_share: float | None = None
    per_instance: list[InstanceUsage] = field(default_factory=list)


def assignment_changes(log_path: Path, started: float, topic: str) -> tuple[list[str], list[float], float | None]:
    """The instance's partition assignments and revocations of ``topic``, from its JSON log lines, as
    ``+0,1,2 @0.4s`` / ``-2 @1.3s`` (seconds after the start; a line that is not JSON is skipped), the
    times it was assigned partitions, and the time of its last revocation (when it left, at the end)."""
    changes: list[str] = []
    assigned: list[float] = []
    left = None
    for record in log_records(log_path):
        if record.get("topic") != topic:
            continue
        if record.get("event") == "partitions assigned":
            sign, partitions = "+", sorted(int(p) for p in record.get("offsets", {}))
        elif record.get("event") == "partitions revoked":
            sign, partitions = "-", sorted(record.get("partitions", []))
        else:
            continue
        at = float(record.get("ts", started)) - started
        changes.append(f"{sign}{','.join(map(str, partitions))} @{at:.1f}s")
        if sign == "+":
            assigned.append(round(at, 3))
        else:
            left = round(at, 3)
    return changes, assigned, left


def settled_after(usages: list[InstanceUsage]) -> float | None:
    """When the group took its final shape: the last assignment before the first instance left. What the
    leaving instances hand over at the end is the group shrinking, not settling."""
    departures = [usage.left_after_s for usage in usages if usage.left_after_s is not None]
    first_left = min(departures, default=float("inf"))
    return max((at for usage in usages for at in usage.assigned_after_s if at < first_left), default=None)


def run_instances(contender: Epochline, job: JobSpec, count: int,
                  timeout: float) -> tuple[float, float | None, list[InstanceUsage]]:
    """Start ``count`` instances of the job's connector at once and wait until every one has exited 0.

    Returns (seconds to the last exit, seconds until all expected output was visible under read_committed,
    each instance's usage). An instance exiting non-zero, or the timeout, stops the others and raises
    ContenderFailed."""
    tailer = OutputTailer(job.bootstrap, job.output_topic, target=job.expected_outputs)
    tailer.start()
    command = contender.command(job)  # writes the config once; every instance runs the same file
    names = [f"i{n}" for n in range(1, count + 1)]
    started = time.time()
    children = {name: ChildProcess([*command, "--instance", name], job.workdir / f"{name}.log", job.workdir)
                for name in names}
    exited: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(exited) < count:
            for name, child in children.items():
                if name not in exited and child.poll() is not None:
                    exited[name] = time.time() - started
                    if child.usage.exit_code != 0:
                        raise ContenderFailed(f"instance {name} exited with code {child.usage.exit_code} after "
                                              f"{tailer.count} of {job.expected_outputs} outputs; see "
                                              f"{job.workdir / f'{name}.log'}")
            if time.monotonic() > deadline:
                raise ContenderFailed(f"timed out after {timeout:.0f}s: {len(exited)} of {count} instances "
                                      f"exited, {tailer.count} of {job.expected_outputs} outputs committed")
            time.sleep(0.05)
        wall = max(exited.values())
        settle = time.monotonic() + 5.0  # the tailer may still be reading the last committed records
        while tailer.target_reached_at is None and time.monotonic() < settle:
            time.sleep(0.05)
    finally:
        for child in children.values():
            child.stop(grace=5.0)
        tailer.halt()
    visible = tailer.target_reached_at - started if tailer.target_reached_at is not None else None
    usages = [InstanceUsage(name, child.usage.exit_code, round(exited[name], 3), child.usage.cpu_seconds,
                            child.usage.peak_rss_mb, str(job.workdir / f"{name}.log"),
                            *assignment_changes(job.workdir / f"{name}.log", started, job.input_topic))
              for name, child in children.items()]
    return wall, visible, usages


def measure(bench: Bench, contender: Epochline, input_topic: str, workload: Workload, count: int,
            run: int) -> ScaleResult:
    expected = workload.expected_ids
    result = ScaleResult(count, run, expected_count=len(expected))
    try:
        job = bench.job(contender, f"x{count}-r{run}", input_topic, len(expected), bounded=True)
        window = CpuWindow(bench.broker_pid)
        wall, visible, usages = run_instances(contender, job, count, bench.args.timeout)
        cpu = window.close()
        result.broker_cpu_seconds, result.harness_cpu_seconds = cpu.broker_seconds, cpu.harness_seconds
        result.machine_busy_share = cpu.machine_busy_share
        result.per_instance = usages
        result.wall_seconds, result.visible_seconds = wall, visible
        result.records_per_s = workload.records / wall
        result.visible_records_per_s = workload.records / visible if visible else None
        result.client_cpu_seconds = sum(usage.cpu_seconds for usage in usages)
        result.client_cpu_us_per_record = result.client_cpu_seconds / workload.records * 1e6
        result.peak_rss_mb = max(usage.peak_rss_mb for usage in usages)
        result.settled_seconds = settled_after(usages)
        verdict = verify_ids(read_committed_ids(bench.bootstrap, job.output_topic, bench.id_reader(contender)),
                             expected)
        result.output_count = verdict.output_count
        if not verdict.ok:
            raise ContenderFailed(verdict.problem)
        result.status = OK
    except (ContenderFailed, KafkaException, TopicAdminError) as failure:
        result.reason = f"{failure} (logs: {bench.workdir / contender.name})"
    return result


def _number(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def render_table(results: list[ScaleResult], title: str, raw: dict[int, Result] | None = None) -> Table:
    """One row per run; records/s also as a ratio to the single instance's of the same repetition, and
    records/s (visible) to that repetition's raw-eos copy (``raw``, by repetition) when it ran."""
    table = Table(title=title, caption="wall = start to the last instance's exit; visible = start to the last "
                                       "output record visible under read_committed; group settled = start to the "
                                       "group's last partition assignment before an instance left; CPU = user+sys")
    for column in ("instances", "status", "wall s", "records/s", "visible s", "records/s (visible)",
                   "vs raw-eos", "group settled s", "client CPU s", "CPU µs/record", "peak RSS MB (each)",
                   "broker CPU s", "machine busy"):
        table.add_column(column, justify="left" if column == "status" else "right")
    singles = {r.run: r for r in results if r.instances == 1 and r.status == OK}
    raw = raw or {}
    for result in results:
        single = singles.get(result.run)
        rate = _number(result.records_per_s, "{:,.0f}")
        if single and result.records_per_s and result.instances != 1:
            rate += f" ({result.records_per_s / single.records_per_s:.2f}x)"
        style = "green" if result.status == OK else "bold red"
        table.add_row(
            str(result.instances), f"[{style}]{result.status}[/]" + (f" {result.reason}" if result.reason else ""),
            _number(result.wall_seconds, "{:.2f}"), rate, _number(result.visible_seconds, "{:.2f}"),
            _number(result.visible_records_per_s, "{:,.0f}"),
            _number(_ratio(result.visible_records_per_s, raw.get(result.run)), "{:.2f}x"),
            _number(result.settled_seconds, "{:.1f}"),
            _number(result.client_cpu_seconds, "{:.1f}"),
            _number(result.client_cpu_us_per_record, "{:.1f}"),
            " / ".join(f"{usage.peak_rss_mb:.0f}" for usage in result.per_instance) or "-",
            _number(result.broker_cpu_seconds, "{:.1f}"), _number(result.machine_busy_share, "{:.0%}"),
        )
    return table


def _ratio(records_per_s: float | None, raw: Result | None) -> float | None:
    if records_per_s is None or raw is None or raw.status != OK or not raw.records_per_s:
        return None
    return records_per_s / raw.records_per_s


def render_instances(results: list[ScaleResult]) -> Table:
    """Each instance of each run: when it exited, its own CPU and RSS, and the partitions it was given."""
    table = Table(title="per instance", caption="partitions: +assigned / -revoked, seconds after the start")
    for column in ("instances", "run", "instance", "exit", "exited after s", "CPU s", "peak RSS MB", "partitions"):
        table.add_column(column, justify="left" if column == "partitions" else "right")
    for result in results:
        for usage in result.per_instance:
            table.add_row(str(result.instances), str(result.run), usage.name, str(usage.exit_code),
                          f"{usage.exited_after_s:.2f}", f"{usage.cpu_seconds:.1f}", f"{usage.peak_rss_mb:.0f}",
                          "  ".join(usage.assignments) or "-")
    return table


def meta(bench: Bench, contender: Epochline, workload: Workload,
         load_before: tuple[float, float, float]) -> dict[str, object]:
    return {
        "benchmark": "scale_out",
        "timestamp": bench.stamp,
        "command": " ".join(sys.argv),
        "format": bench.args.format,
        "records": workload.records,
        "expected_outputs": len(workload.expected_ids),
        "input_mean_record_bytes": round(workload.mean_record_bytes, 1),
        "input_produce_seconds": round(workload.produce_seconds, 2),
        "input_partitions": INPUT_PARTITIONS,
        "input_records_per_partition": {str(partition): end for partition, end
                                        in sorted(end_offsets(bench.bootstrap, bench.topics[0]).items())},
        "input_producer_config": INPUT_PRODUCER_CONFIG,
        "sql": SQL,
        "contender": {"name": contender.name, "delivery": contender.delivery, "note": contender.note,
                      "source_consumer_settings": dict(bench.args.consumer)},
        "instance_counts": bench.args.instances,
        "repeat": bench.args.repeat,
        "broker": "private local broker" if not bench.args.bootstrap else bench.bootstrap,
        **bench.warm_up_meta(),
        "machine": machine(),  # its load average is read after the runs; this one before the input was written:
        "load_average_before": load_before,
        "versions": versions(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=500_000, help="input records (default 500k)")
    parser.add_argument("--instances", type=int, nargs="+", default=[1, 2], metavar="K",
                        help="instance counts to run, in this order (default: 1 2; add 3 for three)")
    parser.add_argument("--repeat", type=int, default=1, help="run the instance counts this many times, in turn")
    parser.add_argument("--format", choices=FORMATS, default="json")
    parser.add_argument("--bootstrap", help="use this broker instead of starting a private one "
                                            "(broker CPU is then not measured)")
    parser.add_argument("--timeout", type=float, help="seconds per run (default 120 + records/1000)")
    add_warm_up_arguments(parser)
    parser.add_argument("--consumer", nargs="+", default=[], metavar="KEY=VALUE", type=setting,
                        help="librdkafka settings for the instances' source consumer (source.consumer), e.g. "
                             "heartbeat.interval.ms=500; default: epochline's own")
    parser.add_argument("--no-raw", action="store_true",
                        help="leave out the raw-eos copy of the input that each repetition starts with")
    parser.add_argument("--keep-logs", action="store_true", help="keep the instances' logs and configs")
    parser.add_argument("--log-level", default="WARNING")
    # Bench.job and Bench.run_contender ask: never profiled, the default sink producer, no latency run
    parser.set_defaults(profile=False, producer=[], skip_latency=True)
    args = parser.parse_args(argv)
    if args.timeout is None:
        args.timeout = 120 + args.records / 1000
    if any(k < 1 or k > INPUT_PARTITIONS for k in args.instances):
        parser.error(f"--instances: each count must be 1..{INPUT_PARTITIONS} (the input's partitions)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(args.log_level)
    contender = Epochline("epochline-eos", "exactly-once")
    reason = contender.unavailable_reason()
    if reason is not None:
        print(f"epochline: {reason}", file=sys.stderr)
        return 2
    byte_compile_project()
    load_before = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="epochline-scale-out-"))
    results: list[ScaleResult] = []
    raw: dict[int, Result] = {}
    with broker(args.bootstrap) as (bootstrap, broker_pid):
        bench = Bench(args, bootstrap, workdir, broker_pid)
        bench.output_partitions = INPUT_PARTITIONS
        try:
            input_topic = bench.topic("input", partitions=INPUT_PARTITIONS)
            print(f"writing {args.records:,} {args.format} records to {input_topic} ({INPUT_PARTITIONS} "
                  f"partitions) on {bootstrap} ...")
            workload = generate_input(bootstrap, input_topic, args.records, args.format,
                                      spread_over=INPUT_PARTITIONS)
            print(f"  {workload.produce_seconds:.1f}s, {workload.mean_record_bytes:.0f} bytes/record, "
                  f"{len(workload.expected_ids):,} pass the filter")
            if not args.no_warm_up:
                bench.warm_up(input_topic, workload)
            for run in range(1, args.repeat + 1):
                if not args.no_raw:
                    raw[run] = bench.run_contender(RawCopy(), input_topic, workload, run_name=f"-r{run}")
                    print(f"  raw-eos, run {run}: {raw[run].status} {_number(raw[run].records_per_s, '{:,.0f}')} "
                          f"records/s {raw[run].reason}".rstrip())
                for count in args.instances:
                    started = time.monotonic()
                    results.append(measure(bench, contender, input_topic, workload, count, run))
                    print(f"  {count} instance(s), run {run}: {results[-1].status} "
                          f"({time.monotonic() - started:.0f}s)")
            info = meta(bench, contender, workload, load_before)
        finally:
            if args.bootstrap:
                bench.delete_topics()
    Console(width=200).print(render_table(
        results, f"epochline scale-out: {args.records:,} {args.format} records, {INPUT_PARTITIONS} partitions, "
                 f"{os.cpu_count()} CPUs shared with the broker", raw))
    Console(width=200).print(render_instances(results))
    output = RESULTS_DIR / f"{bench.stamp}-scale-out-{args.format}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(orjson.dumps({"meta": info, "results": [asdict(r) for r in results],
                                     "raw_eos": {str(run): asdict(result) for run, result in raw.items()}},
                                    option=orjson.OPT_INDENT_2))
    print(f"results: {output}")
    failed = [r for r in results if r.status != OK] + [r for r in raw.values() if r.status != OK]
    if failed or args.keep_logs:
        print(f"instance logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
