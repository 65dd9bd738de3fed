"""Running one connector: build the pipeline, run the coordinator, restart it after recoverable failures.

Why restart in-process: a broker restart or a timed-out commit leaves the producer in a state where the
outcome of the last commit is unknown. The only safe way on is the recovery path itself (a new producer,
``init_transactions``, resume from what Kafka says was committed), which is what a restart does, like
Flink's restart strategy. Fencing, a halt on poison input, and configuration errors are not retried.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from connectors.admin import end_offsets
from connectors.checkpoint import SourceCheckpoint
from connectors.dead_letter import PoisonRecord
from connectors.source import SourceUnavailable
from engine.checkpoint.coordinator import CoordinatorSettings, ImmediateStop, PipelineHalted, StreamingCoordinator
from engine.checkpoint.pipeline import KafkaPipeline, RecoveryError
from engine.config import ConnectorConfig
from engine.metrics import Metrics
from engine.state import StateDirLocked
from engine.wiring import SOURCE_NAME, CrashPoint
from sinks import ProducerFenced, SinkError

log = logging.getLogger(__name__)


class ConnectorFailed(RuntimeError):
    """The connector stopped without finishing; the message says why."""


class RunProgress(Protocol):
    """Told, with ``--stop-at-end``, where the input ends and, after every cycle, where the sources stand."""

    def begin(self, ends: Mapping[str, Mapping[int, int]]) -> None: ...
    def positions(self, cuts: Mapping[str, SourceCheckpoint]) -> None: ...


@dataclass(frozen=True)
class RunOptions:
    bootstrap: str
    stop_at_end: bool = False
    max_restarts: int = 10
    restart_backoff_s: float = 2.0
    crash_point: CrashPoint | None = None
    progress: RunProgress | None = None


def bootstrap_from(flag: str | None) -> str:
    """The bootstrap address: the flag, else ``KAFKA_BOOTSTRAP``; neither is a clear error."""
    address = flag or os.environ.get("KAFKA_BOOTSTRAP")
    if not address:
        raise ConnectorFailed("no Kafka bootstrap address: pass --bootstrap-servers HOST:PORT or set KAFKA_BOOTSTRAP")
    return address


def run_connector(config: ConnectorConfig, options: RunOptions) -> None:
    metrics = Metrics()
    if config.metrics_port is not None:
        metrics.serve(config.metrics_port)
    stop_at = {SOURCE_NAME: end_offsets(options.bootstrap, config.source.topic)} if options.stop_at_end else None
    if options.progress is not None and stop_at is not None:
        options.progress.begin(stop_at)
    observer = options.progress.positions if options.progress is not None else None
    restarts = 0
    while True:
        pipeline = KafkaPipeline(config, options.bootstrap, metrics, options.crash_point, cycle_observer=observer)
        coordinator = StreamingCoordinator(pipeline, CoordinatorSettings(
            checkpoint_interval_s=config.checkpoint.interval / 1000, stop_at=stop_at))
        coordinator.install_signal_handlers()
        try:
            coordinator.run()
            log.info("connector stopped", extra={"connector": config.name,
                                                 "checkpoints": coordinator.checkpoints_committed})
            return
        except ProducerFenced as fenced:
            raise ConnectorFailed(f"{config.name}: {fenced}") from fenced
        except (PipelineHalted, PoisonRecord, RecoveryError, ImmediateStop, StateDirLocked) as stop:
            raise ConnectorFailed(f"{config.name}: {stop}") from stop
        except (SinkError, SourceUnavailable) as error:
            restarts += 1
            if restarts > options.max_restarts:
                raise ConnectorFailed(
                    f"{config.name}: giving up after {options.max_restarts} restarts: {error}") from error
            log.warning("restarting connector from the last committed checkpoint",
                        extra={"connector": config.name, "error": str(error), "restart": restarts})
            time.sleep(options.restart_backoff_s)
