"""Randomised: the window operator emits exactly what a plain-Python reference emits, cycle by cycle.

Streams of keyed events from a few source partitions are cut into random cycles, each with a watermark that
may stay, advance or be absent; the stream ends with the end-of-input flush. The reference is dicts over the
same events, written from the documented semantics (a row counts in every window ``start <= t < start +
size`` of its partition; rows behind what their partition already closed never get there, since the engine
dead-letters them first (``judged_by_the_engine``); a partition holding
state or getting rows advances to the cycle's watermark; a window is emitted, ordered by end, key, then
partition, in the first cycle its partition's watermark reaches its end). The same comparison must hold
when the run is cut at a random cycle, the state snapshotted partition by partition, and the rest run on a
fresh operator restored from the bytes, in this process and in a fresh Python process. And since
state is per partition, one operator per partition, each fed its partition's rows, emits together what one
operator emits.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.metadata import PARTITION
from engine.transforms.windows import END_OF_INPUT_WATERMARK, WindowOperator, WindowSpec

AGGREGATES = {"n": "count(*)", "c": "count(x)", "s": "sum(x)", "lo": "min(x)", "hi": "max(x)", "a": "avg(x)"}
TIME_TYPES = {
    "int64 ms": (pa.int64(), 1),
    "timestamp us UTC": (pa.timestamp("us", tz="UTC"), 1_000),
    "timestamp ns": (pa.timestamp("ns"), 1_000_000),
}

Event = tuple[str, int, int, int | None, int]  # key k, key g, event time ms, value x, source partition


@dataclass(frozen=True)
class Scenario:
    spec: WindowSpec
    time_type: str
    sub_ms: int  # added below the millisecond for finer time units: must not move a row to another window
    cycles: list[tuple[list[Event], int | None]]

    def table(self, events: list[Event]) -> pa.Table:
        arrow_type, per_ms = TIME_TYPES[self.time_type]
        offset = self.sub_ms % per_ms
        return pa.table({
            "k": pa.array([e[0] for e in events], pa.string()),
            "g": pa.array([e[1] for e in events], pa.int32()),
            "ts": pa.array([e[2] * per_ms + offset for e in events], pa.int64()).cast(arrow_type),
            "x": pa.array([e[3] for e in events], pa.int64()),
            PARTITION: pa.array([e[4] for e in events], pa.int32()),
        })

    def all_cycles(self) -> list[tuple[pa.Table, int | None]]:
        """The scenario's cycles as Arrow tables, then the end-of-input flush."""
        return [(self.table(events), watermark) for events, watermark in self.cycles] + [
            (self.table([]), END_OF_INPUT_WATERMARK)]

    def partitions(self) -> set[int]:
        return {event[4] for events, _ in self.cycles for event in events}

    def only(self, partition: int) -> Scenario:
        """The same cycles and watermarks with only the rows of ``partition``."""
        cycles = [([e for e in events if e[4] == partition], watermark) for events, watermark in self.cycles]
        return Scenario(self.spec, self.time_type, self.sub_ms, cycles)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    kind = draw(st.sampled_from(["tumbling", "hopping"]))
    size = draw(st.integers(1, 25))
    slide = draw(st.integers(1, size)) if kind == "hopping" else None
    key = draw(st.sampled_from([[], ["k"], ["k", "g"]]))
    aggregates = dict(draw(st.lists(st.sampled_from(list(AGGREGATES.items())), min_size=1, unique=True)))
    event = st.tuples(st.sampled_from("abc"), st.integers(0, 2), st.integers(-30, 120),
                      st.none() | st.integers(-1000, 1000), st.integers(0, 2))
    events = draw(st.lists(event, max_size=40))
    cuts = sorted(draw(st.lists(st.integers(0, len(events)), max_size=8)))
    bounds = [0, *cuts, len(events)]
    # Watermarks land on window ends half of the time: the boundary cases (end == watermark) need them.
    step = slide or size
    window_end = st.integers(-5, 10).map(lambda i: i * step + size)
    watermark: int | None = None
    cycles = []
    for start, end in itertools.pairwise(bounds):
        move = draw(st.sampled_from(["none", "same", "advance", "back"]))
        if move == "advance":
            candidate = draw(st.integers(-30, 130) | window_end)
            watermark = candidate if watermark is None else max(watermark, candidate)
        cycles.append((events[start:end], None if move == "none" else
                       (watermark - 5 if move == "back" and watermark is not None else watermark)))
    spec = WindowSpec(kind, size, slide, key, "ts", aggregates)
    return Scenario(spec, draw(st.sampled_from(list(TIME_TYPES))), draw(st.integers(0, 999_999)),
                    judged_by_the_engine(cycles))


