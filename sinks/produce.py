"""Handing records to librdkafka without ever dropping one because its local queue is full.

``Producer.produce`` raises ``BufferError`` when the client's queue is full; the record was not taken.
Serving delivery reports (``poll``) frees room, so every producer in epochline (sinks, test helpers,
benchmarks, examples) waits that way, through these functions. ``produce_column`` hands over the rows of
Arrow binary columns through the C module (``connectors.native_io``), with no Python object per record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import pyarrow as pa
from confluent_kafka import KafkaError, KafkaException, Message, Producer

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


def produce_column(native: ModuleType, producer: Producer, topic: str, values: pa.Array[Any],
                   keys: pa.Array[Any] | None = None, *, wait_s: float = 0.05) -> None:
    """Hand every row of the binary array ``values`` to the producer in order (a null value is a tombstone),
    keyed by the same row of ``keys`` when given; raises ``KafkaException`` when librdkafka refuses one.

    Only for a transactional producer: these records carry none of confluent-kafka's per-record state, so a
    failed delivery is not reported to the delivery callback; librdkafka then refuses to commit the
    transaction, which is how the failure shows (``connectors/_native_io.c``)."""
    rows = len(values)
    value_buffers = _binary_buffers(values)
    key_buffers = _binary_buffers(keys) if keys is not None else None
    done = 0
    while done < rows:
        done, error = native.produce_column(producer, topic, rows, value_buffers, key_buffers, done)
        if error:
            raise KafkaException(KafkaError(error, f"producing to {topic}: {KafkaError(error).str()}"))
        if done < rows:
            producer.poll(wait_s)  # the queue is full: serving delivery reports frees room
    producer.poll(0)


def _binary_buffers(array: pa.Array[Any]) -> tuple[Any, Any, Any, int]:
    """An Arrow binary array as the C module takes it: (data, int32 offsets, validity or None, first row)."""
    if not pa.types.is_binary(array.type):
        raise TypeError(f"expected a binary array, got {array.type}")
    validity, offsets, data = array.buffers()
    return data if data is not None else b"", offsets, validity if array.null_count else None, array.offset
