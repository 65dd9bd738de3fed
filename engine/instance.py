"""Which instance of a connector this process is, and the Kafka names that follow from it.

Instances of one connector (same ``name``) share its consumer group; each needs a name of its own that is
**stable across restarts**: its transactional.id derives from it, so a restarted instance fences its
previous incarnation at ``init_transactions`` (aborting whatever that one left open, at once, instead of
leaving readers blocked until the transaction times out), and its consumers' client ids derive from it, so
the group shows which instance holds which partitions. Two live instances must never share a name: they
would fence each other.

The name is ``--instance`` / ``EPOCHLINE_INSTANCE``, else one generated once and kept in the connector's
state directory (so two instances of a config on one machine need only different ``--instance`` names).
Each instance keeps its local files (checkpoint id log, lock) under ``<state dir>/instances/<name>``.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from engine.config import ConnectorConfig
from engine.state import write_atomically

INSTANCE_ENV = "EPOCHLINE_INSTANCE"
GENERATED_NAME_FILE = "instance"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class InstanceNameError(ValueError):
    """An instance name that cannot name Kafka clients or offset metadata."""


@dataclass(frozen=True)
class Instance:
    """One instance of a connector: its name and everything named after it."""

    connector: str
    name: str
    state_root: Path

    @property
    def transactional_id(self) -> str:
        return f"epochline-{self.connector}-{self.name}"

    @property
    def state_dir(self) -> Path:
        """This instance's own files (never shared with another instance, even on one machine)."""
        return self.state_root / "instances" / self.name

    def member(self, source: str) -> str:
        """Client id of this instance's consumer of ``source``."""
        return f"{self.connector}-{self.name}-{source}"


def resolve_instance(config: ConnectorConfig, flag: str | None = None) -> Instance:
    return Instance(config.name, instance_name(config.state_dir, flag), config.state_dir)


def instance_name(state_dir: Path, flag: str | None = None) -> str:
    """The flag, else ``EPOCHLINE_INSTANCE``, else the name kept in ``state_dir`` (made on first use); a worker
    names itself the same way, and its tasks after it."""
    name = flag or os.environ.get(INSTANCE_ENV) or _kept_name(state_dir)
    if not NAME_PATTERN.match(name):
        raise InstanceNameError(f"instance name {name!r} must be 1-64 characters of A-Z a-z 0-9 . _ -")
    return name


def _kept_name(state_dir: Path) -> str:
    path = state_dir / GENERATED_NAME_FILE
    if path.exists():
        return path.read_text().strip()
    state_dir.mkdir(parents=True, exist_ok=True)
    name = f"i-{secrets.token_hex(4)}"
    write_atomically(path, [name.encode()])
    return name
