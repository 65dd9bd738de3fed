"""A conformance kit for external sinks: does a sink keep exactly once when ``epochline run`` is SIGKILLed at
each moment of the two-phase commit?

Why a kit: a sink that publishes in ``write`` works perfectly until a process dies between the write and the
Kafka commit, and random kills rarely land there. The kit makes them land there: for each crash point it
writes a fresh slice of input ids, starts ``epochline run`` with fault injection set to SIGKILL the process at
that moment (``engine.testing.faults``), then restarts it to the end of the input, and accounts for the
slice: each id once in what the sink published (read back by the sink author's ``published`` callable) or
among the dead letters. ``during-recover`` first leaves an epoch prepared (a kill after the Kafka commit), then
kills the restart while it recovers. Optionally, runs killed at random moments while input streams in.

The result is a report, not an assertion, so a test can show everything that went wrong at once::

    report = check_sink({"type": "my_pkg.sink:PLUGIN", "url": ...}, published_ids,
                        bootstrap=kafka_bootstrap, workdir=tmp_path)
    assert report.exactly_once, report
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from connectors.admin import create_topic
from engine.testing.accounting import read_dead_letters
from engine.testing.connectors import (
    LiveInput,
    committing_or_ended,
    produce_values,
    start_connector,
    write_config,
)
from engine.testing.errors import KafkaTestError

__all__ = ["CRASH_POINTS", "ConformanceReport", "ConformanceRunFailed", "CrashFinding", "check_sink"]

CRASH_POINTS = ("before-prepare", "after-prepare", "before-finish", "during-recover")
"""The moments of the two-phase commit the kit kills ``epochline run`` at, in the pipeline's order."""
RANDOM_KILLS = "random kills"
"""The finding's name for runs killed at random moments (and random crash points) while input streams in."""
PARTITIONS = 3
SHOWN = 5
"""How many ids of each kind a finding's description names."""
INPUT_SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
                "required": ["id", "name"]}
"""Each input record: an ``id`` (what ``published`` returns) and a ``name``; the sink gets both columns."""


class ConformanceRunFailed(KafkaTestError):
    """A run that should have reached the end of the input failed: the sink is broken in a way the kit cannot
    account for (the log's tail says how)."""


@dataclass(frozen=True)
class CrashFinding:
    """What one crash scenario left: the input ids it wrote that are neither published nor dead-lettered, those
    found more than once, and whether the injected crash happened at all (if not, the scenario proved nothing)."""

    crash_point: str
    crashed: bool
    missing: tuple[Hashable, ...] = ()
    duplicated: tuple[Hashable, ...] = ()

    @property
    def exactly_once(self) -> bool:
        return self.crashed and not self.missing and not self.duplicated

    def __str__(self) -> str:
        if self.exactly_once:
            return f"{self.crash_point}: exactly once"
        problems = [] if self.crashed else ["the injected crash never happened"]
        for what, ids in (("missing", self.missing), ("duplicated", self.duplicated)):
            if ids:
                problems.append(f"{len(ids)} ids {what}, e.g. {list(ids[:SHOWN])}")
        return f"{self.crash_point}: {'; '.join(problems)}"


@dataclass(frozen=True)
class ConformanceReport:
    """Every scenario's finding; ``exactly_once`` only when each crash happened and lost or doubled nothing."""

    sink_type: str
    findings: tuple[CrashFinding, ...] = field(default_factory=tuple)

    @property
    def exactly_once(self) -> bool:
        return all(finding.exactly_once for finding in self.findings)

    def __str__(self) -> str:
        verdict = "exactly once" if self.exactly_once else "NOT exactly once"
        return "\n".join([f"sink {self.sink_type}: {verdict}", *(f"  {finding}" for finding in self.findings)])


def check_sink(sink: Mapping[str, object], published: Callable[[], Iterable[Hashable]], *, bootstrap: str,
               workdir: Path, records_per_crash: int = 500, crash_points: Sequence[str] = CRASH_POINTS,
               streaming_seconds: float = 0.0) -> ConformanceReport:
    """Run the sink configured by ``sink`` (the connector's ``sink`` mapping, ``type`` included) through each
    of ``crash_points``, ``records_per_crash`` new input records each, then, if ``streaming_seconds`` > 0,
    through random kills while that long a stream of input comes in. ``published`` returns the ``id`` of every
    row the sink has published so far (readers' view, committed only), one per row; ``workdir`` holds the
    connector's config, state and logs."""
    scenario = _Scenario(sink, published, bootstrap, workdir)
    findings = [scenario.crash_at(point, records_per_crash) for point in crash_points]
    if streaming_seconds > 0:
        findings.append(scenario.random_kills(records_per_crash * 4, streaming_seconds))
    return ConformanceReport(str(sink.get("type")), tuple(findings))


