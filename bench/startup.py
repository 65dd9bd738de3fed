"""Start-up to the first committed output, many times, with where the time went.

    python bench/startup.py [--starts 10] [--format json] [--baseline DIR | --warm] [--cluster-topics N]
                            [--bootstrap HOST:PORT]

Each start runs the benchmark's epochline job (``epochline-eos``: JSON or Avro in, the SQL filter and
projection, exactly-once out, 1 s checkpoints) on fresh topics of its own while warm-up rows are written to
its input every 20 ms, and times from the process start to the first output row a ``read_committed``
reader sees (``bench.measure.time_first_output``, the number ``bench/run.py`` reports as "first output").
The connector's own log lines then say when each step of its start happened (``PHASES``: "started" is its
first line, once the modules are imported and the config read), and a second, idle interpreter importing
what ``epochline run`` imports (``python -m engine.cli run --help``) tells how fast the machine is at that
moment; this machine's speed has changed by 2x within an hour, so they are taken together, start after
start.

``--baseline DIR`` alternates every start with one of another checkout of this repository (its packages
put first on ``PYTHONPATH``): an old commit and the new one under the same drift. ``--warm`` alternates a
cold start with one handed to a warm task process (``engine.worker.warm``, what a worker starts its tasks
in), timed from the hand-off once that process has imported a task's modules. ``--cluster-topics N``
first makes N empty topics, as a shared cluster has (what a start asks of every topic grows with them).
Without ``--bootstrap`` a private broker is started and stopped; topics made are deleted at the end.
Results: a table on stdout and ``bench/results/<timestamp>-startup-<format>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo's packages (bench, connectors) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.contenders import BY_NAME
from bench.measure import ChildProcess, LatencyPlan, OutputTailer, log_records, time_first_output
from bench.report import machine
from bench.run import RESULTS_DIR, Bench, broker, byte_compile_project, versions
from bench.workload import FORMATS

PHASES: Mapping[str, str] = {
    "connector starting": "started",  # imports done, config loaded: the engine's first line
    "transactional producer ready": "fenced",
    "source subscribed": "subscribed",
    "partitions assigned": "assigned",
    "barrier": "first barrier",
    "checkpoint committed": "first commit",
}
"""Log events of a start (the first of each) and the column each one's time goes to."""

CONTENDER = "epochline-eos"


@dataclass
class Start:
    """One start: seconds from the process start (a warm one's: the hand-off) to its first output and to
    each phase it logged, and the import time an idle interpreter measured right before it."""

    code: str  # "this" or "baseline"
    first_output_s: float
    imports_s: float
    phases_s: dict[str, float] = field(default_factory=dict)


def phase_times(log_path: Path, started_at: float) -> dict[str, float]:
    """Seconds from ``started_at`` (wall clock) to the first log line of each event in ``PHASES``; the log
    is the connector's JSON lines (``ts`` in epoch seconds), other lines skipped."""
    times: dict[str, float] = {}
    for record in log_records(log_path):
        column = PHASES.get(record.get("event", ""))
        if column is not None and column not in times:
            times[column] = round(record["ts"] - started_at, 3)
    return times


def import_seconds(env: Mapping[str, str], cwd: Path) -> float:
    """Wall time of ``python -m engine.cli run --help``: the interpreter and the modules a run imports,
    nothing else (no config, no Kafka). ``cwd`` must not hold the repository's packages: ``-m`` puts it
    first on the module path, before a baseline's ``PYTHONPATH``."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "engine.cli", "run", "--help"], env=dict(env), cwd=cwd,
                   capture_output=True, check=True, timeout=60)
    return time.monotonic() - started


def code_environment(checkout: Path | None) -> dict[str, str]:
    """The environment of a start: this checkout's packages (as installed), or ``checkout``'s put first."""
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout), env.get("PYTHONPATH")]))
    return env


WARM = "warm"
"""The code of a start handed to a warm task process (``--warm``)."""


def time_one_start(bench: Bench, index: int, code: str, env: Mapping[str, str]) -> Start:
    """The job on fresh topics of its own, started once and stopped after its first output."""
    contender = BY_NAME[CONTENDER]
    live_input = bench.topic(f"start-{index}-in")
    job = bench.job(contender, f"start-{index}", live_input, expected=1, bounded=False)
    imports_s = import_seconds(env, job.workdir)
    tailer = OutputTailer(job.bootstrap, job.output_topic, id_of=bench.id_reader(contender))
    tailer.start()
    log_path = job.workdir / "contender.log"
    child = ChildProcess(contender.command(job), log_path, job.workdir, env=env, warm=code == WARM)
    try:
        first_output_s = time_first_output(child, tailer, job, LatencyPlan(), bench.paced_input(live_input))
    finally:
        child.stop(grace=30.0)
        tailer.halt()
    return Start(code, round(first_output_s, 3), round(imports_s, 3), phase_times(log_path, child.started_at))


def alternating(codes: Mapping[str, Mapping[str, str]], starts: int) -> list[tuple[str, Mapping[str, str]]]:
    """``starts`` starts of each code, in rounds whose order flips every round (A B, B A, ...), so a drift of
    the machine's speed favours neither."""
    rounds = [list(codes.items()) if index % 2 == 0 else list(reversed(codes.items())) for index in range(starts)]
    return [entry for order in rounds for entry in order]


