"""The benchmark's outputs: one rich table (each value also as a ratio to raw-eos) and a JSON file."""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

REFERENCE = "raw-eos"
OK, FAILED, NOT_AVAILABLE = "ok", "FAILED", "not available"


@dataclass
class Result:
    """One contender's outcome; the numbers are None when it did not run or failed before measuring."""

    contender: str
    status: str
    note: str
    reason: str = ""
    expected_count: int | None = None
    output_count: int | None = None
    wall_seconds: float | None = None
    records_per_s: float | None = None
    client_cpu_seconds: float | None = None  # the contender's processes (wait4)
    broker_cpu_seconds: float | None = None  # the private broker's JVM over the contender's lifetime
    client_cpu_us_per_record: float | None = None  # per input record
    broker_cpu_us_per_record: float | None = None
    records_per_cpu_second: float | None = None  # input records / (client + broker CPU s): the whole system's
    peak_rss_mb: float | None = None
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    latency_samples: int | None = None
    first_output_s: float | None = None  # process start to its first committed output, in the latency run
    runs_records_per_s: list[float | None] = field(default_factory=list)
    """With ``--repeat``: every repetition's records/s in run order (None where it failed); the other numbers
    are those of the median run."""

    def set_cpu(self, client_seconds: float, broker_seconds: float | None, records: int) -> None:
        """The CPU split of a run over ``records`` input records; without the broker's CPU (``--bootstrap``)
        its columns and the whole system's records per CPU-second stay None."""
        self.client_cpu_seconds = client_seconds
        self.client_cpu_us_per_record = client_seconds / records * 1e6 if records else None
        self.broker_cpu_seconds = broker_seconds
        if broker_seconds is None:
            return
        self.broker_cpu_us_per_record = broker_seconds / records * 1e6 if records else None
        total = client_seconds + broker_seconds
        self.records_per_cpu_second = records / total if total > 0 else None


# (column title, Result field, how to print it)
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("records/s", "records_per_s", "{:,.0f}"),
    ("client CPU s", "client_cpu_seconds", "{:,.1f}"),
    ("broker CPU s", "broker_cpu_seconds", "{:,.1f}"),
    ("client CPU µs/record", "client_cpu_us_per_record", "{:,.1f}"),
    ("broker CPU µs/record", "broker_cpu_us_per_record", "{:,.1f}"),
    ("records/CPU-s", "records_per_cpu_second", "{:,.0f}"),
    ("peak RSS MB", "peak_rss_mb", "{:,.0f}"),
    ("latency p50 ms", "latency_p50_ms", "{:,.0f}"),
    ("latency p99 ms", "latency_p99_ms", "{:,.0f}"),
    ("first output s", "first_output_s", "{:,.2f}"),
)
# shown without "(Nx)" in the table: every contender reads the same input, so the ratio of CPU seconds is the
# one of CPU µs/record next to them (the JSON has every column's ratio)
NO_RATIO_IN_TABLE = frozenset({"client_cpu_seconds", "broker_cpu_seconds"})


def ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return value / reference


def _cell(result: Result, reference: Result | None, field_name: str, pattern: str) -> str:
    value = getattr(result, field_name)
    if value is None:
        return "-"
    text = pattern.format(value)
    if field_name in NO_RATIO_IN_TABLE:
        return text
    relative = ratio(value, getattr(reference, field_name) if reference else None)
    return f"{text} ({relative:.2f}x)" if relative is not None else text


def _reference(results: list[Result]) -> Result | None:
    return next((r for r in results if r.contender == REFERENCE and r.status == OK), None)


def render_table(results: list[Result], title: str) -> Table:
    table = Table(title=title, caption=f"(Nx) = ratio to {REFERENCE}; FAILED runs lost or duplicated records")
    table.add_column("contender")
    table.add_column("status")
    for column_title, _, _ in COLUMNS:
        table.add_column(column_title, justify="right")
    table.add_column("note")
    reference = _reference(results)
    for result in results:
        style = {"ok": "green", FAILED: "bold red"}.get(result.status, "yellow")
        cells = [_cell(result, reference, field_name, pattern) for _, field_name, pattern in COLUMNS]
        table.add_row(result.contender, f"[{style}]{result.status}[/]", *cells, _note(result))
    return table


def _note(result: Result) -> str:
    note = result.reason or result.note
    if len(result.runs_records_per_s) < 2:
        return note
    runs = ", ".join("failed" if rate is None else f"{rate:,.0f}" for rate in result.runs_records_per_s)
    return f"{note}; records/s of each run: {runs}"


def print_table(results: list[Result], title: str) -> None:
    Console(width=240).print(render_table(results, title))


def machine() -> dict[str, object]:
    """What the numbers were measured on; the load average tells a quiet machine from a busy one."""
    cpu_model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        cpu_model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                          if line.startswith("model name")), "")
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "load_average_at_start": os.getloadavg(),
        "python": sys.version.split()[0],
    }


def write_json(path: Path, meta: dict[str, object], results: list[Result]) -> None:
    reference = _reference(results)
    rows = []
    for result in results:
        row = dataclasses.asdict(result)
        row["ratio_to_raw_eos"] = {
            field_name: ratio(getattr(result, field_name), getattr(reference, field_name) if reference else None)
            for _, field_name, _ in COLUMNS
        }
        rows.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps({"meta": meta, "results": rows}, option=orjson.OPT_INDENT_2))