class _Scenario:
    """One connector and its topics, through which every crash scenario writes its own slice of ids."""

    def __init__(self, sink: Mapping[str, object], published: Callable[[], Iterable[Hashable]], bootstrap: str,
                 workdir: Path) -> None:
        self.published, self.bootstrap, self.next_id = published, bootstrap, 0
        name = f"conformance-{uuid.uuid4().hex[:12]}"
        self.source, self.dead_letter_topic = f"{name}-in", f"{name}-dlq"
        create_topic(bootstrap, self.source, PARTITIONS)
        create_topic(bootstrap, self.dead_letter_topic, 1)
        schema = workdir / "conformance.schema.json"
        schema.write_bytes(orjson.dumps(INPUT_SCHEMA))
        self.config = write_config(workdir, {
            "name": name,
            "source": {"topic": self.source, "format": "json", "schema": str(schema), "max_batch_records": 200},
            "transform": [{"sql": "SELECT id, name FROM input"}],
            "sink": dict(sink),
            "dead_letter": {"topic": self.dead_letter_topic},
            "checkpoint": {"interval": "300ms", "dir": str(workdir / "state")},
        })

    def crash_at(self, point: str, records: int) -> CrashFinding:
        ids = self._new_ids(records)
        produce_values(self.bootstrap, self.source, [_record(i) for i in ids], PARTITIONS)
        if point == "during-recover":  # something prepared for the recovery to resolve
            crashed = self._crashed_at("before-finish") and self._crashed_at(point)
        else:
            crashed = self._crashed_at(point)
        self._run_to_the_end()
        return self._finding(point, ids, crashed)

    def random_kills(self, records: int, seconds: float) -> CrashFinding:
        """Runs one after the other while the input streams in, each killed by a fault at a random crash point
        or by a SIGKILL after a random lifetime; then a run to the end."""
        ids = self._new_ids(records)
        more = LiveInput(self.bootstrap, self.source, [_record(i) for i in ids], PARTITIONS, seconds)
        rng, crashed = random.Random(), False
        faults = ",".join(f"{point}:0.15" for point in CRASH_POINTS)
        while more.streaming:
            run = start_connector(self.config, self.bootstrap, faults=faults, log_name="random")
            committing_or_ended(run, more)
            if not run.wait_for_exit(rng.uniform(1.0, 4.0)):
                run.kill()
            crashed = crashed or run.crashed_by_fault()
        more.join()
        self._run_to_the_end()
        return self._finding(RANDOM_KILLS, ids, crashed)

    def _new_ids(self, records: int) -> range:
        ids = range(self.next_id, self.next_id + records)
        self.next_id = ids.stop
        return ids

    def _crashed_at(self, point: str) -> bool:
        """Whether a run with a certain crash at ``point`` died there (it is killed after a minute if not)."""
        run = start_connector(self.config, self.bootstrap, faults=f"{point}:1.0", log_name=point)
        if not run.wait_for_exit(60):
            run.kill()
        return run.crashed_by_fault()

    def _run_to_the_end(self) -> None:
        run = start_connector(self.config, self.bootstrap, stop_at_end=True, log_name="to-the-end")
        if not run.wait_for_exit(120):
            run.kill()
            raise ConformanceRunFailed(f"the run to the end of the input took over 120 s:\n{run.log_tail()}")
        if run.process.returncode != 0:
            raise ConformanceRunFailed(f"the run to the end of the input failed:\n{run.log_tail()}")

    def _finding(self, point: str, ids: range, crashed: bool) -> CrashFinding:
        """Published + dead-lettered, restricted to this scenario's ids, against each of them once."""
        letters = read_dead_letters(self.bootstrap, self.dead_letter_topic)
        found: Counter[Hashable] = Counter(i for i in self.published() if i in ids)
        found.update(i for letter in letters for i in letter.ids if i in ids)
        return CrashFinding(point, crashed, missing=tuple(i for i in ids if not found[i]),
                            duplicated=tuple(i for i in ids if found[i] > 1))


def _record(i: int) -> bytes:
    return orjson.dumps({"id": i, "name": f"n{i}"})
