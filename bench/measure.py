"""Running one contender and measuring it: wall time to committed output, CPU, peak RSS, latency.

Methods (they are what the numbers mean):

- **records/s** = input records / (time the last expected output record became visible to a
  ``read_committed`` reader − time the contender's process was started). Process start-up (interpreter,
  imports, group join) is inside the window, as a user running the job would see it.
- **Client CPU seconds** come from ``os.wait4`` on the contender's process: user+sys of the process and
  every descendant it waited for.
- **Peak RSS** is the largest ``VmHWM`` (the kernel's resident-set high-water mark of the process) read from
  ``/proc/<pid>/status`` each time the harness polls the process (every 50-100 ms) until it exits. Not
  ``wait4``'s ``ru_maxrss``: Python starts the child with ``vfork``, and the kernel then counts the
  *harness's* peak resident set, recorded when the child execs, in the child's ``ru_maxrss`` (the harness
  holds every expected id, so after a 10M-record run that read 1.5 GB for a 300 MB contender). Growth in the
  last poll interval before the process exits can be missed; the contender's own children are not counted.
- **Broker CPU seconds** (``CpuWindow``): user+sys of the private broker's JVM, read from ``/proc/<pid>/stat``
  just before the contender's process is started and again once it has been reaped, i.e. over the same span
  as its client CPU. They include the broker's work for the harness's ``read_committed`` tailer, the same for
  every contender. Unknown (None) for a broker the harness did not start (``--bootstrap``).
- **Latency** is measured in a second, live run of the contender on fresh topics: after a warm-up record
  makes it through, probe records are produced at a steady rate; a record's latency is the time a
  ``read_committed`` tailer (in the harness) receives its output minus the record's producer timestamp
  (CreateTime from the delivery report). Both clocks are this machine's wall clock.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from bench.contenders import Contender, JobSpec
from connectors.admin import end_offsets, partitions_of
from connectors.fetched import make_fetcher, ready_messages
from connectors.source import FETCH_DEFAULTS
from engine.worker.warm import hand_off, start_cold, start_warm

log = logging.getLogger(__name__)


class ContenderFailed(RuntimeError):
    """The contender lost or duplicated records, exited with an error, or ran past its timeout."""


@dataclass
class Usage:
    cpu_seconds: float
    peak_rss_mb: float
    exit_code: int


class ChildProcess:
    """A contender process in its own session, reaped with ``wait4`` so its resource usage is its own."""

    def __init__(self, command: list[str], log_path: Path, cwd: Path, env: Mapping[str, str] | None = None,
                 *, warm: bool = False) -> None:
        """``warm``: ``command`` is handed to a warm task process (``engine.worker.warm``, what a worker starts
        its tasks in) once that has imported a task's modules and gone idle; ``started_at`` is the hand-off."""
        environment = env if env is not None else os.environ
        if warm:
            self.process = start_warm(command[0], environment, log_path, cwd=cwd)
            wait_until_idle(self.process.pid)
            self.started_at = time.time()
            hand_off(self.process, command[1:], {}, log_path)
        else:
            self.started_at = time.time()  # wall clock, like the tailer's arrival times
            self.process = start_cold(command, environment, log_path, cwd=cwd)
        self.usage: Usage | None = None
        self._peak_rss_kb = 0

    def poll(self) -> Usage | None:
        """The usage once the process has exited (reaping it), else None. Samples its peak RSS first."""
        if self.usage is None:
            self._peak_rss_kb = max(self._peak_rss_kb, resident_high_water_kb(self.process.pid))
            pid, status, rusage = os.wait4(self.process.pid, os.WNOHANG)
            if pid == self.process.pid:
                self.process.returncode = os.waitstatus_to_exitcode(status)
                self.usage = Usage(rusage.ru_utime + rusage.ru_stime, self._peak_rss_kb / 1024,
                                   self.process.returncode)
        return self.usage

    def wait(self, timeout: float) -> Usage | None:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.usage

    def stop(self, grace: float) -> Usage:
        """SIGTERM the process group (a graceful stop), SIGKILL it after ``grace`` seconds."""
        for signum, wait_for in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            if self.poll() is not None:
                break
            os.killpg(self.process.pid, signum)
            self.wait(wait_for)
        if self.usage is None:
            raise ContenderFailed(f"process {self.process.pid} survived SIGKILL")
        return self.usage