FROM_STARTED = "from started"
"""The column of each start's own first output less its ``started``: the engine's part, which the machine's
speed of the moment (most of all the imports) moves much less than the absolute times."""


def summary(starts: Sequence[Start]) -> dict[str, float]:
    """The median of each column over ``starts``."""
    columns = {"first output": [s.first_output_s for s in starts], "imports": [s.imports_s for s in starts]}
    for column in PHASES.values():
        columns[column] = [s.phases_s[column] for s in starts if column in s.phases_s]
    columns[FROM_STARTED] = [s.first_output_s - s.phases_s["started"] for s in starts if "started" in s.phases_s]
    return {column: round(statistics.median(values), 3) for column, values in columns.items() if values}


def print_summary(by_code: Mapping[str, Sequence[Start]]) -> None:
    columns = ["first output", "imports", *PHASES.values(), FROM_STARTED]
    print("median seconds from the process start, or the hand-off to a warm process (imports: an idle "
          "`epochline run --help`; from started: from the start's own first log line)")
    print(f"{'code':<10}{'starts':>7}" + "".join(f"{column:>15}" for column in columns))
    for code, starts in by_code.items():
        medians = summary(starts)
        print(f"{code:<10}{len(starts):>7}" + "".join(f"{medians.get(column, float('nan')):>15.3f}"
                                                      for column in columns))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=10, help="starts of each checkout (default 10)")
    parser.add_argument("--format", choices=FORMATS, default="json")
    compared = parser.add_mutually_exclusive_group()
    compared.add_argument("--baseline", type=Path, help="another checkout whose starts alternate with this one's")
    compared.add_argument("--warm", action="store_true",
                          help="alternate cold starts with starts handed to a warm task process")
    parser.add_argument("--cluster-topics", type=int, default=0, help="empty topics made first (default 0)")
    parser.add_argument("--bootstrap", help="use this broker instead of starting a private one")
    parser.add_argument("--keep-logs", action="store_true", help="keep the starts' logs and configs")
    args = parser.parse_args(argv)
    # What bench.run.Bench reads from its arguments: no extra client settings, no profile.
    args.producer, args.consumer, args.profile = {}, {}, False
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    byte_compile_project()
    codes = {"this": code_environment(None)}
    if args.warm:
        codes = {"cold": codes["this"], WARM: codes["this"]}
    elif args.baseline is not None:
        byte_compile_project(args.baseline)
        codes["baseline"] = code_environment(args.baseline.resolve())
    workdir = Path(tempfile.mkdtemp(prefix="epochline-startup-"))
    starts: dict[str, list[Start]] = {code: [] for code in codes}
    with broker(args.bootstrap) as (bootstrap, broker_pid):
        bench = Bench(args, bootstrap, workdir, broker_pid)
        try:
            bench.filler_topics(args.cluster_topics)
            for number, (code, env) in enumerate(alternating(codes, args.starts)):
                start = time_one_start(bench, number, code, env)
                starts[code].append(start)
                print(f"  {code}: first output {start.first_output_s:.3f} s, imports {start.imports_s:.3f} s, "
                      + ", ".join(f"{column} {seconds:.3f}" for column, seconds in start.phases_s.items()))
        finally:
            bench.delete_topics()
    print_summary(starts)
    output = RESULTS_DIR / f"{bench.stamp}-startup-{args.format}.json"
    output.write_text(json.dumps({
        "meta": {"timestamp": bench.stamp, "command": " ".join(sys.argv), "format": args.format,
                 "contender": CONTENDER, "cluster_topics": args.cluster_topics, "warm": args.warm,
                 "machine": machine(),
                 "versions": versions()},
        "medians": {code: summary(runs) for code, runs in starts.items()},
        "starts": [asdict(start) for runs in starts.values() for start in runs],
    }, indent=2) + "\n")
    print(f"results: {output}")
    if args.keep_logs:
        print(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
