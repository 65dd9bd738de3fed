"""The benchmark's outputs: one rich table (each value also as a ratio to raw-eos) and a JSON file."""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
from dataclasses import dataclass
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
    cpu_seconds: float | None = None
    peak_rss_mb: float | None = None
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    latency_samples: int | None = None


# (column title, Result field, how to print it)
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("records/s", "records_per_s", "{:,.0f}"),
    ("CPU s", "cpu_seconds", "{:,.1f}"),
    ("peak RSS MB", "peak_rss_mb", "{:,.0f}"),
    ("latency p50 ms", "latency_p50_ms", "{:,.0f}"),
    ("latency p99 ms", "latency_p99_ms", "{:,.0f}"),
)


def ratio(value: float | None, reference: float | None) -> float | None:
    if value is None or not reference:
        return None
    return value / reference


def _cell(result: Result, reference: Result | None, field_name: str, pattern: str) -> str:
    value = getattr(result, field_name)
    if value is None:
        return "-"
    text = pattern.format(value)
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
        table.add_row(result.contender, f"[{style}]{result.status}[/]", *cells, result.reason or result.note)
    return table


def print_table(results: list[Result], title: str) -> None:
    Console(width=200).print(render_table(results, title))


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
