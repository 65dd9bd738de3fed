"""The cluster's store (``engine.worker.store.KafkaClusterStore``) over the real broker: a record the configs
topic cannot take is refused naming its size, and the store goes on working."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from engine.worker.errors import RecordTooLarge
from engine.worker.records import ConnectorRecord
from engine.worker.store import KafkaClusterStore

PRODUCER_MAX_MESSAGE_BYTES = 1_000_000
"""librdkafka's default ``message.max.bytes``, below the broker's default ``max.message.bytes``."""


@pytest.fixture
def store(kafka_bootstrap: str) -> Iterator[KafkaClusterStore]:
    opened = KafkaClusterStore(kafka_bootstrap, f"store-{uuid.uuid4().hex[:8]}", timeout_s=30.0)
    yield opened
    opened.close()


def config(filler: str = "") -> dict[str, object]:
    return {"source": {"topic": "in", "consumer": {"client.rack": filler}}, "sink": {"topic": "out"}}


def test_a_config_too_large_for_the_configs_topic_is_refused_naming_its_size(store: KafkaClusterStore) -> None:
    record = ConnectorRecord("big", config("x" * PRODUCER_MAX_MESSAGE_BYTES))
    with pytest.raises(RecordTooLarge, match=f"{len(record.encode())} bytes") as refused:
        store.put_connector(record)
    assert store.configs_topic in str(refused.value)
    assert "big" not in store.connectors()
    store.put_connector(ConnectorRecord("small", config()))
    assert store.connectors()["small"].config == config()
