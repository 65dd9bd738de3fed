"""``epochline validate``: what can be checked before a connector runs, offline and, with ``--online``, on Kafka.

Offline: the config, its schemas, the sink format and the transform against the source schema. Online, and
without reading or writing a record: Kafka answers within the connect timeout, the topics exist, and the
principal may read the source topic and the group and write the sink and dead-letter topics (the broker's
authorized operations). The transactional id is not checked: using it would fence a running instance.
"""

from __future__ import annotations

from connectors.admin import KafkaUnreachable, authorized_operations, check_connection
from engine.config import ConnectorConfig
from engine.wiring import build_chain, client_config, input_schema, sink_format, source_format


def validate_offline(config: ConnectorConfig) -> None:
    """Everything that can be checked without a broker: schemas load, the sink format builds, and the
    transform accepts the source's schema (when the source has an explicit schema)."""
    schema = input_schema(source_format(config))
    sink_format(config)
    if schema is not None:
        build_chain(config).validate(schema)


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
