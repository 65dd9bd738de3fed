"""librdkafka behaviours measured alone, without a pipeline: how fast a consumer that does nothing else
reads under a given fetch config, and how long a transactional producer and a consumer take to start.

    python bench/client_probes.py [--records 1000000] [--starts 10] [--cluster-topics 0] [--bootstrap HOST:PORT]

``consume``: ``--records`` JSON records of the benchmark's input (bench/workload.py, 4 partitions) are read
``read_committed`` with the sources' consumer settings, once with each fetch config below; records/s is
wall time from the first ``consume`` call to the last record (``--records 0`` skips it). ``producer start``:
``--starts`` fresh transactional producers each run ``init_transactions`` after each of ``PRODUCER_STARTS``
(at once; after metadata of every topic, as ``TransactionalKafkaSink.start`` did before; after metadata of
its own topic once or twice, as it does now), with librdkafka's ``reconnect.backoff.ms`` and with
epochline's (``connectors.clients.CLIENT_DEFAULTS``). ``--cluster-topics N`` first makes N more (empty,
one-partition) topics, as a shared cluster has: a request for every topic's metadata grows with them.
``consumer start``: as many fresh consumers each describe the input topic (what a source does first), with
each backoff. Without ``--bootstrap`` a private broker is started and stopped; the topics made here are
deleted at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo's packages (bench, connectors) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from bench.run import broker, delete_or_warn
from bench.workload import generate_input
from connectors.admin import create_topic, create_topics
from connectors.clients import CLIENT_DEFAULTS
from connectors.source import FETCH_DEFAULTS, PREFETCH_BOUND

PARTITIONS = 4
LARGE_FETCHES = {"max.partition.fetch.bytes": str(8 << 20), "fetch.max.bytes": str(32 << 20)}
FETCH_CONFIGS: dict[str, Mapping[str, str]] = {
    "librdkafka's defaults": {},
    "8 MiB fetches (the sources' defaults before)": LARGE_FETCHES,
    "10 ms queue backoff (the sources' FETCH_DEFAULTS)": FETCH_DEFAULTS,
    "8 MiB fetches, 10 ms queue backoff": {**LARGE_FETCHES, **FETCH_DEFAULTS},
}
RECONNECT_BACKOFFS: dict[str, Mapping[str, str]] = {
    "librdkafka's reconnect.backoff.ms (100)": {},
    f"epochline's ({CLIENT_DEFAULTS['reconnect.backoff.ms']})": CLIENT_DEFAULTS,
}

PRODUCER_STARTS: dict[str, Callable[[Producer, str], object]] = {
    "init_transactions at once": lambda producer, topic: None,
    "every topic's metadata first": lambda producer, topic: producer.list_topics(timeout=5),
    "its topic's metadata first": lambda producer, topic: producer.list_topics(topic, timeout=5),
    "its topic's metadata twice first (TransactionalKafkaSink.start)": lambda producer, topic: [
        producer.list_topics(topic, timeout=5) for _ in range(2)],
}
"""What a fresh transactional producer does before ``init_transactions``, given its output topic."""


def consume_rate(bootstrap: str, topic: str, records: int, fetch: Mapping[str, str]) -> float:
    """Records per second reading the whole topic with the sources' queue bound and ``fetch``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         **PREFETCH_BOUND, **fetch})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    read = 0
    started = time.monotonic()
    try:
        while read < records:
            read += sum(1 for message in consumer.consume(10_000, 1.0) if message.error() is None)
            if time.monotonic() - started > 120:
                raise TimeoutError(f"read {read} of {records} records of {topic!r} in 120 s")
        return records / (time.monotonic() - started)
    finally:
        consumer.close()


def start_seconds(bootstrap: str, topic: str, starts: int, first: Callable[[Producer, str], object],
                  client: Mapping[str, str]) -> list[float]:
    """Time to a transactional producer's first transaction, for ``starts`` fresh producers that each do
    ``first`` (one of ``PRODUCER_STARTS``) and then ``init_transactions``."""
    seconds = []
    for _ in range(starts):
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"probe-{uuid.uuid4().hex}",
                             **client})
        started = time.monotonic()
        first(producer, topic)
        producer.init_transactions(30)
        seconds.append(time.monotonic() - started)
    return seconds


def describe_seconds(bootstrap: str, topic: str, starts: int, client: Mapping[str, str]) -> list[float]:
    """Time for ``starts`` fresh consumers to describe ``topic``, a source's first call."""
    seconds = []
    for _ in range(starts):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}", **client})
        started = time.monotonic()
        consumer.list_topics(topic, timeout=5)
        seconds.append(time.monotonic() - started)
        consumer.close()
    return seconds


def summary(seconds: list[float]) -> str:
    return (f"median {statistics.median(seconds):.3f} s, slowest {max(seconds):.3f} s, "
            f"{sum(s > 0.3 for s in seconds)} of {len(seconds)} over 0.3 s")


def probe(bootstrap: str, topic: str, args: argparse.Namespace) -> None:
    """Every measurement above on ``topic`` (the input, 4 partitions), one printed line each."""
    if args.records:
        generate_input(bootstrap, topic, args.records, "json")
        for name, fetch in FETCH_CONFIGS.items():
            print(f"consume, {name}: {consume_rate(bootstrap, topic, args.records, fetch):,.0f} records/s")
    for backoff, client in RECONNECT_BACKOFFS.items():
        for way, first in PRODUCER_STARTS.items():
            print(f"producer start, {way}, {backoff}: "
                  f"{summary(start_seconds(bootstrap, topic, args.starts, first, client))}")
        print(f"consumer start, describing the topic, {backoff}: "
              f"{summary(describe_seconds(bootstrap, topic, args.starts, client))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--cluster-topics", type=int, default=0, help="more topics made first (default 0)")
    parser.add_argument("--bootstrap", help="use this broker instead of starting a private one")
    args = parser.parse_args()
    with broker(args.bootstrap) as (bootstrap, _):
        prefix = f"probe-{uuid.uuid4().hex[:8]}"
        topic = f"{prefix}-input"
        made = [topic, *(f"{prefix}-more-{n}" for n in range(args.cluster_topics))]
        try:
            create_topic(bootstrap, topic, PARTITIONS)
            create_topics(bootstrap, made[1:], timeout=120)
            probe(bootstrap, topic, args)
        finally:
            delete_or_warn(bootstrap, made)


if __name__ == "__main__":
    main()