class OutputTailer(threading.Thread):
    """Reads an output topic from the beginning under ``read_committed`` and counts what becomes visible.

    ``target_reached_at`` is the wall-clock time the count first reached ``target``. With ``id_of`` it
    also decodes each value's id and records when each id arrived (latency probes); without, it counts
    through epochline's C reader (``connectors.fetched.make_fetcher``; confluent-kafka's ``consume`` when the
    module is not built), with no Python object per record. Why: an exactly-once contender's epoch becomes
    visible all at once at its commit, and counting it one ``Message`` at a time took the tailer about 1 µs
    per record after the commit (0.49 s for a 500,000-record transaction, 2026-12-04), time that counted as
    the contender's, in proportion to its last epoch's size, while an at-least-once contender's records
    were counted as they came (bench/README.md, "The tailer's own time").
    """

    def __init__(self, bootstrap: str, topic: str, target: int = 0,
                 id_of: Callable[[bytes], int] | None = None, read_wait_s: float = 0.05) -> None:
        super().__init__(name=f"tail-{topic}", daemon=True)
        self.read_wait_s = read_wait_s  # how long one read waits for a first record (then it returns at once)
        self.count = 0
        self.target = target
        self.target_reached_at: float | None = None
        self.arrivals: dict[int, float] = {}
        self._id_of = id_of
        self._halt = threading.Event()
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"{topic}-tailer", "enable.auto.commit": False,
            "isolation.level": "read_committed", "fetch.wait.max.ms": 10,
            # Fetching like the contenders do: right after an exactly-once contender's commit a whole epoch
            # becomes visible at once, and the tailer's own prefetch pauses must not be the last step.
            **FETCH_DEFAULTS,
        })
        partitions = partitions_of(bootstrap, topic)
        self._consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        self._fetcher = make_fetcher(self._consumer, topic, TAIL_BATCH) if id_of is None else None
        if self._fetcher is not None:
            self._fetcher.attach(partitions)

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                self.count += self._take()
                if self.target_reached_at is None and self.target and self.count >= self.target:
                    self.target_reached_at = time.time()
        finally:
            if self._fetcher is not None:
                self._fetcher.close()
            self._consumer.close()

    def _take(self) -> int:
        """Records that became visible since the last call (waiting up to ``read_wait_s`` for the first)."""
        if self._fetcher is not None:
            return len(self._fetcher.fetch(self.read_wait_s).records)
        # Returns at the first record: until 2026-12-04 a ``consume(TAIL_BATCH, 0.05)`` here waited for a full
        # batch or the whole timeout, and every arrival stamp was up to 50 ms late.
        messages = ready_messages(self._consumer, TAIL_BATCH, self.read_wait_s)
        arrived = time.time()
        taken = 0
        for message in messages:
            if message.error() is None:
                taken += 1
                if self._id_of is not None:
                    self.arrivals.setdefault(self._id_of(message.value()), arrived)
        return taken

    def halt(self) -> None:
        self._halt.set()
        self.join(10.0)


TAIL_BATCH = 10_000
"""Records the tailer takes per read."""


@dataclass
class Verdict:
    ok: bool
    output_count: int
    problem: str = ""


