"""The per-topic connector config (YAML), validated with pydantic before anything touches Kafka.

Why strict: a typo in a connector config (``chekpoint:``) silently falling back to a default is how
exactly-once jobs end up at-least-once. Unknown keys are errors that name the key and where it is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from connectors.metadata import TIMESTAMP
from connectors.source import DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_BATCH_RECORDS
from engine.bounded_yaml import YamlRefused, read_yaml
from engine.names import check_name
from schemas import FormatSpec
from schemas.factory import FormatName, SubjectStrategy
from schemas.text_files import TextFileError, read_text_file
from sinks.api import SinkSettingsError, sink_plugin


class ConfigError(ValueError):
    """A connector config is unreadable or invalid; the message names the file and the key.

    ``problems`` holds the same findings as ``(field, message)`` pairs (``transform.0.sql``, ``(top level)``),
    so the worker's validate endpoint reports them per field."""

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems if problems is not None else [("(top level)", message)]


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1}


def duration_ms(value: Any) -> int:
    """``"500ms"``, ``"1s"``, ``"2m"``, ``"1h"``, ``"1d"``; a bare number means milliseconds."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        return int(value)
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"not a duration: {value!r} (use e.g. 500ms, 1s, 2m, 1h)")
    return int(float(match.group(1)) * _UNIT_MS[match.group(2)])


DurationMs = Annotated[int, BeforeValidator(duration_ms)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FormatConfig(_Strict):
    """A topic and how its values are encoded (shared by source and sink)."""

    topic: str
    format: FormatName = "json"
    schema_path: Path | None = Field(default=None, alias="schema")
    registry_url: str | None = None
    schema_dir: Path | None = None
    schema_id: int | None = None
    message: str | None = None  # protobuf-confluent: pins the message type (else the first record's framing names it)
    auto_register: bool = True  # encoding with a registry: register the schema, or only look it up
    subject_strategy: SubjectStrategy = "topic"

    def format_spec(self, base: Path) -> FormatSpec:
        """Paths in a config are relative to the config file, so a config works from any directory."""
        return FormatSpec(
            format=self.format,
            schema=_resolve(base, self.schema_path),
            registry_url=self.registry_url,
            schema_dir=_resolve(base, self.schema_dir),
            schema_id=self.schema_id,
            message=self.message,
            auto_register=self.auto_register,
            subject_strategy=self.subject_strategy,
            topic=self.topic,
        )


def _resolve(base: Path, path: Path | None) -> Path | None:
    return None if path is None else (path if path.is_absolute() else base / path)


class EventTimeConfig(_Strict):
    column: str | None = None  # None: the Kafka record timestamp
    allowed_lateness: DurationMs = 0
    idle_timeout: DurationMs = 30_000


class SourceConfig(FormatConfig):
    start_from: Literal["earliest", "latest"] = "earliest"
    event_time: EventTimeConfig = EventTimeConfig()
    max_batch_records: int = Field(default=DEFAULT_MAX_BATCH_RECORDS, gt=0)
    max_batch_bytes: int = Field(default=DEFAULT_MAX_BATCH_BYTES, gt=0)
    on_error: Literal["dead-letter", "halt", "fail-item"] = "dead-letter"  # fail-item: batch jobs only
    consumer: dict[str, str] = {}


class WindowConfig(_Strict):
    kind: Literal["tumbling", "hopping"] = "tumbling"
    size: DurationMs
    slide: DurationMs | None = None
    key: list[str]
    time_column: str | None = None
    aggregates: dict[str, str]


class StepConfig(_Strict):
    """One transform step: exactly one of ``sql``, ``python`` (module:function) or ``window``."""

    sql: str | None = None
    python: str | None = None
    window: WindowConfig | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StepConfig:
        given = [name for name in ("sql", "python", "window") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"a transform step needs exactly one of sql, python, window (got {given or 'none'})")
        return self


PRODUCER_KEYS_SET_BY_EPOCHLINE = ("transactional.id", "transaction.timeout.ms", "enable.idempotence")
"""What ``sink.producer`` may not set: the transactional id fences an instance's previous incarnation only if
it is the one epochline makes, the transaction timeout is ``sink.transaction_timeout`` (which bounds every
transactional call, ``sinks.transactional.wedged_after_s``), and a transactional producer is idempotent."""


class SinkConfig(FormatConfig):
    """The Kafka sink (``type: kafka``, the default): rows to a topic in the epoch's transaction."""

    type: Literal["kafka"] = "kafka"
    delivery: Literal["exactly-once", "at-least-once"] = "exactly-once"
    key: str | None = None  # a column whose value becomes the record key
    include_metadata: list[str] = []  # __kafka_* columns to keep in the output
    transaction_timeout: DurationMs = 10_000  # short, as Kafka Streams: a new owner waits this long at most
    producer: dict[str, str] = {}

    @model_validator(mode="after")
    def _no_settings_epochline_makes(self) -> SinkConfig:
        taken = [key for key in PRODUCER_KEYS_SET_BY_EPOCHLINE if key in self.producer]
        if taken:
            raise ValueError(f"sink.producer may not set {taken}: epochline sets them (the transactional id from "
                             f"the connector and instance names, the timeout from sink.transaction_timeout)")
        return self


