"""The public sink API: how a system other than Kafka joins a checkpoint epoch, and how it is plugged in.

Why two-phase commit: librdkafka cannot resume a transaction, so the epoch's Kafka transaction (offsets with
the checkpoint id, dead letters, state changelogs) stays the one commit point, and an external sink follows
its decision. During the epoch the sink writes into something of its own that nobody sees yet (``write``);
at the checkpoint it makes that durable without publishing it (``prepare``); the Kafka transaction commits;
then the sink publishes (``commit``). A process that dies anywhere in between leaves at most one prepared
epoch per instance, which the next start resolves (``recover``): published when Kafka says the checkpoint
committed, thrown away otherwise.

A sink is found by its ``type`` (``sink: {type: postgres, ...}`` in a connector config): first among the
plugins installed under the entry-point group ``epochline.sinks``, then among the ones epochline ships
(``BUILTIN_SINKS``), so a source checkout finds them without being installed. A type of the form
``module:attribute`` names a plugin directly (Kafka Connect's ``connector.class``), so a sink in the user's
own code needs no package and no installation, only to be importable (``PYTHONPATH``).
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Protocol

import pyarrow as pa

__all__ = [
    "BUILTIN_SINKS",
    "ENTRY_POINT_GROUP",
    "ExternalSink",
    "Guarantee",
    "RefusedRow",
    "SinkAssignment",
    "SinkPlugin",
    "SinkSettingsError",
    "UnknownSinkType",
    "sink_plugin",
]

ENTRY_POINT_GROUP = "epochline.sinks"
BUILTIN_SINKS = {"postgres": "sinks.postgres:PLUGIN"}
"""The sink plugins epochline ships, by type: ``module:attribute``, as an entry point names them."""


class Guarantee(enum.Enum):
    """What a sink promises when a process dies at any moment of an epoch (Kafka Connect's
    ``ExactlyOnceSupport``, with the middle ground made explicit)."""

    EXACTLY_ONCE = "exactly-once"
    """Each row is published once: the sink prepares, and publishes only what Kafka committed."""
    IDEMPOTENT = "idempotent"
    """Rows may be written again after a crash, but writing a row twice leaves what writing it once does
    (an upsert by key)."""
    AT_LEAST_ONCE = "at-least-once"
    """Rows may be published twice after a crash."""


class SinkSettingsError(ValueError):
    """A sink's settings are invalid; the message names the setting (the config loader adds ``sink.``)."""


class UnknownSinkType(SinkSettingsError):
    """No installed plugin and no built-in sink has this type."""


@dataclass(frozen=True)
class SinkAssignment:
    """Whom a sink writes for: the connector and the instance of it. The pair names the instance's epochs
    everywhere (the committed offsets' metadata, a prepared transaction's id), so recovery can tell an
    instance's own prepared epochs from every other's."""

    connector: str
    instance: str


@dataclass(frozen=True)
class RefusedRow:
    """A row the external system refused for a reason of the row's own (a value out of range, a constraint):
    the rest of the epoch goes on and this row goes to the dead-letter topic with ``reason``. ``index`` is
    its position in the batch given to ``write``, whose Kafka metadata columns say where it came from."""

    index: int
    reason: str


class ExternalSink(Protocol):
    """A sink beyond Kafka, driven through each epoch by the pipeline in this order:

    ``open`` once, ``recover`` once, then per epoch any number of ``write`` followed by either ``prepare``
    and (once the Kafka transaction committed) ``commit``, or ``abort``; ``close`` at the end.
    """

    guarantee: Guarantee

    def open(self, assignment: SinkAssignment) -> None:
        """Connect and check everything a first epoch needs (the target exists, the permissions, the server's
        settings), so a mistake fails the start with one line naming it instead of the first checkpoint."""
        ...

    def recover(self, last_committed_checkpoint_id: int | None) -> None:
        """Resolve what an earlier incarnation of this instance left prepared: publish every prepared epoch
        whose id is at most ``last_committed_checkpoint_id`` (Kafka committed it), discard the rest (None:
        nothing ever committed). Called after the earlier incarnation was fenced, so it cannot commit any
        more. Nothing prepared is left afterwards."""
        ...

    def write(self, batch: pa.Table) -> list[RefusedRow]:
        """Add the rows to the open epoch, invisible to readers until ``commit``; returns the rows the system
        refused (each to be dead-lettered). Must not publish anything: a sink that does is at-least-once."""
        ...

    def prepare(self, checkpoint_id: int) -> None:
        """Make the epoch's rows durable under ``checkpoint_id`` without publishing them; after this returns
        the epoch survives a crash of this process and can be published or discarded by ``recover``."""
        ...

    def commit(self, checkpoint_id: int) -> None:
        """Publish the prepared epoch: the Kafka transaction of ``checkpoint_id`` has committed."""
        ...

    def abort(self, checkpoint_id: int | None) -> None:
        """Discard the open or prepared epoch: its Kafka transaction was aborted (None: no id reserved yet)."""
        ...

    def close(self) -> None:
        """Release connections. Leaves a prepared epoch alone: whether it commits is Kafka's to say, at the
        next start's ``recover``."""
        ...


class SinkPlugin(Protocol):
    """What an ``epochline.sinks`` entry point names: checks a config's settings and makes the sink."""

    def check_settings(self, settings: Mapping[str, object]) -> None:
        """Raise ``SinkSettingsError`` naming the setting when ``settings`` (the ``sink`` mapping without
        ``type``, secret references unresolved) cannot work; touch no network."""
        ...

    def create(self, settings: Mapping[str, object]) -> ExternalSink:
        """The sink for ``settings`` (checked, secret references resolved); it connects in ``open``."""
        ...


def sink_plugin(sink_type: str) -> SinkPlugin:
    """The plugin for ``sink_type``: ``module:attribute`` imported, else an installed ``epochline.sinks`` entry
    point, else a built-in one."""
    if ":" in sink_type:
        return _imported_plugin(sink_type)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name == sink_type:
            plugin: SinkPlugin = entry.load()
            return plugin
    if sink_type not in BUILTIN_SINKS:
        known = sorted({*BUILTIN_SINKS, *(entry.name for entry in entry_points(group=ENTRY_POINT_GROUP))})
        raise UnknownSinkType(f"unknown sink type {sink_type!r} (known: kafka, {', '.join(known)}; a plugin "
                              f"registers more under the entry-point group {ENTRY_POINT_GROUP!r})")
    return _imported_plugin(BUILTIN_SINKS[sink_type])


def _imported_plugin(reference: str) -> SinkPlugin:
    """The plugin ``module:attribute`` names; one line naming what is missing when it cannot be found."""
    module_name, _, attribute = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UnknownSinkType(f"sink type {reference!r}: cannot import module {module_name!r} ({error}); "
                              f"is it on PYTHONPATH?") from error
    if not hasattr(module, attribute):
        raise UnknownSinkType(f"sink type {reference!r}: module {module_name!r} has no attribute {attribute!r}")
    plugin: SinkPlugin = getattr(module, attribute)
    return plugin
