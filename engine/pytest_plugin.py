"""epochline's pytest plugin (entry point ``pytest11``): a real Kafka for the tests that need one.

``kafka_bootstrap`` is session-scoped: ``KAFKA_BOOTSTRAP`` when set, else one local broker started for
the session in a temporary directory on a free port, and stopped (by its recorded PID) afterwards.
Tests share the broker, so each one creates topics with unique names (``unique_topic``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from engine.local_broker import LocalBroker, free_port


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    configured = os.environ.get("KAFKA_BOOTSTRAP")
    if configured:
        yield configured
        return
    broker = LocalBroker(tmp_path_factory.mktemp("kafka"))
    state = broker.start(port=free_port())
    try:
        yield state.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses: the test's name plus a random suffix."""
    base = "".join(c if c.isalnum() or c in "-_" else "-" for c in request.node.name)[:80]
    return f"{base}-{uuid.uuid4().hex[:8]}"
