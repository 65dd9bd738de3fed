"""How the spike's scripts time one way: wall time and the CPU of the whole process (getrusage: every
thread, librdkafka's included), printed as one line."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable


def report_run(way: str, run: Callable[[], int]) -> None:
    """Run ``run`` (which returns how many records it moved) and print its records/s and CPU per record."""
    started, before = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    records = run()
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(f"{way}: {records:,} records in {wall:.2f} s = {records / wall:,.0f} records/s, "
          f"{cpu / records * 1e6:.2f} µs CPU per record ({cpu / wall:.2f} cores)")
