"""Consume N records of a topic into Arrow columns: confluent-kafka + RecordColumns (what the source does
today) against the native spike's ColumnConsumer. One way per process, CPU from getrusage (every thread,
librdkafka's included).

    python bench/native_spike/consume_bench.py --bootstrap 127.0.0.1:19092 --topic T --records 3000000 --way python
"""

from __future__ import annotations

import argparse
import uuid

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from bench.native_spike.timing import report_run
from connectors.source import RecordColumns

BATCH = 10_000  # the source's max_batch_records default when the spike was measured


def python_way(bootstrap: str, topic: str, partitions: int, records: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"spike-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "queued.max.messages.kbytes": 32_768})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    seen = 0
    while seen < records:
        first = consumer.poll(5.0)
        if first is None:
            break
        messages = [first, *consumer.consume(BATCH - 1, 0)]
        columns = RecordColumns.of(messages)
        arrays = [pa.array(columns.values, pa.binary()), *columns.metadata_arrays()]
        seen += len(arrays[0])
    consumer.close()
    return seen


def native_way(bootstrap: str, topic: str, partitions: int, records: int) -> int:
    from epochline_native_spike import ColumnConsumer

    consumer = ColumnConsumer(bootstrap, f"spike-{uuid.uuid4().hex}", topic, partitions)
    seen = 0
    while seen < records:
        data, value_offsets, parts, offsets, stamps, count = consumer.poll_columns(BATCH, 5000)
        if count == 0:
            break
        arrays = [
            pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(value_offsets), pa.py_buffer(data)]),
            pa.Array.from_buffers(pa.int32(), count, [None, pa.py_buffer(parts)]),
            pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(offsets)]),
            pa.Array.from_buffers(pa.timestamp("ms", tz="UTC"), count, [None, pa.py_buffer(stamps)]),
        ]
        seen += len(arrays[0])
    return seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--way", choices=("python", "native"), required=True)
    args = parser.parse_args()
    way = python_way if args.way == "python" else native_way
    report_run(args.way, lambda: way(args.bootstrap, args.topic, args.partitions, args.records))


if __name__ == "__main__":
    main()
