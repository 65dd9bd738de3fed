"""Running one connector: build the pipeline, run the epoch loop, restart it after recoverable failures.

Why restart in-process: a broker restart or a timed-out commit leaves the producer in a state where the
outcome of the last commit is unknown. The only safe way on is the recovery path itself (a new producer,
``init_transactions``, resume from what Kafka says was committed), which is what a restart does, like
Flink's restart strategy. Fencing, a halt on poison input, a missing topic, a refused permission and
configuration errors are not retried: they would fail the same way.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from connectors.admin import KafkaUnreachable, TopicAdminError, check_connection, create_topics, end_offsets
from connectors.checkpoint import SourceCheckpoint
from connectors.dead_letter import PoisonRecord
from connectors.source import SourceNotAuthorized, SourceUnavailable, TopicMissing
from engine.checkpoint.loop import (
    EpochLoop,
    EpochLoopSettings,
    ImmediateStop,
    PipelineHalted,
    StoppedBeforeStart,
    StopRequest,
)
from engine.checkpoint.pipeline import KafkaPipeline, RecoveryError
from engine.checkpoint.totals import RunTotals
from engine.config import ConnectorConfig
from engine.instance import InstanceNameError, resolve_instance
from engine.logs import set_context
from engine.metrics import Metrics
from engine.state import StateDirLocked
from engine.wiring import SOURCE_NAME, CrashPoint, client_config, open_early
from sinks import CallInterrupted, ProducerFenced, SinkError, SinkMisconfigured, SinkNotAuthorized, SinkTopicMissing

log = logging.getLogger(__name__)


class ConnectorFailed(RuntimeError):
    """The connector stopped without finishing; the message says why."""


PERMANENT_FAILURES = (ProducerFenced, PipelineHalted, PoisonRecord, RecoveryError, StateDirLocked, TopicMissing,
                      SourceNotAuthorized, SinkNotAuthorized, SinkTopicMissing, SinkMisconfigured)
"""Failures a restart would only repeat: fenced by a newer instance, poison input, state that cannot be
restored, a missing topic (to read or to write), a refused permission, an external sink's target that cannot
take the rows as configured."""
MAX_RESTART_BACKOFF_S = 30.0


@dataclass
class RestartBudget:
    """Restarts after recoverable failures: at most ``limit`` in a row without a checkpoint committed between
    them, each after a backoff that doubles from ``first_backoff_s`` up to ``MAX_RESTART_BACKOFF_S``. A run
    that commits again starts both over, so a connector running for months through the odd broker restart is
    not given up at its eleventh (as a budget for the run's whole life would)."""

    limit: int
    first_backoff_s: float
    in_a_row: int = 0
    total: int = 0
    """Every restart of the run, for the log: the count a connector's restarts show over its life."""

    def next_backoff(self, committed_since_last_restart: bool) -> float | None:
        """The backoff before the next restart; None once ``limit`` restarts in a row did not commit."""
        self.in_a_row = 1 if committed_since_last_restart else self.in_a_row + 1
        self.total += 1
        if self.in_a_row > self.limit:
            return None
        return min(self.first_backoff_s * 2.0 ** (self.in_a_row - 1), MAX_RESTART_BACKOFF_S)


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
    instance: str | None = None
    """This instance's name in the connector's group (``engine.instance.resolve_instance``)."""
    totals: RunTotals = field(default_factory=RunTotals)
    """What the run committed and how it ended, filled in as it goes (``RunTotals.line``)."""
    create_topics: bool = False
    """Create the source, sink and dead-letter topics that do not exist yet (``epochline run --create-topics``),
    with the broker's default partitions and replication, once Kafka answers."""


def bootstrap_from(flag: str | None) -> str:
    """The bootstrap address: the flag, else ``KAFKA_BOOTSTRAP``; neither is a clear error."""
    address = flag or os.environ.get("KAFKA_BOOTSTRAP")
    if not address:
        raise ConnectorFailed("no Kafka bootstrap address: pass --bootstrap-servers HOST:PORT or set KAFKA_BOOTSTRAP")
    return address


def run_connector(config: ConnectorConfig, options: RunOptions) -> None:
    """Run until stopped, the input ends (``stop_at_end``) or a permanent failure (``ConnectorFailed``).

    Bounded at every step: Kafka must answer within ``kafka.connect_timeout`` (else one line naming the
    address and what failed); a missing topic or a refused permission fails at once; transient failures
    restart from the last committed checkpoint with a growing backoff, at most ``max_restarts`` times in a row
    without a committed checkpoint (``RestartBudget``). The signal handlers are installed first, so SIGTERM
    during start-up, recovery or a backoff is honoured.
    """
    set_context(connector=config.name)
    stop = StopRequest()
    stop.install()
    try:
        _run(config, options, stop)
    except ImmediateStop as immediate:
        options.totals.outcome = "failed"
        raise ConnectorFailed(f"{config.name}: {immediate}") from immediate
    except BaseException:
        options.totals.outcome = "failed"
        raise


def _run(config: ConnectorConfig, options: RunOptions, stop: StopRequest) -> None:
    try:
        instance = resolve_instance(config, options.instance)
    except InstanceNameError as error:
        raise ConnectorFailed(f"{config.name}: {error}") from error
    set_context(connector=config.name, instance=instance.name)
    log.info("connector starting", extra={"source": config.source.topic, "sink": config.sink_target,
                                          "delivery": config.sink.delivery, "bootstrap": options.bootstrap})
    open_early(config)
    client = client_config(config)
    if not _kafka_answers(config, options, client, stop):
        return
    if options.create_topics:
        _create_missing_topics(config, options.bootstrap, client)
    options.totals.started = True
    metrics = Metrics()
    if config.metrics_port is not None:
        metrics.serve(config.metrics_port)
    stop_at = ({SOURCE_NAME: end_offsets(options.bootstrap, config.source.topic, client_config=client)}
               if options.stop_at_end else None)
    if options.progress is not None and stop_at is not None:
        options.progress.begin(stop_at)
    observer = options.progress.positions if options.progress is not None else None
    restarts = RestartBudget(options.max_restarts, options.restart_backoff_s)
    while True:
        pipeline = KafkaPipeline(config, options.bootstrap, metrics, options.crash_point, instance=instance,
                                 cycle_observer=observer, stop=stop, totals=options.totals)
        loop = EpochLoop(pipeline, EpochLoopSettings(
            checkpoint_interval_s=config.checkpoint.interval / 1000, stop_at=stop_at), stop=stop)
        try:
            loop.run()
            options.totals.outcome = "stopped" if stop.requested else "finished"
            log.info("connector stopped", extra={"connector": config.name,
                                                 "checkpoints": loop.checkpoints_committed})
            return
        except (StoppedBeforeStart, CallInterrupted) as stopped:
            log.info("connector stopped by a signal before it could finish a call to Kafka; the next start "
                     "resumes from the last committed checkpoint", extra={"connector": config.name,
                                                                         "reason": str(stopped)})
            return
        except PERMANENT_FAILURES as permanent:
            raise ConnectorFailed(f"{config.name}: {permanent}") from permanent
        except (SinkError, SourceUnavailable) as error:
            backoff = restarts.next_backoff(committed_since_last_restart=loop.checkpoints_committed > 0)
            if backoff is None:
                raise ConnectorFailed(f"{config.name}: giving up after {options.max_restarts} restarts in a row "
                                      f"without a committed checkpoint: {error}") from error
            log.warning("restarting connector from the last committed checkpoint",
                        extra={"connector": config.name, "error": str(error), "restart": restarts.total,
                               "in_a_row": restarts.in_a_row, "backoff_s": backoff})
            if stop.wait(backoff) or not _kafka_answers(config, options, client, stop):
                return


def _create_missing_topics(config: ConnectorConfig, bootstrap: str, client: dict[str, str]) -> None:
    topics = list(dict.fromkeys([config.source.topic, *([config.kafka_sink.topic] if config.kafka_sink else []),
                                 *([config.dead_letter.topic] if config.dead_letter else [])]))
    try:
        created = create_topics(bootstrap, topics, partitions=-1, timeout=config.kafka.connect_timeout / 1000,
                                client_config=client)
    except TopicAdminError as error:
        raise ConnectorFailed(f"{config.name}: --create-topics: {error}") from error
    for topic in created:
        log.info("topic created", extra={"topic": topic, "by": "--create-topics"})


def _kafka_answers(config: ConnectorConfig, options: RunOptions, client: dict[str, str], stop: StopRequest) -> bool:
    """True once Kafka answers; False when a stop was requested meanwhile; ``ConnectorFailed`` naming the
    address and what failed once ``kafka.connect_timeout`` has passed (or at once for refused credentials)."""
    try:
        check_connection(options.bootstrap, client, config.kafka.connect_timeout / 1000,
                         interrupted=lambda: stop.requested)
    except KafkaUnreachable as error:
        if stop.requested:
            log.info("connector stopped while waiting for Kafka", extra={"connector": config.name})
            return False
        raise ConnectorFailed(f"{config.name}: {error}") from error
    return True
