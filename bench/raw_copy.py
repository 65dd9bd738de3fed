"""raw-eos: the Python ceiling — a confluent-kafka transactional consume→produce loop that copies bytes.

No decoding, no transform: each consumed value is produced unchanged to the same partition number of the
output topic. Every ``--commit-interval`` seconds the loop sends the consumer's positions to the open
transaction and commits it, the same cadence as epochline's 1 s checkpoints. A transaction error ends the
run with a non-zero exit (the harness then reports it FAILED); this loop is a ceiling, not a recovery demo.

Run by ``bench/run.py`` in its own process so its CPU time and RSS are its own.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Producer,
    TopicPartition,
)

from connectors.admin import committed_offsets, watermark_offsets
from connectors.fetched import ready_messages
from connectors.source import FETCH_DEFAULTS
from sinks import produce_waiting


class CopyStopped(RuntimeError):
    """The copy loop could not consume from the input topic."""


def _assign_from_committed(consumer: Consumer, topic: str) -> list[TopicPartition]:
    """Assign every partition at the group's committed offset, or at the beginning when none is committed."""
    partitions = sorted(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
    committed = committed_offsets(consumer, [TopicPartition(topic, p) for p in partitions], timeout=60)
    start = [TopicPartition(topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
             for tp in committed]
    consumer.assign(start)
    return [TopicPartition(topic, p) for p in partitions]


def _end_offsets(consumer: Consumer, partitions: list[TopicPartition]) -> dict[int, int]:
    """Last stable offsets (the consumer reads ``read_committed``), captured once at start."""
    offsets = watermark_offsets(consumer, partitions[0].topic, [tp.partition for tp in partitions])
    return {partition: end for partition, (_, end) in offsets.items()}


def _reached(consumer: Consumer, partitions: list[TopicPartition], ends: dict[int, int]) -> bool:
    """True when every partition's position is at or past its end; positions skip transaction markers."""
    return all(tp.offset >= ends[tp.partition] or ends[tp.partition] == 0 for tp in consumer.position(partitions))


def _commit(producer: Producer, consumer: Consumer, partitions: list[TopicPartition]) -> None:
    """Close the epoch: the records produced so far and the consumer positions commit together."""
    positions = [tp for tp in consumer.position(partitions) if tp.offset >= 0]
    producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 30)
    producer.commit_transaction(60)


def copy(args: argparse.Namespace) -> None:
    stopping = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap, "group.id": args.group, "enable.auto.commit": False,
        "isolation.level": "read_committed", "auto.offset.reset": "earliest",
        **FETCH_DEFAULTS,  # fetching as epochline's sources do: the ceiling is not held back by a fetch setting
    })
    producer = Producer({
        "bootstrap.servers": args.bootstrap, "transactional.id": args.transactional_id, "linger.ms": 5,
        "compression.type": "none", "queue.buffering.max.messages": 1_000_000,
    })
    partitions = _assign_from_committed(consumer, args.input)
    ends = _end_offsets(consumer, partitions) if args.stop_at_end else None
    producer.init_transactions(60)
    producer.begin_transaction()
    epoch_started = time.monotonic()
    while not stopping:
        # As they come: ``consume(10_000, 0.1)`` would wait for 10,000 records or the whole 0.1 s.
        for message in ready_messages(consumer, 10_000, 0.1):
            if message.error() is not None:
                raise CopyStopped(f"consuming {args.input} partition {message.partition()}: {message.error()}")
            produce_waiting(producer, args.output, message.value(), message.key(), partition=message.partition(),
                            wait_s=0.01)
        producer.poll(0)
        if ends is not None and _reached(consumer, partitions, ends):
            break
        if time.monotonic() - epoch_started >= args.commit_interval:
            _commit(producer, consumer, partitions)
            producer.begin_transaction()
            epoch_started = time.monotonic()
    _commit(producer, consumer, partitions)
    consumer.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--commit-interval", type=float, default=1.0)
    parser.add_argument("--stop-at-end", action="store_true",
                        help="exit once the input's end offsets, captured at start, are committed")
    args = parser.parse_args()
    try:
        copy(args)
    except (KafkaException, CopyStopped) as error:
        print(f"raw-eos: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