def judged_by_the_engine(cycles: list[tuple[list[Event], int | None]]) -> list[tuple[list[Event], int | None]]:
    """The cycles without the rows the engine sets apart before the window: a row behind what its partition
    already closed (``closed_through``, how far its windows were emitted) is a dead letter, never input."""
    closed: dict[int, int] = {}
    seen: set[int] = set()
    kept_cycles = []
    for events, watermark in cycles:
        kept = [event for event in events if event[2] >= closed.get(event[4], -(2**63))]
        seen.update(event[4] for event in kept)
        if watermark is not None:
            for partition in seen:
                closed[partition] = max(closed.get(partition, watermark), watermark)
        kept_cycles.append((kept, watermark))
    return kept_cycles


# -- the reference ---------------------------------------------------------------------------------------


def reference(scenario: Scenario) -> list[list[dict]]:
    """Rows emitted per cycle (end-of-input flush last), from plain dicts over the events."""
    spec = scenario.spec
    step = spec.slide_ms or spec.size_ms
    open_windows: dict[tuple[int, tuple, int], list[int | None]] = {}  # (start, key, partition) -> values
    emitted_through: dict[int, int] = {}  # per partition
    emitted = []
    for events, watermark in [*scenario.cycles, ([], END_OF_INPUT_WATERMARK)]:
        for k, g, t, x, partition in events:
            key = tuple({"k": k, "g": g}[column] for column in spec.key)
            first = (t - spec.size_ms) // step * step
            for start in range(first, t + 1, step):
                inside = start <= t < start + spec.size_ms
                already_emitted = start + spec.size_ms <= emitted_through.get(partition, -(2**63))
                if inside and not already_emitted:
                    open_windows.setdefault((start, key, partition), []).append(x)
        if watermark is not None:
            holding = {w[2] for w in open_windows} | set(emitted_through) | {e[4] for e in events}
            for partition in holding:
                emitted_through[partition] = max(emitted_through.get(partition, watermark), watermark)
        due = sorted(w for w in open_windows if w[0] + spec.size_ms <= emitted_through.get(w[2], -(2**63)))
        emitted.append([reference_row(spec, start, key, open_windows.pop((start, key, p))) for start, key, p in due])
    return emitted


def reference_row(spec: WindowSpec, start: int, key: tuple, values: list[int | None]) -> dict:
    present = [v for v in values if v is not None]
    results = {
        "count(*)": len(values),
        "count(x)": len(present),
        "sum(x)": sum(present) if present else None,
        "min(x)": min(present) if present else None,
        "max(x)": max(present) if present else None,
        "avg(x)": sum(present) / len(present) if present else None,
    }
    row = dict(zip(spec.key, key))
    row.update(window_start=start, window_end=start + spec.size_ms)
    row.update({output: results[expression] for output, expression in spec.aggregates.items()})
    return row


def plain(table: pa.Table) -> list[dict]:
    columns = {name: table[name] for name in table.column_names}
    for bound in ("window_start", "window_end"):
        columns[bound] = table[bound].cast(pa.int64())
    return pa.table(columns).to_pylist()


def run(operator: WindowOperator, cycles: list[tuple[pa.Table, int | None]]) -> list[list[dict]]:
    return [plain(operator.process(table, watermark)) for table, watermark in cycles]


def fresh_operator(scenario: Scenario) -> WindowOperator:
    operator = WindowOperator(scenario.spec)
    operator.validate(scenario.table([]).schema)
    return operator


# -- the properties --------------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(scenarios())
def test_windows_emit_what_the_reference_emits(scenario: Scenario) -> None:
    assert run(fresh_operator(scenario), scenario.all_cycles()) == reference(scenario)


