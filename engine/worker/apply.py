"""``epochline connectors apply DIR``: what a folder of connector configs asks a worker to change, decided offline.

Why a plan first: applying a folder is declarative (the folder is what should run), so the interesting output
is the difference — which connectors are new, which change and therefore restart, which would be deleted — and
``--dry-run`` must be able to show exactly that without touching the worker. Nothing here talks to it: the CLI
reads the worker's configs, asks :func:`plan` and then makes the calls.

Two things make a config on disk differ in form from the one the worker holds, and both are handled here:
schema files are inlined (the worker has no shared disk, so a path would name nothing there), and the worker
shows secret-looking values redacted, so both sides are compared redacted (:func:`redact`).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from engine.config import ConfigError, ConnectorConfig, FormatConfig, load_config, read_config_file
from engine.secrets import redacted_tree
from schemas.text_files import TextFileError, read_text_file

CONFIG_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class ApplyPlan:
    """Connector names by what applying the folder does to them, each list sorted."""

    create: list[str]
    update: list[str]  # the config differs: the worker restarts these connectors
    delete: list[str]  # only when pruning: on the worker, not in the folder
    unchanged: list[str]

    @property
    def changes_nothing(self) -> bool:
        return not (self.create or self.update or self.delete)


def config_files(directory: Path) -> list[Path]:
    """The folder's ``*.yaml`` / ``*.yml`` files, sorted, not recursive: a sub-folder may hold other things
    (batch job configs, examples) that must not start running on the worker by accident."""
    if not directory.is_dir():
        raise ConfigError(f"{directory} is not a directory of connector configs")
    return sorted(path for path in directory.iterdir() if path.is_file() and path.suffix in CONFIG_SUFFIXES)


def desired_configs(directory: Path) -> dict[str, dict[str, Any]]:
    """Every connector config in the folder by name, validated as ``epochline validate`` does, as the raw
    mapping written in the file but with its schema files inlined; two files naming one connector are an error
    (which one would win is an accident of file names)."""
    found: dict[str, dict[str, Any]] = {}
    origin: dict[str, Path] = {}
    for path in config_files(directory):
        config = load_config(path)
        if config.name in origin:
            raise ConfigError(f"{path}: connector {config.name!r} is already declared in {origin[config.name]}")
        origin[config.name] = path
        found[config.name] = inlined(path, config)
    return found


def inlined(path: Path, config: ConnectorConfig) -> dict[str, Any]:
    """The file's mapping with ``source.schema`` / ``sink.schema`` replaced by the schema they name (JSON
    Schema or Avro, both JSON), resolved relative to the config file as ``epochline run`` resolves them."""
    raw: dict[str, Any] = read_config_file(path)  # load_config just read and validated it
    for section, settings in (("source", config.source), ("sink", config.kafka_sink)):
        schema = schema_file(config, settings) if settings is not None else None
        if schema is not None:
            raw[section] = {**raw[section], "schema": read_schema(path, schema)}
    return raw


def schema_file(config: ConnectorConfig, settings: FormatConfig) -> Path | None:
    return settings.format_spec(config.base_dir).schema


def read_schema(config_path: Path, schema: Path) -> Any:
    """A schema file's parsed content; the error names the config that refers to it."""
    try:
        return json.loads(read_text_file(schema, "schema file"))
    except TextFileError as error:
        raise ConfigError(f"{config_path}: {error}") from error
    except ValueError as error:
        raise ConfigError(f"{config_path}: schema file {schema} is not JSON ({error}); only JSON Schema and "
                          "Avro schemas can be sent to a worker inline") from error


def redact(config: Mapping[str, Any]) -> Any:
    """``config`` as the worker's API shows it (:func:`engine.secrets.redacted_tree`: under a secret-looking key,
    at any depth, every value that is not a ``${env:..}`` / ``${file:..}`` reference is ``[redacted]``).

    Applied to both sides of a comparison, so a worker that redacts more or less than expected still compares
    equal: a secret changed only on disk cannot be seen through the API and so counts as unchanged."""
    return redacted_tree(config)


def normalised(config: Mapping[str, Any]) -> str:
    """One canonical text per config: redacted, keys sorted, so equal configs compare equal as strings."""
    return json.dumps(redact(config), sort_keys=True, default=str)


def plan(desired: Mapping[str, Mapping[str, Any]], current: Mapping[str, Mapping[str, Any]],
         prune: bool) -> ApplyPlan:
    """What to do so the worker runs ``desired``; without ``prune`` connectors only on the worker are left alone."""
    both = sorted(desired.keys() & current.keys())
    update = [name for name in both if normalised(desired[name]) != normalised(current[name])]
    return ApplyPlan(
        create=sorted(desired.keys() - current.keys()),
        update=update,
        delete=sorted(current.keys() - desired.keys()) if prune else [],
        unchanged=[name for name in both if name not in update],
    )


def _yaml_lines(config: Mapping[str, Any] | None) -> list[str]:
    if config is None:
        return []
    return yaml.safe_dump(redact(config), sort_keys=True).splitlines(keepends=True)


def diff_text(name: str, current: Mapping[str, Any] | None, desired: Mapping[str, Any] | None) -> str:
    """A unified diff of the worker's config (None: there is none yet) against the folder's, as YAML.

    Both sides are redacted: the diff is printed, and a secret on disk must not reach a terminal or a CI log."""
    return "".join(difflib.unified_diff(_yaml_lines(current), _yaml_lines(desired),
                                        fromfile=f"{name} (worker)", tofile=f"{name} (desired)"))


__all__ = ["ApplyPlan", "config_files", "desired_configs", "diff_text", "inlined", "normalised", "plan", "redact"]
