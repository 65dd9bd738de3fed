"""Run a test once per way records move between Kafka and Arrow: the C module and confluent-kafka's calls."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from connectors.native_io import SWITCH, native_io


@pytest.fixture(params=["native", "per-record"])
def kafka_io(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``native``: the C module (skipped when it was not built); ``per-record``: switched off."""
    native_io.cache_clear()
    if request.param == "native":
        monkeypatch.delenv(SWITCH, raising=False)
        if native_io() is None:
            pytest.skip("the C module (connectors/_native_io.c) was not built")
    else:
        monkeypatch.setenv(SWITCH, "0")
    yield request.param
    native_io.cache_clear()