@settings(max_examples=50, deadline=None)
@given(scenarios(), st.data())
def test_windows_restored_partition_by_partition_continue_exactly(scenario: Scenario, data: st.DataObject) -> None:
    cycles = scenario.all_cycles()
    cut = data.draw(st.integers(0, len(cycles)), label="cut")
    first = fresh_operator(scenario)
    before = run(first, cycles[:cut])
    second = fresh_operator(scenario)
    for partition in sorted(first.state.partitions()):
        second.state.restore_partition(partition, first.state.snapshot_partition(partition))
    assert second.state.partitions() == first.state.partitions()
    assert all(second.state.snapshot_partition(p) == first.state.snapshot_partition(p)
               for p in first.state.partitions())
    assert before + run(second, cycles[cut:]) == reference(scenario)


def as_multiset(emitted: list[list[dict]]) -> Counter[tuple]:
    return Counter(tuple(sorted(row.items())) for cycle in emitted for row in cycle)


@settings(max_examples=50, deadline=None)
@given(scenarios())
def test_one_operator_per_partition_emits_together_what_one_operator_emits(scenario: Scenario) -> None:
    together = run(fresh_operator(scenario), scenario.all_cycles())
    apart: list[list[dict]] = [[] for _ in together]
    for partition in scenario.partitions():
        alone = scenario.only(partition)
        for cycle, rows in zip(apart, run(fresh_operator(alone), alone.all_cycles()), strict=True):
            cycle.extend(rows)
    assert [as_multiset([cycle]) for cycle in apart] == [as_multiset([cycle]) for cycle in together]
    assert as_multiset(apart) == as_multiset(together)


RESUME_IN_FRESH_PROCESS = """
import json, sys
import pyarrow as pa
from engine.transforms.windows import WindowOperator, WindowSpec

spec_path, states_path, cycles_path, output_path = sys.argv[1:]
operator = WindowOperator(WindowSpec(**json.loads(open(spec_path).read())))
for partition, state_path in json.loads(open(states_path).read()).items():
    operator.state.restore_partition(int(partition), open(state_path, "rb").read())
emitted = []
for cycle in json.loads(open(cycles_path).read()):
    table = pa.ipc.open_stream(open(cycle["arrow"], "rb").read()).read_all()
    result = operator.process(table, cycle["watermark"])
    columns = {name: result[name] for name in result.column_names}
    for bound in ("window_start", "window_end"):
        columns[bound] = result[bound].cast(pa.int64())
    emitted.append(pa.table(columns).to_pylist())
open(output_path, "w").write(json.dumps(emitted))
"""


def write_arrow(path: Path, table: pa.Table) -> str:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return str(path)


@settings(max_examples=8, deadline=None)
@given(scenarios(), st.data())
def test_windows_restored_in_a_fresh_process_continue_exactly(
    tmp_path_factory, scenario: Scenario, data: st.DataObject
) -> None:
    directory = tmp_path_factory.mktemp("resume")
    cycles = scenario.all_cycles()
    cut = data.draw(st.integers(0, len(cycles)), label="cut")
    first = fresh_operator(scenario)
    before = run(first, cycles[:cut])
    (directory / "spec.json").write_text(json.dumps(asdict(scenario.spec)))
    states = {partition: directory / f"state-{partition}.bin" for partition in sorted(first.state.partitions())}
    for partition, path in states.items():
        path.write_bytes(first.state.snapshot_partition(partition))
    (directory / "states.json").write_text(json.dumps({p: str(path) for p, path in states.items()}))
    rest = [{"arrow": write_arrow(directory / f"cycle{i}.arrow", table), "watermark": watermark}
            for i, (table, watermark) in enumerate(cycles[cut:])]
    (directory / "cycles.json").write_text(json.dumps(rest))
    subprocess.run(
        [sys.executable, "-c", RESUME_IN_FRESH_PROCESS, *(str(directory / name) for name in
                                                          ("spec.json", "states.json", "cycles.json", "out.json"))],
        check=True, timeout=60,
    )
    after = json.loads((directory / "out.json").read_text())
    assert before + after == reference(scenario)