def read_committed_ids(bootstrap: str, topic: str, id_of: Callable[[bytes], int]) -> list[int]:
    """Every id a ``read_committed`` reader sees in ``topic``, up to the last stable offsets."""
    ends = end_offsets(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-verify",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    partitions = [TopicPartition(topic, p) for p, end in ends.items() if end > 0]
    consumer.assign([TopicPartition(topic, tp.partition, OFFSET_BEGINNING) for tp in partitions])
    ids: list[int] = []
    try:
        while partitions and any(tp.offset < ends[tp.partition] for tp in consumer.position(partitions)):
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                if message.error() is None:
                    ids.append(id_of(message.value()))
    finally:
        consumer.close()
    return ids


def verify_ids(seen: list[int], expected: set[int] | range) -> Verdict:
    """Each expected id exactly once and nothing else: a lost or duplicated record fails the run."""
    counts = Counter(seen)
    duplicated = sum(1 for n in counts.values() if n > 1)
    missing = sum(1 for i in expected if i not in counts)
    unexpected = sum(1 for i in counts if i not in expected)
    if duplicated or missing or unexpected or len(seen) != len(expected):
        problem = (f"{len(seen)} records for {len(expected)} expected: {missing} ids missing, "
                   f"{duplicated} duplicated, {unexpected} unexpected")
        return Verdict(False, len(seen), problem)
    return Verdict(True, len(seen))


@dataclass
class ThroughputRun:
    wall_seconds: float
    usage: Usage
    cpu: CpuSpan  # from just before the process was started until it was reaped


def run_to_completion(contender: Contender, job: JobSpec, timeout: float,
                      broker_pid: int | None = None) -> ThroughputRun:
    """Start the contender on the backlog and return once all expected output is committed and it stopped.

    A contender that stops on its own (end of input, Quix's ``count``) is given 60 s to exit after its
    output is complete; then it is stopped with SIGTERM. Fewer outputs than expected by the deadline, or
    an exit before them, raise ContenderFailed. ``broker_pid``: the private broker, whose CPU over the
    contender's lifetime is measured (``CpuWindow``).
    """
    tailer = OutputTailer(job.bootstrap, job.output_topic, target=job.expected_outputs)
    tailer.start()
    command = contender.command(job)  # may write files; not part of the measured window
    window = CpuWindow(broker_pid)
    started = time.time()
    child = ChildProcess(command, job.workdir / "contender.log", job.workdir)
    deadline = time.monotonic() + timeout
    try:
        while tailer.target_reached_at is None:
            if time.monotonic() > deadline:
                raise ContenderFailed(f"timed out after {timeout:.0f}s with {tailer.count} of "
                                      f"{job.expected_outputs} outputs committed")
            if child.poll() is not None and not _more_output_arrives(tailer, job.expected_outputs):
                raise ContenderFailed(f"exited with code {child.usage.exit_code} after {tailer.count} of "
                                      f"{job.expected_outputs} outputs; see {job.workdir / 'contender.log'}")
            time.sleep(0.05)
        wall = tailer.target_reached_at - started
        usage = child.wait(60.0) or child.stop(grace=30.0)
        cpu = window.close()
    finally:
        child.stop(grace=5.0)
        tailer.halt()
    return ThroughputRun(wall, usage, cpu)


def _more_output_arrives(tailer: OutputTailer, expected: int, quiet: float = 5.0) -> bool:
    """After the process exited: give the tailer ``quiet`` seconds to see the last committed records."""
    deadline = time.monotonic() + quiet
    while time.monotonic() < deadline and tailer.count < expected:
        time.sleep(0.05)
    return tailer.count >= expected


@dataclass
class Latency:
    p50_ms: float
    p99_ms: float
    samples: int
    first_output_s: float
    """Process start to the first warm-up row visible to a ``read_committed`` reader: start-up, joining the
    group, the first transaction and (for exactly-once contenders) the first commit interval."""


class PacedProduce(Protocol):
    """Writes one row per id at ``rate`` rows/s to the live input (``bench.workload.produce_paced``), each
    row's producer timestamp into ``stamps``; stops early once ``until`` says True."""

    def __call__(self, ids: range, rate: float, stamps: dict[int, int],
                 until: Callable[[], bool] | None = None) -> None: ...


@dataclass
class LatencyPlan:
    """Probe records written while the contender runs live; ids far above the backlog's."""

    records: int = 2_000
    rate: float = 1_000.0
    warmup_first_id: int = 10**12
    probe_first_id: int = 2 * 10**12
    warmup_timeout: float = 90.0
    warmup_every_s: float = 0.02
    probe_ids: range = field(init=False)

    def __post_init__(self) -> None:
        self.probe_ids = range(self.probe_first_id, self.probe_first_id + self.records)


def measure_latency(contender: Contender, job: JobSpec, id_of: Callable[[bytes], int], plan: LatencyPlan,
                    produce: PacedProduce) -> Latency:
    """Run the contender live on ``job``'s fresh topics and time probe records through it.

    ``produce(ids, rate, stamps)`` writes rows with the given ids at ``rate`` rows/s to the job's input
    topic and fills ``stamps`` with each id's producer timestamp (ms).
    """
    tailer = OutputTailer(job.bootstrap, job.output_topic, id_of=id_of)
    tailer.start()
    child = ChildProcess(contender.command(job), job.workdir / "contender.log", job.workdir)
    try:
        first_output_s = time_first_output(child, tailer, job, plan, produce)
        stamps: dict[int, int] = {}
        produce(plan.probe_ids, plan.rate, stamps)
        deadline = time.monotonic() + 60.0
        while any(i not in tailer.arrivals for i in plan.probe_ids) and time.monotonic() < deadline:
            if child.poll() is not None:
                raise ContenderFailed(f"exited with code {child.usage.exit_code} during the latency probe")
            time.sleep(0.1)
        missing = sum(1 for i in plan.probe_ids if i not in tailer.arrivals)
        if missing:
            raise ContenderFailed(f"{missing} of {plan.records} latency probe records never became visible")
    finally:
        child.stop(grace=30.0)
        tailer.halt()
    delays_ms = sorted(tailer.arrivals[i] * 1000 - stamps[i] for i in plan.probe_ids)
    quantiles = statistics.quantiles(delays_ms, n=100, method="inclusive")
    return Latency(quantiles[49], quantiles[98], len(delays_ms), first_output_s)


def time_first_output(child: ChildProcess, tailer: OutputTailer, job: JobSpec, plan: LatencyPlan,
             produce: PacedProduce) -> float:
    """Write a warm-up row every ``plan.warmup_every_s``, all with one producer, until one comes out (the
    contender is then fully running); returns the seconds from the process start to that first output.

    One producer for all of them: until 2026-12-04 each row had a producer of its own (connect, metadata,
    flush: 50-100 ms of the harness's CPU on the cores the starting contender needs) and a 0.1 s sleep after
    it, so a row reached the contender every 0.15-0.2 s and the start-up was measured that coarsely."""
    deadline = time.monotonic() + plan.warmup_timeout
    rows = range(plan.warmup_first_id, plan.warmup_first_id + int(plan.warmup_timeout / plan.warmup_every_s) + 1)
    produce(rows, 1 / plan.warmup_every_s, {},
            until=lambda: bool(tailer.arrivals) or child.poll() is not None or time.monotonic() > deadline)
    if tailer.arrivals:
        return min(tailer.arrivals.values()) - child.started_at
    if child.poll() is not None:
        raise ContenderFailed(f"exited with code {child.usage.exit_code} while warming up; "
                              f"see {job.workdir / 'contender.log'}")
    raise ContenderFailed(f"no output within {plan.warmup_timeout:.0f}s of starting it live")


def log_records(log_path: Path) -> Iterator[dict[str, Any]]:
    """The JSON log lines of a contender's log as dicts, in order; other lines (a librdkafka line written
    before logging was configured, a traceback) are skipped."""
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(record, dict):
            yield record


def resident_high_water_kb(pid: int) -> int:
    """``VmHWM`` of a live process in kB, 0 once it is gone. ``Popen`` returns after the child has exec'd
    its program, so this is the program's own high-water mark, never the harness's."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def process_cpu_seconds(pid: int) -> float | None:
    """user+sys CPU seconds a live process (all its threads) has used so far, from ``/proc/<pid>/stat``;
    None when it is gone or not readable. For a process the harness did not start as a contender (the
    private broker), whose usage ``wait4`` cannot report."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name in (...) may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def wait_until_idle(pid: int, quiet_s: float = 0.3, timeout_s: float = 60.0) -> None:
    """Until the process has used no CPU for ``quiet_s`` (a warm task process done importing, reading its
    command line); ``ContenderFailed`` if it exits or never goes quiet."""
    deadline = time.monotonic() + timeout_s
    last, quiet_since = process_cpu_seconds(pid), time.monotonic()
    while time.monotonic() - quiet_since < quiet_s:
        if time.monotonic() > deadline:
            raise ContenderFailed(f"process {pid} did not go idle within {timeout_s:.0f}s")
        time.sleep(0.05)
        now = process_cpu_seconds(pid)
        if now is None:
            raise ContenderFailed(f"process {pid} exited before it went idle")
        if now != last:
            last, quiet_since = now, time.monotonic()


def machine_cpu_seconds() -> tuple[float, float]:
    """``(busy, total)`` CPU seconds of the whole machine since boot (all cores, every user), from
    ``/proc/stat``; busy is everything but idle and iowait. A difference over a run tells how much of the
    machine was in use while it ran, whoever used it."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    total = sum(values)
    idle = values[3] + values[4]
    ticks = os.sysconf("SC_CLK_TCK")
    return (total - idle) / ticks, total / ticks


@dataclass
class CpuSpan:
    """CPU used over one measured window: the private broker's (None when not known), the harness's own
    (its tailer threads included), and the share of all cores' time that was busy on the whole machine."""

    broker_seconds: float | None
    harness_seconds: float
    machine_busy_share: float | None


class CpuWindow:
    """CPU counters read when a measured window opens and again at ``close``: the broker JVM's
    (``process_cpu_seconds``; ``broker_pid`` None: not measured), the harness process's (``getrusage``) and
    the machine's (``machine_cpu_seconds``). The contenders' own CPU comes from ``wait4`` instead."""

    def __init__(self, broker_pid: int | None) -> None:
        self.broker_pid = broker_pid
        self._broker, self._harness, (self._busy, self._total) = self._read()

    def _read(self) -> tuple[float | None, float, tuple[float, float]]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        broker = process_cpu_seconds(self.broker_pid) if self.broker_pid else None
        return broker, own.ru_utime + own.ru_stime, machine_cpu_seconds()

    def close(self) -> CpuSpan:
        broker, harness, (busy, total) = self._read()
        return CpuSpan(
            broker_seconds=broker - self._broker if broker is not None and self._broker is not None else None,
            harness_seconds=harness - self._harness,
            machine_busy_share=(busy - self._busy) / (total - self._total) if total > self._total else None,
        )
