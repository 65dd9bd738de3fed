"""The one place a ``ConnectorConfig`` becomes the settings of sources, operators and sinks.

Streaming runs (``engine.checkpoint``) and batch jobs (``engine.batch``) both build their parts here, so a
config key means the same thing in both and a new key is wired once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import pyarrow as pa

from connectors.changelog import repartition_topic
from connectors.metadata import with_metadata_fields
from connectors.source import SourceSettings
from engine import secrets
from engine.config import ConnectorConfig, ExternalSinkConfig, SinkConfig, SourceConfig, StepConfig
from engine.transforms import Operator, OperatorChain, PythonOperator, SqlOperator, WindowOperator, WindowSpec
from engine.transforms import build_chain as chain_of
from engine.transforms.database import open_database_soon
from schemas import Format, FormatSpec, SchemaError, make_format
from schemas.compatibility import sink_problems
from sinks import AtLeastOnceKafkaSink, ExternalSink, Sink, SinkSettings, TransactionalKafkaSink, sink_plugin
from sinks.writer import written_columns

SOURCE_NAME = "source"
"""The name of the config's source; streams added while running bring their own names."""
REPARTITION_SOURCE = "repartition"
"""The name of the second source of a connector whose rows are re-keyed (``engine.transforms.repartition``)."""

CrashPoint = Callable[[str], None]
"""Called with the name of a protocol moment (``between-flush-and-commit``, ...); crash tests kill the
process there (``engine.testing.faults``). Production runs pass none."""


def build_operator(step: StepConfig, index: int, event_time_column: str | None = None) -> Operator:
    """Step ``index`` of ``transform``; its name (``step<index>-<kind>``) keys its checkpointed state. A window
    without a ``time_column`` places rows by ``event_time_column``, the source's event time."""
    name = f"step{index}"
    if step.sql is not None:
        return SqlOperator(step.sql, name=f"{name}-sql")
    if step.python is not None:
        return PythonOperator(step.python, name=f"{name}-python")
    assert step.window is not None
    window = step.window
    spec = WindowSpec(kind=window.kind, size_ms=window.size, slide_ms=window.slide, key=list(window.key),
                      time_column=window.time_column or event_time_column, aggregates=dict(window.aggregates))
    return WindowOperator(spec, name=f"{name}-window")


def build_chain(config: ConnectorConfig) -> OperatorChain:
    return steps_chain(config.transform, config.source.event_time.column)


def steps_chain(steps: Sequence[StepConfig], event_time_column: str | None) -> OperatorChain:
    """The chain of ``transform`` steps alone: what ``build_chain`` makes, and what validation checks of a
    config whose other sections may be invalid."""
    return chain_of([build_operator(step, index, event_time_column) for index, step in enumerate(steps)])


def open_early(config: ConnectorConfig) -> None:
    """Start opening, in the background, what a run of ``config`` waits for and no broker is needed for: the
    DuckDB database when a step is SQL (``open_database_soon``; a SQL step made later finds it opening).
    Called first thing, the 50-80 ms of the opening overlap the connection check and the fence instead of
    starting after them."""
    if any(step.sql is not None for step in config.transform):
        open_database_soon()


def client_config(config: ConnectorConfig) -> dict[str, str]:
    """``kafka.client``, secret references resolved: given to every Kafka client the connector makes (over
    ``connectors.clients.CLIENT_DEFAULTS``). Resolved here, when a client is about to be made, so the secrets
    never sit in the loaded config."""
    return secrets.resolve_all(config.kafka.client, config.base_dir)


def source_settings(config: ConnectorConfig, source: SourceConfig | None = None,
                    name: str = SOURCE_NAME) -> SourceSettings:
    """``source`` (default: the config's) as a ``KafkaSource``'s settings."""
    source = source or config.source
    return SourceSettings(
        name=name,
        topic=source.topic,
        format=source.format_spec(config.base_dir),
        max_batch_records=source.max_batch_records,
        max_batch_bytes=source.max_batch_bytes,
        start_from=source.start_from,
        event_time_column=source.event_time.column,
        allowed_lateness_ms=source.event_time.allowed_lateness,
        idle_timeout_ms=source.event_time.idle_timeout,
        on_error="halt" if source.on_error == "halt" else "dead-letter",  # fail-item: the batch job's call
        consumer_config={**client_config(config), **source.consumer},
    )