class ExternalSinkConfig(BaseModel):
    """A sink beyond Kafka (``sink: {type: postgres, ...}``): its plugin (``sinks.api.sink_plugin``) checks
    every other key. The epoch's Kafka transaction still carries the offsets, dead letters and changelogs,
    so ``transaction_timeout`` and ``producer`` mean what they mean for the Kafka sink; the rows commit
    exactly once by two-phase commit behind it."""

    model_config = ConfigDict(extra="allow", frozen=True)

    type: str
    transaction_timeout: DurationMs = 10_000
    producer: dict[str, str] = {}

    @property
    def delivery(self) -> Literal["exactly-once"]:
        """The Kafka side of the epoch is always transactional: it is the external sink's decision."""
        return "exactly-once"

    @property
    def settings(self) -> dict[str, object]:
        """The plugin's settings: every key but the ones above."""
        return dict(self.model_extra or {})

    @model_validator(mode="after")
    def _plugin_accepts_settings(self) -> ExternalSinkConfig:
        """The plugin's own words, without pydantic's "Value error, " before them."""
        try:
            sink_plugin(self.type).check_settings(self.settings)
        except SinkSettingsError as error:
            raise PydanticCustomError("sink_settings", "{problem}", {"problem": str(error)}) from None
        return self


def _sink_type(data: Any) -> str:
    """``kafka`` (the default) or ``external``: which model a ``sink`` mapping is checked by."""
    kind = data.get("type", "kafka") if isinstance(data, dict) else getattr(data, "type", "kafka")
    return "kafka" if kind == "kafka" else "external"


AnySinkConfig = Annotated[Annotated[SinkConfig, Tag("kafka")] | Annotated[ExternalSinkConfig, Tag("external")],
                          Discriminator(_sink_type)]


class DeadLetterConfig(_Strict):
    topic: str


class CheckpointConfig(_Strict):
    interval: DurationMs = 1_000
    dir: Path | None = None  # default: ./state/<name>
    timeout: DurationMs = 5_000


CLIENT_KEY_PREFIXES = ("security.protocol", "sasl.", "ssl.", "client.id", "client.dns.lookup", "socket.",
                       "reconnect.")


class KafkaConfig(_Strict):
    """How every client of the connector reaches Kafka: the connect timeout and the security settings."""

    connect_timeout: DurationMs = 30_000  # Kafka unreachable this long at start: fail, naming the address
    client: dict[str, str] = {}  # security.protocol, sasl.*, ssl.*; values may be ${env:NAME}/${file:PATH:KEY}

    @model_validator(mode="after")
    def _only_connection_settings(self) -> KafkaConfig:
        unknown = sorted(key for key in self.client if not key.startswith(CLIENT_KEY_PREFIXES))
        if unknown:
            allowed = ", ".join(CLIENT_KEY_PREFIXES)
            raise ValueError(f"kafka.client takes connection and security settings only ({allowed}...), not "
                             f"{unknown}: put consumer or producer settings in source.consumer or sink.producer")
        return self


