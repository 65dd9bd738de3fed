"""connectors.admin: topics made and removed against a real broker."""

from __future__ import annotations

import uuid

import pytest

from connectors.admin import TopicAdminError, create_topic, create_topics, delete_topics, matching_topics
from tests.helpers.worker_process import wait_for


def test_many_topics_are_made_in_one_call_and_an_existing_one_is_left_as_it_is(kafka_bootstrap: str) -> None:
    prefix = f"admin-{uuid.uuid4().hex[:8]}"
    names = [f"{prefix}-a", f"{prefix}-b", f"{prefix}-c"]
    create_topic(kafka_bootstrap, names[0], partitions=2)

    create_topics(kafka_bootstrap, names, partitions=1)

    expected = {names[0]: [0, 1], names[1]: [0], names[2]: [0]}
    wait_for("three topics", lambda: matching_topics(kafka_bootstrap, prefix) == expected, timeout_s=30, every_s=0.2)
    delete_topics(kafka_bootstrap, names)


def test_a_topic_the_broker_refuses_is_named(kafka_bootstrap: str) -> None:
    with pytest.raises(TopicAdminError, match="creating topic 'not a topic!'"):
        create_topics(kafka_bootstrap, ["not a topic!"])
