"""The one place a Kafka client's settings are put together: every consumer, producer and admin client
epochline makes (sources, sinks, changelogs, offsets look-ups, the worker's store) starts from here, so a
default every client should have is set once and the user's settings always win over it.

librdkafka's own log lines go to the ``librdkafka`` logger (``CLIENT_LOGGER``), never raw to stderr.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

CLIENT_LOGGER = logging.getLogger("librdkafka")
"""Where every client epochline makes sends librdkafka's log lines (its ``logger`` setting)."""

CLIENT_DEFAULTS = {"reconnect.backoff.ms": "20"}
"""Under everything else, for every client. A new librdkafka client holds back its connection to the broker
its first metadata names for about half of ``reconnect.backoff.ms`` (its debug log says "still suppressed for
49ms" at the default 100), and ``init_transactions``, a consumer's first metadata and its group join wait for
that connection: about 50 ms per client, twice in every connector start. At 20 ms the hold is about 11 ms
(librdkafka's floor). Measured in bench/README.md ("Start-up").

The same interval paces how often a client with a request waiting connects again to a broker that does not
answer: about twice per ``reconnect.backoff.ms`` (librdkafka 2.16 re-bootstraps when every broker is down,
and the new bootstrap broker starts its backoff over, so ``reconnect.backoff.max.ms`` never comes into play),
about 78 connections a second at 20 ms. The one client that waits for a broker that may be gone, the
connection check (``connectors.admin.check_connection``), therefore sets ``UNREACHABLE_BACKOFF`` over this."""

UNREACHABLE_BACKOFF = {"reconnect.backoff.ms": "500"}
"""What the connection check connects again at while Kafka does not answer: at most about 4 connections a
second for the whole ``kafka.connect_timeout`` (30 s by default), where 20 ms made about 78. The check sends
one request to the bootstrap broker, which no hold delays, so it costs nothing when Kafka answers. A
``reconnect.backoff.ms`` in ``kafka.client`` wins over it."""


def kafka_client_config(bootstrap: str, *layers: Mapping[str, Any]) -> dict[str, Any]:
    """``CLIENT_DEFAULTS``, then ``layers`` in order, each over the ones before it (a caller's defaults, the
    user's settings, what the caller requires), then the bootstrap servers and ``CLIENT_LOGGER``."""
    config: dict[str, Any] = dict(CLIENT_DEFAULTS)
    for layer in layers:
        config.update(layer)
    return {**config, "bootstrap.servers": bootstrap, "logger": CLIENT_LOGGER}
