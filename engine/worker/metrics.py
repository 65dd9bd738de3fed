"""The worker's ``/metrics``: every running task's own metrics with a ``connector`` label, plus task states.

Why re-export: each task is a process with its own registry (``engine.metrics``); one scrape of a worker
should show all its connectors, told apart by label, as Connect's per-connector JMX metrics are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import get_args

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.worker.records import TaskState
from engine.worker.supervisor import scrape

SCRAPE_TIMEOUT_S = 1.0
STATES: tuple[TaskState, ...] = get_args(TaskState)


class WorkerCollector(Collector):
    def __init__(self, worker_id: str, ports: Callable[[], dict[str, int]],
                 tasks: Callable[[], dict[str, tuple[TaskState, int]]]) -> None:
        self._worker_id = worker_id
        self._ports = ports
        self._tasks = tasks

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for connector, port in sorted(self._ports().items()):
            for family in scrape(port, SCRAPE_TIMEOUT_S) or []:
                target = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                for sample in family.samples:
                    target.add_sample(sample.name, {**sample.labels, "connector": connector,
                                                    "worker": self._worker_id}, sample.value)
        yield from merged.values()
        states = GaugeMetricFamily("epochline_task_state", "1 for the state each task of this worker is in",
                                   labels=["connector", "worker", "state"])
        restarts = GaugeMetricFamily("epochline_task_restarts", "Times this worker restarted the task after it "
                                     "exited", labels=["connector", "worker"])
        for connector, (state, count) in sorted(self._tasks().items()):
            for candidate in STATES:
                states.add_metric([connector, self._worker_id, candidate], 1.0 if candidate == state else 0.0)
            restarts.add_metric([connector, self._worker_id], count)
        yield states
        yield restarts


def render(collector: WorkerCollector) -> Callable[[], bytes]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return lambda: generate_latest(registry)