def repartition_source_settings(source: SourceSettings, config: ConnectorConfig) -> SourceSettings:
    """The second source of a re-keyed connector: its repartition topic in ``arrow-ipc``, with the source's
    event-time rules (``engine.transforms.repartition``)."""
    return replace(source, name=REPARTITION_SOURCE, topic=repartition_topic(config.name),
                   format=FormatSpec("arrow-ipc"), start_from="earliest", on_error="halt", align_event_time=False)


def sink_settings(config: ConnectorConfig, transactional_id: str, group_id: str) -> SinkSettings:
    """The Kafka side of the epoch; with an external sink it has no output topic, only what always commits
    in the Kafka transaction (offsets, dead letters, changelogs)."""
    sink, kafka = config.sink, config.kafka_sink
    return SinkSettings(
        topic=kafka.topic if kafka else None,
        transactional_id=transactional_id,
        group_id=group_id,
        dead_letter_topic=config.dead_letter.topic if config.dead_letter else None,
        key_column=kafka.key if kafka else None,
        include_metadata=tuple(kafka.include_metadata) if kafka else (),
        transaction_timeout_ms=sink.transaction_timeout,
        producer_config={**client_config(config), **sink.producer},
        client_config=client_config(config),
    )


def source_format(config: ConnectorConfig) -> Format:
    return make_format(config.source.format_spec(config.base_dir))


def sink_format(config: ConnectorConfig) -> Format | None:
    """How the Kafka sink encodes rows; None when rows go to an external sink."""
    return make_format(config.kafka_sink.format_spec(config.base_dir)) if config.kafka_sink else None


def check_sink_types(sink: SinkConfig, output: pa.Schema, value_format: Format) -> None:
    """``SchemaError`` naming every column of ``output`` (the transform's rows, or the source's without one)
    that the sink's ``value_format`` cannot write (``schemas.compatibility``): checked by ``validate`` and at
    start, so such a pairing fails before a record is read instead of at the first epoch."""
    columns = pa.schema([output.field(name) for name in written_columns(output.names, sink.include_metadata)])
    problems = sink_problems(columns, value_format)
    if problems:
        raise SchemaError(f"sink format {value_format.name} cannot write the output to topic {sink.topic!r}: "
                          + "; ".join(map(str, problems)))


def build_sink(config: ConnectorConfig, bootstrap: str, *, transactional_id: str, group_id: str,
               before_commit: Callable[[], None] | None = None, value_format: Format | None = None) -> Sink:
    """The Kafka sink ``sink.delivery`` asks for, writing ``value_format`` (the config's sink format unless
    given); ``before_commit`` runs right before a transaction commits. With an external sink
    (``build_external_sink``) this is the transactional producer its epochs commit by."""
    settings = sink_settings(config, transactional_id, group_id)
    value_format = value_format or sink_format(config)
    if config.sink.delivery == "exactly-once":
        return TransactionalKafkaSink(settings, bootstrap, value_format, before_commit)
    return AtLeastOnceKafkaSink(settings, bootstrap, value_format)


def build_external_sink(config: ConnectorConfig) -> ExternalSink | None:
    """The config's sink beyond Kafka, its settings' secret references (``${env:...}``, ``${file:...}``)
    resolved now, as a client is about to be made; None for a Kafka sink."""
    if not isinstance(config.sink, ExternalSinkConfig):
        return None
    settings = {key: secrets.resolve(value, config.base_dir) if isinstance(value, str) else value
                for key, value in config.sink.settings.items()}
    return sink_plugin(config.sink.type).create(settings)


def input_schema(value_format: Format) -> pa.Schema | None:
    """The rows a cycle sees: the value columns plus the Kafka metadata columns; None when inferred."""
    if value_format.arrow_schema is None:
        return None
    return with_metadata_fields(value_format.arrow_schema)