class BatchConfig(_Strict):
    """How ``epochline batch run`` splits the source into items and where it keeps its ledger."""

    item_records: int = Field(default=10_000, gt=0)  # offsets per item (transaction markers included)
    store: str | None = None  # sqlite:///path, a path, or postgresql://...; default: <checkpoint dir>/batches.db


class ConnectorConfig(_Strict):
    name: Annotated[str, AfterValidator(check_name)]
    source: SourceConfig
    transform: list[StepConfig] = []
    sink: AnySinkConfig
    dead_letter: DeadLetterConfig | None = None
    late_rows: Literal["drop", "dead-letter"] = "dead-letter"
    on_transform_error: Literal["halt", "dead-letter"] | None = None  # default: by sink.delivery
    checkpoint: CheckpointConfig = CheckpointConfig()
    batch: BatchConfig = BatchConfig()
    kafka: KafkaConfig = KafkaConfig()
    metrics_port: int | None = None
    _base_dir: Path = PrivateAttr(default=Path("."))

    @model_validator(mode="before")
    @classmethod
    def _transform_may_be_one_step(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("transform"), dict):
            data = {**data, "transform": [data["transform"]]}
        return data

    @model_validator(mode="after")
    def _nothing_is_lost(self) -> ConnectorConfig:
        """Bad records must land somewhere: a dead-letter topic, or a halt."""
        needs_topic = [
            reason for reason, wanted in (
                ("source.on_error: dead-letter", self.source.on_error == "dead-letter"),
                ("late_rows: dead-letter", self.late_rows == "dead-letter"),
                ("on_transform_error: dead-letter", self.transform_errors == "dead-letter"),
            ) if wanted
        ]
        if needs_topic and self.dead_letter is None:
            raise ValueError(
                f"dead_letter.topic is required by {', '.join(needs_topic)} "
                "(or set those to halt/drop so no bad record is lost silently)"
            )
        if self.sink.transaction_timeout < self.checkpoint.interval + self.checkpoint.timeout:
            raise ValueError(
                f"sink.transaction_timeout ({self.sink.transaction_timeout} ms) must exceed checkpoint.interval "
                f"plus checkpoint.timeout ({self.checkpoint.interval + self.checkpoint.timeout} ms): a transaction "
                "open for one epoch would otherwise be aborted by the broker before it commits"
            )
        if self.sink.transaction_timeout > 900_000:
            raise ValueError("sink.transaction_timeout exceeds the broker default transaction.max.timeout.ms (15m)")
        return self

    @model_validator(mode="after")
    def _one_event_time(self) -> ConnectorConfig:
        """Windows close, and rows are judged late, by one event time: the source's. A window's
        ``time_column`` defaults to it; naming another column would judge rows by one time and place them
        in windows by another, so a row on time for the first could fall in a window already emitted."""
        source_column = self.source.event_time.column or TIMESTAMP
        for index, step in enumerate(self.transform):
            if step.window is not None and step.window.time_column not in (None, source_column):
                raise ValueError(
                    f"transform step {index}: window time_column {step.window.time_column!r} is not the source's "
                    f"event time (source.event_time.column: {self.source.event_time.column or 'the Kafka timestamp'}"
                    f"); set source.event_time.column: {step.window.time_column}, and time_column may be left out")
        return self

    @property
    def transform_errors(self) -> Literal["halt", "dead-letter"]:
        """What a failing transform does: exactly-once halts (after one recovery, in case the failure was
        transient); at-least-once dead-letters the cycle's rows and goes on, unless configured otherwise."""
        if self.on_transform_error is not None:
            return self.on_transform_error
        return "halt" if self.sink.delivery == "exactly-once" else "dead-letter"

    @property
    def state_dir(self) -> Path:
        directory = self.checkpoint.dir or Path("state") / self.name
        return directory if directory.is_absolute() else self._base_dir / directory

    @property
    def base_dir(self) -> Path:
        """The config file's directory: relative paths in the config are resolved against it."""
        return self._base_dir

    @property
    def sink_target(self) -> str:
        """Where rows go, as logs and ``validate`` name it: the Kafka topic, or the external sink's type."""
        return self.sink.topic if isinstance(self.sink, SinkConfig) else f"{self.sink.type} sink"

    @property
    def kafka_sink(self) -> SinkConfig | None:
        """The sink as a Kafka topic, or None when the rows go to an external sink."""
        return self.sink if isinstance(self.sink, SinkConfig) else None

    @property
    def group_id(self) -> str:
        """The consumer group whose committed offsets (with checkpoint ids) are the pipeline's progress."""
        return f"epochline-{self.name}"


