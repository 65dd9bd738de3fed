"""How a batch job is named and where its ledger lives."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from engine.batch.errors import BatchJobError
from engine.batch.store import POSTGRES_PREFIXES, SQLITE_PREFIX
from engine.config import ConnectorConfig
from engine.wiring import CrashPoint

_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


@dataclass(frozen=True)
class BatchOptions:
    batch_id: str
    bootstrap: str
    store_url: str | None = None  # overrides batch.store of the config
    tenant: str = "default"
    read_timeout_s: float = 60.0  # no record and no partition end within this while reading an item: error
    crash_point: CrashPoint | None = None  # crash tests only (engine.testing.faults)


def checked_name(value: str, what: str) -> str:
    """Batch ids and tenants name files and Kafka ids, so they are restricted to a safe alphabet."""
    if not _NAME.match(value):
        raise BatchJobError(f"{what} {value!r} may contain only letters, digits, '.', '_' and '-'")
    return value


def kafka_id(config: ConnectorConfig, tenant: str, batch_id: str) -> str:
    """The job's transactional id and consumer group, stable per (tenant, connector, batch): a resumed job
    fences the one it replaces at ``init_transactions``, and the group's committed offsets witness which
    items committed. ``:`` cannot occur in the parts, so distinct triples never share an id."""
    return f"epochline-batch:{tenant}:{config.name}:{batch_id}"


def store_url_for(config: ConnectorConfig, override: str | None = None) -> str:
    """``--store``, else ``batch.store`` (a relative SQLite path is relative to the config file), else the
    SQLite file ``<checkpoint dir>/batches.db``."""
    url = override or config.batch.store
    if url is None:
        return str(config.state_dir / "batches.db")
    if url.startswith(POSTGRES_PREFIXES) or override is not None:
        return url
    path = Path(url.removeprefix(SQLITE_PREFIX))
    return str(path if path.is_absolute() else config.base_dir / path)
