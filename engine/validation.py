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

import pyarrow as pa

from connectors.admin import KafkaUnreachable, authorized_operations, check_connection
from engine.config import ConnectorConfig
from engine.transforms import OperatorConfigError
from engine.wiring import build_chain, check_sink_types, client_config, input_schema, sink_format, source_format
from schemas import Format, SchemaError

OFFLINE_FAILURES = (SchemaError, OperatorConfigError)
_STEP_NAME = re.compile(r"step(\d+)-(sql|python|window)")


def validate_offline(config: ConnectorConfig) -> None:
    """Everything that can be checked without a broker: schemas load, the sink format builds, the transform
    accepts the source's schema and the sink format can write every column of the transform's output (when
    the source has an explicit schema). Raises the first failure."""
    for _, check in _offline_checks(config):
        check()


def offline_problems(config: ConnectorConfig) -> list[tuple[str, str]]:
    """The same checks, every failure as ``(field, message)``: what the worker's validate endpoint reports.
    A transform failure names its step (``transform.1.sql``) from the operator name in the message."""
    problems = []
    for field, check in _offline_checks(config):
        try:
            check()
        except OFFLINE_FAILURES as error:
            step = _STEP_NAME.search(str(error)) if field == "transform" else None
            problems.append((f"transform.{step.group(1)}.{step.group(2)}" if step else field, str(error)))
    return problems


def _offline_checks(config: ConnectorConfig) -> list[tuple[str, Callable[[], None]]]:
    """The offline checks in order, each with the config field it is about; the transform check uses the
    schema the source check found (none when the source schema failed or is not explicit)."""
    found: list[pa.Schema | None] = [None]
    written: list[Format | None] = [None]
    output: list[pa.Schema | None] = [None]

    def source() -> None:
        found[0] = input_schema(source_format(config))

    def sink() -> None:
        written[0] = sink_format(config)

    def transform() -> None:
        if found[0] is not None:
            output[0] = build_chain(config).validate(found[0])

    def sink_types() -> None:
        if output[0] is not None and written[0] is not None:
            check_sink_types(config, output[0], written[0])

    return [("source", source), ("sink", sink), ("transform", transform), ("sink", sink_types)]


def validate_online(config: ConnectorConfig, bootstrap: str) -> list[str]:
    """Problems a run would hit on Kafka, one line each naming the topic or group and what is missing."""
    client = client_config(config)
    try:
        check_connection(bootstrap, client, config.kafka.connect_timeout / 1000)
    except KafkaUnreachable as error:
        return [str(error)]
    needs = {config.source.topic: {"READ", "DESCRIBE"}, config.sink.topic: {"WRITE", "DESCRIBE"}}
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