SINK_TAGS = ("kafka", "external")
"""The tags ``AnySinkConfig`` puts in an error's location after ``sink``: not keys of the config."""


def _field_problems(error: ValidationError) -> list[tuple[str, str]]:
    return [(".".join(str(part) for part in _config_location(problem["loc"])) or "(top level)",
             "unknown key" if problem["type"] == "extra_forbidden" else problem["msg"]) for problem in error.errors()]


def _config_location(location: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """An error's location as the keys of the config: ``sink.kafka.topic`` is ``sink.topic``."""
    if location[:1] == ("sink",) and location[1:2] and location[1] in SINK_TAGS:
        return location[:1] + location[2:]
    return location


def invalid_config(problems: list[tuple[str, str]], where: Path | str) -> ConfigError:
    """One ``ConfigError`` listing every ``(field, message)`` problem: one line for one problem (the CLI's
    one-line error), a line each under a heading for several."""
    if len(problems) == 1:
        field, message = problems[0]
        return ConfigError(f"invalid connector config {where}: {field}: {message}", problems)
    lines = [f"invalid connector config {where}:", *(f"  {field}: {message}" for field, message in problems)]
    return ConfigError("\n".join(lines), problems)


def _batch_only_problems(config: ConnectorConfig, batch: bool) -> list[tuple[str, str]]:
    """Keys valid for one kind of job only: a streaming run cannot fail an item, and a bounded batch job
    has no stream of watermarks to close windows with."""
    if batch:
        problems = [(f"transform.{index}.window", "window steps are not supported in batch jobs (use sql or python)")
                    for index, step in enumerate(config.transform) if step.window is not None]
        if not isinstance(config.sink, SinkConfig):
            problems.append(("sink.type", f"a batch job commits its items to Kafka; sink type "
                                          f"{config.sink.type!r} is for streaming runs (epochline run) only"))
        elif config.sink.delivery != "exactly-once":
            problems.append(("sink.delivery", "a batch job commits every item in a Kafka transaction, "
                                              "so only exactly-once is supported"))
        return problems
    if config.source.on_error == "fail-item":
        return [("source.on_error", "'fail-item' is only valid for batch jobs (epochline batch run); "
                                    "use dead-letter or halt")]
    return []


def parse_config(raw: object, base_dir: Path, where: Path | str, *, batch: bool = False) -> ConnectorConfig:
    """Validate an already-parsed config mapping (a YAML file, a REST body); ``where`` names it in errors and
    relative paths in it resolve against ``base_dir``."""
    if not isinstance(raw, dict):
        raise ConfigError(f"connector config {where} must be a mapping of keys, not {type(raw).__name__}")
    try:
        config = ConnectorConfig.model_validate(raw)
    except ValidationError as error:
        raise invalid_config(_field_problems(error), where) from None
    problems = _batch_only_problems(config, batch)
    if problems:
        raise invalid_config(problems, where)
    config._base_dir = base_dir.absolute()
    return config


def load_config(path: Path | str, *, batch: bool = False) -> ConnectorConfig:
    """Read and validate a connector config; ``batch`` selects the rules of ``epochline batch run``."""
    path = Path(path)
    return parse_config(read_config_file(path), path.parent, path, batch=batch)


def read_config_file(path: Path) -> Any:
    """The YAML of a connector config file, read with the bounds of ``engine.bounded_yaml``."""
    try:
        return read_yaml(read_text_file(path, "connector config"))
    except TextFileError as error:
        raise ConfigError(str(error)) from error
    except YamlRefused as error:
        raise ConfigError(f"connector config {path}: {error}") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"connector config {path} is not valid YAML: {error}") from error
