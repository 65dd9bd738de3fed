"""Fixtures of the group tests: a connector's topics (6 partitions each) and its instances, killed at the end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from connectors.admin import create_topic
from tests.helpers.group import PARTITIONS, Instances


@pytest.fixture
def topics(kafka_bootstrap: str, unique_topic: str) -> dict[str, str]:
    """Source, sink and dead-letter topics, as many partitions each (``assert_no_open_transactions`` reads
    any of them)."""
    names = {"source": f"{unique_topic}-in", "sink": f"{unique_topic}-out", "dlq": f"{unique_topic}-dlq"}
    for topic in names.values():
        create_topic(kafka_bootstrap, topic, PARTITIONS)
    return names


@pytest.fixture
def instances_of() -> Iterator[list[Instances]]:
    made: list[Instances] = []
    yield made
    for instances in made:
        instances.close()
