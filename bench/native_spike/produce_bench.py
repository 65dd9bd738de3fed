"""Produce N Arrow-held values: confluent-kafka's ``produce`` per value (the sink's hot path today, after
``to_pylist``) against the native spike's ColumnProducer reading the column's buffers. One way per process;
CPU from getrusage (every thread, librdkafka's included); both end with a flush.

    python bench/native_spike/produce_bench.py --bootstrap 127.0.0.1:19092 --topic T --records 1000000 --way python
"""

from __future__ import annotations

import argparse

import orjson
import pyarrow as pa
from confluent_kafka import Producer

from bench.native_spike.timing import report_run
from sinks.produce import produce_all

BATCH = 10_000


def batches(records: int) -> list[pa.BinaryArray]:
    rows = [orjson.dumps({"id": i, "user": f"user-{i % 10_000_000:07d}", "amount2": i * 0.5,
                          "ts": "2025-11-24T16:00:00.000Z"}) for i in range(records)]
    return [pa.array(rows[start:start + BATCH], pa.binary()) for start in range(0, records, BATCH)]


def python_way(bootstrap: str, topic: str, columns: list[pa.BinaryArray]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for column in columns:
        produce_all(producer, topic, column.to_pylist())  # no partition given: librdkafka's sticky partitioner
    producer.flush(60)


def native_way(bootstrap: str, topic: str, columns: list[pa.BinaryArray]) -> None:
    from epochline_native_spike import ColumnProducer

    producer = ColumnProducer(bootstrap, 5)
    for number, column in enumerate(columns):
        _, offsets, data = column.buffers()
        producer.produce_column(topic, number % 4, data.to_pybytes(), offsets.to_pybytes())
    producer.flush(60.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--way", choices=("python", "native"), required=True)
    args = parser.parse_args()
    columns = batches(args.records)
    way = python_way if args.way == "python" else native_way

    def run() -> int:
        way(args.bootstrap, args.topic, columns)
        return args.records

    report_run(args.way, run)


if __name__ == "__main__":
    main()
