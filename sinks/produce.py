"""Handing records to librdkafka without ever dropping one because its local queue is full.

``Producer.produce`` raises ``BufferError`` when the client's queue is full; the record was not taken.
Serving delivery reports (``poll``) frees room, so every producer in epochline (sinks, test helpers,
benchmarks, examples) waits that way, through these two functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError, Message, Producer

Headers = list[tuple[str, str | bytes | None]]
DeliveryCallback = Callable[[KafkaError | None, Message], None]
ANY_PARTITION = -1  # librdkafka's partitioner picks one


def produce_waiting(producer: Producer, topic: str, value: bytes | None, key: bytes | None = None,
                    headers: Headers | None = None, *, partition: int = ANY_PARTITION,
                    on_delivery: DeliveryCallback | None = None, wait_s: float = 0.05) -> None:
    """``produce`` one record, serving delivery reports for up to ``wait_s`` at a time while the local queue
    is full."""
    while True:
        try:
            producer.produce(topic, value, key, partition, on_delivery=on_delivery, headers=headers)
            return
        except BufferError:
            producer.poll(wait_s)


def produce_all(producer: Producer, topic: str, values: Sequence[bytes | None],
                keys: Sequence[bytes | None] | None = None, headers: Sequence[Headers] | None = None) -> None:
    """Hand every record to the producer, in order. The keyless, headerless case is a pipeline's hot path,
    so it calls ``produce`` with positional arguments only, which is measurably cheaper per record."""
    if keys is None and headers is None:
        produce = producer.produce
        for value in values:
            try:
                produce(topic, value)
            except BufferError:
                produce_waiting(producer, topic, value)
    else:
        for index, value in enumerate(values):
            produce_waiting(producer, topic, value, keys[index] if keys is not None else None,
                            headers[index] if headers is not None else None)
    producer.poll(0)
