"""``epochline validate``: what can be checked before a connector runs, offline and, with ``--online``, on Kafka.

Offline: the config, its schemas, the sink format, the transform against the source schema and the sink
format against the transform's output (every column's type; ``schemas.compatibility``). Online, and
without reading or writing a record: Kafka answers within the connect timeout, the topics exist, and the
principal may read the source topic and the group and write the sink and dead-letter topics (the broker's
authorized operations). The transactional id is not checked: using it would fence a running instance.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
from pydantic import BaseModel, ValidationError

from connectors.admin import KafkaUnreachable, authorized_operations, check_connection
from engine.config import (
    ConfigError,
    ConnectorConfig,
    SinkConfig,
    SourceConfig,
    StepConfig,
    invalid_config,
    parse_config,
    read_config_file,
)
from engine.secrets import SecretReferenceError
from engine.transforms import OperatorConfigError
from engine.wiring import build_external_sink, check_sink_types, client_config, input_schema, steps_chain
from schemas import Format, SchemaError, make_format
from sinks import SinkAssignment, SinkError

OFFLINE_FAILURES = (SchemaError, OperatorConfigError)
_STEP_NAME = re.compile(r"step(\d+)-(sql|python|window)")
ModelT = TypeVar("ModelT", bound=BaseModel)


@dataclass(frozen=True)
class _Sections:
    """What the offline checks look at: the sections of a config that are valid on their own (None: not)."""

    source: SourceConfig | None
    steps: list[StepConfig] | None
    sink: SinkConfig | None
    base_dir: Path


def checked_config(path: Path, *, batch: bool = False) -> ConnectorConfig:
    """``epochline validate`` offline, for a config file and for a config sent to a worker (written to files
    as its task will read it): the config model, then the schemas, the sink format and the transform against
    the source schema. A ``ConfigError`` lists every problem found, each with its field: an unknown key does
    not hide a bad query, since the sections that are valid on their own are checked anyway."""
    raw = read_config_file(path)
    try:
        config = parse_config(raw, path.parent, path, batch=batch)
    except ConfigError as error:
        more = _offline_problems(_valid_sections(raw, path.parent))
        if more:
            raise invalid_config(error.problems + more, path) from None
        raise
    problems = _offline_problems(_Sections(config.source, config.transform, config.kafka_sink, config.base_dir))
    if problems:
        raise invalid_config(problems, path)
    return config


def _offline_problems(sections: _Sections) -> list[tuple[str, str]]:
    """Every failure of the offline checks as ``(field, message)``. A transform failure names its step
    (``transform.1.sql``) from the operator name in the message."""
    problems = []
    for field, check in _offline_checks(sections):
        try:
            check()
        except OFFLINE_FAILURES as error:
            step = _STEP_NAME.search(str(error)) if field == "transform" else None
            problems.append((f"transform.{step.group(1)}.{step.group(2)}" if step else field, str(error)))
    return problems


def _offline_checks(sections: _Sections) -> list[tuple[str, Callable[[], None]]]:
    """The offline checks in order, each with the config field it is about. The transform is checked against
    the schema the source check found; without one (the source schema failed, or is inferred from the
    records) its SQL is still parsed, and its Python functions and window specs are still made."""
    found: list[pa.Schema | None] = [None]
    source, steps, sink = sections.source, sections.steps, sections.sink
    written: list[Format | None] = [None]
    output: list[pa.Schema | None] = [None]

    def source_check() -> None:
        if source is not None:
            found[0] = input_schema(make_format(source.format_spec(sections.base_dir)))

    def sink_check() -> None:
        if sink is not None:
            written[0] = make_format(sink.format_spec(sections.base_dir))

    def transform_check() -> None:
        if steps is None:
            return
        chain = steps_chain(steps, source.event_time.column if source is not None else None)
        if found[0] is not None:
            output[0] = chain.validate(found[0])
        else:
            chain.check_without_schema()

    def sink_types_check() -> None:
        if sink is not None and output[0] is not None and written[0] is not None:
            check_sink_types(sink, output[0], written[0])

    return [("source", source_check), ("sink", sink_check), ("transform", transform_check),
            ("sink", sink_types_check)]


def _valid_sections(raw: object, base_dir: Path) -> _Sections:
    """The sections of ``raw`` (a config the model refused) that are valid on their own; the steps only when
    every one is, since a step's position names its operator."""
    if not isinstance(raw, dict):
        return _Sections(None, None, None, base_dir)
    transform = raw.get("transform", [])
    steps = [_valid(StepConfig, step) for step in (transform if isinstance(transform, list) else [transform])]
    valid_steps = [step for step in steps if step is not None]
    return _Sections(_valid(SourceConfig, raw.get("source")), valid_steps if len(valid_steps) == len(steps) else None,
                     _valid(SinkConfig, raw.get("sink")), base_dir.absolute())


def _valid(model: type[ModelT], data: object) -> ModelT | None:
    try:
        return model.model_validate(data)
    except ValidationError:
        return None


def validate_online(config: ConnectorConfig, bootstrap: str) -> list[str]:
    """Problems a run would hit on Kafka and at an external sink, one line each naming the topic, group,
    setting, table or privilege and what is missing."""
    return _kafka_problems(config, bootstrap) + _external_sink_problems(config)


def _external_sink_problems(config: ConnectorConfig) -> list[str]:
    """What the external sink's ``open`` refuses (server settings, table, privileges): it writes nothing."""
    try:
        sink = build_external_sink(config)
    except SecretReferenceError as error:
        return [f"sink: {error}"]
    if sink is None:
        return []
    try:
        sink.open(SinkAssignment(config.name, "validate"))
    except SinkError as error:
        return [f"sink: {error}"]
    finally:
        sink.close()
    return []


def _kafka_problems(config: ConnectorConfig, bootstrap: str) -> list[str]:
    client = client_config(config)
    try:
        check_connection(bootstrap, client, config.kafka.connect_timeout / 1000)
    except KafkaUnreachable as error:
        return [str(error)]
    needs = {config.source.topic: {"READ", "DESCRIBE"}}
    if config.kafka_sink is not None:
        needs[config.kafka_sink.topic] = {"WRITE", "DESCRIBE"}
    if config.dead_letter is not None:
        needs.setdefault(config.dead_letter.topic, set()).update({"WRITE", "DESCRIBE"})
    found = authorized_operations(bootstrap, list(needs), config.group_id, client)
    problems = [_problem(f"topic {topic!r}", found[topic], wanted) for topic, wanted in needs.items()]
    problems.append(_problem(f"consumer group {config.group_id!r}", found[config.group_id], {"READ"},
                             missing_ok=True))
    return [problem for problem in problems if problem]


def _problem(what: str, found: set[str] | str, wanted: set[str], missing_ok: bool = False) -> str:
    if isinstance(found, str):
        return "" if missing_ok and "does not exist" in found else f"{what}: {found}"
    lacking = sorted(wanted - found - ({"READ", "WRITE", "DESCRIBE"} if "ALL" in found else set()))
    return f"{what}: not authorized for {', '.join(lacking)}" if lacking else ""
