"""The last 15 minutes of every connector's throughput and lag, kept in the worker for the status page.

Why in the worker, in memory: a status page wants a trend (is the lag growing?), and an operator should not
need a metrics stack to see one. Each worker samples every connector's consumer group every few seconds
(``GroupReader``, whose answers the status polls share) into a ring buffer of fixed length per connector, so
memory is bounded by connectors x window / interval, and it is forgotten on restart (Prometheus, fed by
``/metrics``, is where longer history belongs). Throughput is what the group committed per second, the
difference of its summed committed offsets between two samples: it counts what was processed exactly once,
on whichever worker, not what one process read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from engine.worker.errors import StoreError
from engine.worker.records import ConnectorRecord
from engine.worker.view import GroupView

log = logging.getLogger(__name__)
WINDOW_S = 15 * 60.0
INTERVAL_S = 5.0


@dataclass(frozen=True)
class Sample:
    """One look at a connector's group: when (wall clock, s), its committed offsets summed over its source
    partitions and its lag (None: the group could not be read, or nothing was committed yet)."""

    at: float
    committed: int | None
    lag: int | None


def sample_of(view: GroupView | None, at: float) -> Sample:
    sources = [p for p in view.status.partitions if p.role == "source"] if view is not None else []
    committed = [p.committed for p in sources if p.committed is not None]
    lags = [p.lag for p in sources if p.lag is not None]
    return Sample(at, sum(committed) if committed else None, sum(lags) if lags else None)


def records_per_s(before: Sample, after: Sample) -> float | None:
    """Committed records per second between two samples; None when either is unknown or the offsets went
    back (an offset reset is no negative throughput)."""
    if before.committed is None or after.committed is None or after.committed < before.committed:
        return None
    return round((after.committed - before.committed) / max(after.at - before.at, 1e-3), 3)


class ConnectorHistory:
    """Per connector, its samples of the last ``window_s`` seconds, one every ``interval_s``."""

    def __init__(self, window_s: float = WINDOW_S, interval_s: float = INTERVAL_S) -> None:
        self.window_s = window_s
        self.interval_s = interval_s
        self._length = int(window_s // interval_s) + 1
        self._samples: dict[str, deque[Sample]] = {}
        self._lock = threading.Lock()

    def record(self, name: str, sample: Sample) -> None:
        with self._lock:
            self._samples.setdefault(name, deque(maxlen=self._length)).append(sample)

    def keep_only(self, names: Iterable[str]) -> None:
        """Forget connectors that no longer exist (a re-created name starts a new history)."""
        wanted = set(names)
        with self._lock:
            for gone in set(self._samples) - wanted:
                del self._samples[gone]

    def series(self, name: str) -> dict[str, Any]:
        """What ``GET /connectors/{name}/history`` answers: per sample its time, throughput since the sample
        before (None for the first) and lag."""
        with self._lock:
            samples = list(self._samples.get(name, ()))
        points = [{"at": after.at, "records_per_s": records_per_s(before, after) if before is not None else None,
                   "lag": after.lag} for before, after in zip([None, *samples[:-1]], samples)]
        return {"window_s": self.window_s, "interval_s": self.interval_s, "samples": points}

    def sample_all(self, connectors: Iterable[ConnectorRecord],
                   read: Callable[[ConnectorRecord], GroupView | None]) -> None:
        """One sample of every connector (one group read each), and the deleted ones forgotten."""
        records = list(connectors)
        for record in records:
            self.record(record.name, sample_of(read(record), time.time()))
        self.keep_only(record.name for record in records)

    def run(self, connectors: Callable[[], Iterable[ConnectorRecord]],
            read: Callable[[ConnectorRecord], GroupView | None], stop: threading.Event) -> None:
        """Sample every ``interval_s`` until ``stop`` is set (the worker's history thread). Group reads that
        fail are unknown samples (``GroupReader``); a cluster store that cannot answer skips the round: the
        history is a convenience, never a reason for the worker to stop."""
        while not stop.wait(self.interval_s):
            try:
                self.sample_all(connectors(), read)
            except StoreError as error:
                log.warning("history not sampled", extra={"error": str(error)})


__all__ = ["ConnectorHistory", "Sample", "records_per_s", "sample_of"]
