"""A connector config as the cluster stores it (a JSON object, schemas inline) turned into what a task runs:
a config file with its schema files beside it, validated by the same code as ``epochline validate``.

Why files: the task is an ``epochline run`` child process, so it reads exactly what a hand-run connector
reads, and a config that runs by hand runs on a worker. The worker decides where the task keeps its state
(``checkpoint.dir``) and on which port it serves its metrics; the rest is the user's.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import yaml

from engine.config import ConfigError, ConnectorConfig, load_config
from engine.state.files import write_atomically
from engine.validation import checked_config

CONFIG_FILE = "config.yaml"
AVRO_FORMATS = ("avro", "avro-confluent")


def with_name(config: Mapping[str, Any], name: str, where: str) -> dict[str, Any]:
    """``config`` named ``name``; a different ``name`` inside it is a ``ConfigError`` (the REST API's 400)."""
    given = config.get("name")
    if given is not None and given != name:
        raise ConfigError(f"{where}: the config's name {given!r} differs from the connector's name {name!r}",
                          [("name", f"{given!r} differs from the connector's name {name!r}")])
    return {**config, "name": name}


def write_task_config(config: Mapping[str, Any], directory: Path, *, state_dir: Path | None = None,
                      metrics_port: int | None = None) -> Path:
    """Write ``config.yaml`` (and ``source-schema``/``sink-schema`` files for inline schemas) into
    ``directory``; returns the config file's path."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)  # the config may hold literal secrets: the worker's user only, from the start
    raw = copy.deepcopy(dict(config))
    for side in ("source", "sink"):
        section = raw.get(side)
        if isinstance(section, dict) and isinstance(section.get("schema"), dict | list):
            suffix = ".avsc" if section.get("format") in AVRO_FORMATS else ".json"
            schema_file = directory / f"{side}-schema{suffix}"
            write_atomically(schema_file, [_schema_json(side, section["schema"])])
            section["schema"] = schema_file.name
    if state_dir is not None:
        checkpoint = raw.get("checkpoint")
        raw["checkpoint"] = {**(checkpoint if isinstance(checkpoint, dict) else {}), "dir": str(state_dir)}
    if metrics_port is not None:
        raw["metrics_port"] = metrics_port
    path = directory / CONFIG_FILE
    write_atomically(path, [yaml.safe_dump(raw, sort_keys=False).encode()])
    path.chmod(0o600)
    return path


def _schema_json(side: str, schema: object) -> bytes:
    """An inline schema as the JSON its file holds; one that JSON cannot hold (a YAML body's number keys,
    dates) is a ``ConfigError`` of that field."""
    try:
        return orjson.dumps(schema, option=orjson.OPT_INDENT_2)
    except orjson.JSONEncodeError as error:
        raise ConfigError(f"{side}.schema: an inline schema must be JSON: {error}",
                          [(f"{side}.schema", f"an inline schema must be JSON: {error}")]) from None


def load_task_config(config: Mapping[str, Any], directory: Path) -> ConnectorConfig:
    """``config`` written into ``directory`` and loaded back: a ``ConfigError`` names each bad field."""
    return load_config(write_task_config(config, directory))


@contextmanager
def loaded(config: Mapping[str, Any]) -> Iterator[ConnectorConfig]:
    """``config`` loaded from a temporary directory that lives as long as the block (status, Kafka operations)."""
    with tempfile.TemporaryDirectory(prefix="epochline-config-") as directory:
        yield load_task_config(config, Path(directory))


def field_problems(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every problem ``epochline validate`` would find offline, as ``(field, message)``: ``config`` written as
    its task would read it, then checked by the same function as a config file (``checked_config``)."""
    with tempfile.TemporaryDirectory(prefix="epochline-config-") as directory:
        try:
            checked_config(write_task_config(config, Path(directory)))
        except ConfigError as error:
            return error.problems
    return []


def keyed_state_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> str | None:
    """Why ``new`` cannot resume from ``old``'s keyed state, or None. Windows key their state by step (the
    changelog topic is named after it) and by key, size, slide and aggregates: a change to any of them would
    read state written under other rules."""
    before, after = _windows(old), _windows(new)
    if before == after:
        return None
    changed = sorted(step for step in before.keys() | after.keys() if before.get(step) != after.get(step))
    return (f"the change alters the keyed state of transform step(s) {changed} (window key, size, slide, "
            "aggregates or position): stop the connector and resend it with reset_state=true to start that "
            "state empty")


def _windows(config: Mapping[str, Any]) -> dict[int, Any]:
    steps = config.get("transform") or []
    if isinstance(steps, dict):
        steps = [steps]
    return {index: step["window"] for index, step in enumerate(steps) if isinstance(step, dict) and "window" in step}
