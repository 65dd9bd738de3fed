"""connectors.clients: every Kafka client starts from epochline's defaults, the user's settings over them; and
a client waiting for a Kafka that is not there connects again at a bounded rate."""

from __future__ import annotations

import time

import pytest

from connectors.admin import KafkaUnreachable, check_connection
from connectors.clients import CLIENT_DEFAULTS, CLIENT_LOGGER, kafka_client_config
from tests.helpers.closing_port import closing_port

CHECK_SECONDS = 3.0
MAX_CONNECTIONS_PER_SECOND = 10
"""librdkafka connects about twice per ``reconnect.backoff.ms`` while a request waits: about 78 times a
second at the 20 ms the long-lived clients start with, about 4 at the connection check's 500 ms."""


def test_later_layers_win_over_earlier_ones_and_over_the_defaults() -> None:
    config = kafka_client_config("k:9092", {"linger.ms": 5, "acks": "all"}, {"linger.ms": 50},
                                 {"reconnect.backoff.ms": "100"})

    assert config == {**CLIENT_DEFAULTS, "linger.ms": 50, "acks": "all", "reconnect.backoff.ms": "100",
                      "bootstrap.servers": "k:9092", "logger": CLIENT_LOGGER}
    assert kafka_client_config("k:9092")["reconnect.backoff.ms"] == CLIENT_DEFAULTS["reconnect.backoff.ms"]


def test_waiting_for_an_unreachable_kafka_connects_a_few_times_a_second_and_gives_up_in_time() -> None:
    with closing_port() as port:
        started = time.monotonic()
        with pytest.raises(KafkaUnreachable, match=f"cannot reach Kafka at {port.bootstrap} within 3s"):
            check_connection(port.bootstrap, {}, timeout=CHECK_SECONDS)
        elapsed = time.monotonic() - started
        attempts = port.accepted

    assert elapsed < CHECK_SECONDS + 2
    assert 1 <= attempts <= MAX_CONNECTIONS_PER_SECOND * CHECK_SECONDS, attempts


def test_a_reconnect_backoff_the_user_sets_wins_over_the_connection_check_s() -> None:
    """Here a faster one: it shows the setting reaches the check's client (librdkafka's floor is about 11 ms)."""
    with closing_port() as port:
        with pytest.raises(KafkaUnreachable):
            check_connection(port.bootstrap, {"reconnect.backoff.ms": "20"}, timeout=CHECK_SECONDS)
        attempts = port.accepted

    assert attempts > MAX_CONNECTIONS_PER_SECOND * CHECK_SECONDS, attempts
