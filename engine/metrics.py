"""The engine's metrics: plain counters that tests read directly, exposed to Prometheus on request.

Why plain counters plus a collector, rather than prometheus-client Counter objects: the counters are the one
source of truth (``snapshot()`` returns them as a dict, so tests and the CLI need no HTTP), and a custom
collector renders them at scrape time, so nothing is counted twice. Each served ``Metrics`` has its own
``CollectorRegistry`` (``engine._prometheus``); several instances (tests, pipelines) never clash in the global
one. prometheus-client is imported only when metrics are served.

Each recording method is called where its numbers are known: ``record_cycle`` by the coordinator after a
cycle, ``records_out`` by the sink step, ``checkpoint`` and ``lag`` after a commit, ``late_rows`` and
``dead_letters`` by the source step, ``cycle_failed`` when operators fail.

Updates come from the engine's loop and reads from the HTTP server's thread; a lock keeps each read whole.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

log = logging.getLogger(__name__)

NS_PER_SECOND = 1_000_000_000


@dataclass
class Counters:
    """Every number ``Metrics`` keeps; times in ns except checkpoint durations (s, as measured)."""

    cycles: int = 0
    batches_in: int = 0
    records_in: int = 0
    bytes_in: int = 0
    records_out: int = 0
    bytes_out: int = 0
    cycle_ns: int = 0
    phase_ns: dict[str, int] = field(default_factory=dict)
    last_cycle_phase_ns: dict[str, int] = field(default_factory=dict)
    checkpoints: int = 0
    checkpoint_seconds_total: float = 0.0
    checkpoint_bytes_total: int = 0
    last_checkpoint_seconds: float = 0.0
    last_checkpoint_bytes: int = 0
    consumer_lag: dict[str, dict[int, int]] = field(default_factory=dict)
    late_rows_dropped: int = 0
    late_rows_diverted: int = 0
    dead_letters: int = 0
    cycles_failed: int = 0
    state_restores: int = 0
    state_restore_seconds_total: float = 0.0
    state_restore_bytes_total: int = 0


class Metrics:
    """Counters of one running pipeline: record with the methods below, read with ``snapshot()``, expose
    with ``serve(port)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters = Counters()
        self._server: WSGIServer | None = None
        self._server_thread: threading.Thread | None = None

    # -- recording --------------------------------------------------------------------------------------

    def record_cycle(
        self, *, records_in: int, batches: int = 0, elapsed_ns: int = 0, bytes_in: int = 0,
        phase_ns: Mapping[str, int] | None = None,
    ) -> None:
        """One engine cycle: rows, batches and bytes read, its duration, and ns spent per phase (e.g. the
        operator chain's ``last_cycle_ns``)."""
        with self._lock:
            c = self._counters
            c.cycles += 1
            c.batches_in += batches
            c.records_in += records_in
            c.bytes_in += bytes_in
            c.cycle_ns += elapsed_ns
            phases = dict(phase_ns or {})
            for phase, ns in phases.items():
                c.phase_ns[phase] = c.phase_ns.get(phase, 0) + ns
            c.last_cycle_phase_ns = phases

    def records_out(self, count: int, bytes_out: int = 0) -> None:
        """Rows (and their encoded bytes) handed to the sink."""
        with self._lock:
            self._counters.records_out += count
            self._counters.bytes_out += bytes_out

    def checkpoint(self, *, duration_s: float, size_bytes: int) -> None:
        """One committed checkpoint: how long it took end to end and how many bytes of state it wrote."""
        with self._lock:
            c = self._counters
            c.checkpoints += 1
            c.checkpoint_seconds_total += duration_s
            c.checkpoint_bytes_total += size_bytes
            c.last_checkpoint_seconds = duration_s
            c.last_checkpoint_bytes = size_bytes

    def lag(self, source: str, lags: Mapping[int, int]) -> None:
        """A source's current lag, records behind the partition end, by partition. Replaces the source's
        previous values, so partitions it no longer reads disappear."""
        with self._lock:
            self._counters.consumer_lag[source] = dict(lags)

    def late_rows(self, count: int, *, diverted: bool) -> None:
        """Rows behind the watermark: diverted (to the dead-letter topic) or dropped."""
        with self._lock:
            if diverted:
                self._counters.late_rows_diverted += count
            else:
                self._counters.late_rows_dropped += count

    def dead_letters(self, count: int) -> None:
        with self._lock:
            self._counters.dead_letters += count

    def cycle_failed(self) -> None:
        """A cycle whose operators failed: at-least-once drops it (rows dead-lettered), exactly-once abandons
        the epoch and replays it from the last checkpoint."""
        with self._lock:
            self._counters.cycles_failed += 1

    def state_restored(self, operator: str, *, seconds: float, size_bytes: int) -> None:
        """Keyed state of newly owned (or rewound) partitions read back from ``operator``'s changelog."""
        with self._lock:
            c = self._counters
            c.state_restores += 1
            c.state_restore_seconds_total += seconds
            c.state_restore_bytes_total += size_bytes

    # -- reading ----------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, object]:
        """A consistent copy of every counter (the fields of ``Counters``) as a dict; ``consumer_lag`` is
        ``{source: {partition: lag}}``, ``phase_ns`` is ``{phase: ns}`` summed over cycles."""
        with self._lock:
            return asdict(self._counters)

    def counters(self) -> Counters:
        """A consistent, typed copy of every counter."""
        with self._lock:
            return copy.deepcopy(self._counters)

    # -- exposing -----------------------------------------------------------------------------------------

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` in Prometheus text format on ``addr:port`` (port 0 picks a free one) from a
        daemon thread; returns the bound port. Stop with ``close()``."""
        if self._server is not None:
            raise RuntimeError(f"metrics are already served on port {self._server.server_port}")
        from engine._prometheus import serve_counters  # prometheus-client only when served: ~15 ms of a start

        self._server, self._server_thread = serve_counters(self.counters, port, addr)
        bound = self._server.server_port
        log.info("metrics served", extra={"addr": addr, "port": bound})
        return bound

    def close(self) -> None:
        """Stop the HTTP server if one runs; safe to call more than once."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._server_thread is not None:
            self._server_thread.join(timeout=5)
        self._server = self._server_thread = None
