"""The benchmark's whole JSON job (decode, SQL, encode) in one process, with records moved between Kafka and
Arrow three ways: confluent-kafka as the source and sink do today, the spike's native calls inline, and the
native calls on two helper threads (they release the GIL, so consuming and producing overlap the main
thread's decode, SQL and encode). The transform is epochline's own (``JsonFormat``, ``SqlOperator``); all
three ways flush the producer every second (idempotent, no transaction: the spike has none; exactly-once
and at-least-once runs of the engine differ by about 1% here). CPU from getrusage: every thread.

    python bench/native_spike/pipeline_bench.py --bootstrap 127.0.0.1:9092 --topic T --records 3000000 --way python
"""

from __future__ import annotations

import argparse
import queue
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from bench.native_spike.timing import report_run
from bench.workload import SQL, write_schema_files
from connectors.admin import create_topic
from connectors.source import FETCH_DEFAULTS, PREFETCH_BOUND, RecordColumns, decode_records
from engine.transforms.sql import SqlOperator
from schemas import Format
from schemas.arrow_batches import conform_batch, map_batch_leaves
from schemas.factory import FormatSpec, make_format
from schemas.json_wire import value_to_text, wire_schema
from sinks.produce import produce_all

BATCH = 10_000  # the source's max_batch_records default
FLUSH_EVERY_S = 1.0  # the benchmark's checkpoint interval
Batch = tuple[pa.BinaryArray, list["pa.Array[Any]"]]  # the values and the partition, offset and timestamp columns


class Job:
    """Decode a batch of JSON values, run the benchmark's SQL, encode the rows as JSON."""

    def __init__(self, schema_dir: Path) -> None:
        input_schema, output_schema = write_schema_files(schema_dir)
        self.input: Format = make_format(FormatSpec(format="json", schema=input_schema))
        self.output: Format = make_format(FormatSpec(format="json", schema=output_schema))
        self.sql = SqlOperator(SQL)

    def transform(self, batch: pa.RecordBatch) -> list[bytes]:
        table = self.sql.process(pa.Table.from_batches([batch]), None)
        values: list[bytes] = []
        for out in table.to_batches():
            values += self.output.encode(out)
        return values


def python_way(args: argparse.Namespace, job: Job) -> int:
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": f"spike-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         **FETCH_DEFAULTS, **PREFETCH_BOUND})
    consumer.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in range(args.partitions)])
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5, "batch.num.messages": 10_000,
                         "compression.type": "lz4", "enable.idempotence": True,
                         "delivery.report.only.error": True})
    seen, flushed = 0, time.monotonic()
    while seen < args.records:
        first = consumer.poll(5.0)
        if first is None:
            break
        messages = [first, *consumer.consume(BATCH - 1, 0)]
        if any(m.error() for m in messages):
            raise RuntimeError("consumer error")
        source_batch = decode_records("spike", args.topic, job.input, RecordColumns.of(messages))
        produce_all(producer, args.output, job.transform(source_batch.batch))
        seen += len(messages)
        if time.monotonic() - flushed >= FLUSH_EVERY_S:
            producer.flush(30)
            flushed = time.monotonic()
    producer.flush(30)
    consumer.close()
    return seen


def _native_batches(args: argparse.Namespace) -> Iterator[Batch]:
    """The spike's consumer: each batch as the value column and the partition, offset and timestamp columns."""
    from epochline_native_spike import ColumnConsumer

    consumer = ColumnConsumer(args.bootstrap, f"spike-{uuid.uuid4().hex}", args.topic, args.partitions)
    seen = 0
    while seen < args.records:
        data, value_offsets, parts, offsets, stamps, count = consumer.poll_columns(BATCH, 5000)
        if count == 0:
            return
        values = pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(value_offsets), pa.py_buffer(data)])
        metadata = [pa.Array.from_buffers(pa.int32(), count, [None, pa.py_buffer(parts)]),
                    pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(offsets)]),
                    pa.Array.from_buffers(pa.timestamp("ms", tz="UTC"), count, [None, pa.py_buffer(stamps)])]
        seen += count
        yield values, metadata


def _decoded(job: Job, values: pa.BinaryArray, metadata: list[pa.Array[Any]]) -> pa.RecordBatch:
    decoded = job.input.decode(values.to_pylist())
    if len(decoded.indices) != len(values):
        raise RuntimeError("the spike's input has no bad records")
    return pa.RecordBatch.from_arrays([*decoded.batch.columns, *metadata],
                                      names=[*decoded.batch.schema.names, "_partition", "_offset", "_timestamp"])


def _native_producer(args: argparse.Namespace) -> tuple[Callable[[list[bytes]], None], Callable[[], None]]:
    from epochline_native_spike import ColumnProducer

    producer = ColumnProducer(args.bootstrap, 5)

    def produce(values: list[bytes]) -> None:
        column = pa.array(values, pa.binary())
        _, offsets, data = column.buffers()
        producer.produce_column(args.output, -1, data.to_pybytes(), offsets.to_pybytes())  # one copy each

    return produce, lambda: producer.flush(30)


def native_way(args: argparse.Namespace, job: Job) -> int:
    produce, flush = _native_producer(args)
    seen, flushed = 0, time.monotonic()
    for values, metadata in _native_batches(args):
        produce(job.transform(_decoded(job, values, metadata)))
        seen += len(values)
        if time.monotonic() - flushed >= FLUSH_EVERY_S:
            flush()
            flushed = time.monotonic()
    flush()
    return seen


def _staged(args: argparse.Namespace, transform: Callable[[pa.BinaryArray, list[pa.Array[Any]]], list[Any]],
            produce: Callable[[Any], None], flush: Callable[[], None]) -> int:
    """Consuming and producing each on a thread of their own, two batches in flight between the stages; the
    calling thread transforms each consumed batch into what ``produce`` takes."""
    consumed: queue.Queue[Batch | None] = queue.Queue(maxsize=2)
    encoded: queue.Queue[Any] = queue.Queue(maxsize=2)
    done = object()

    def consume() -> None:
        for item in _native_batches(args):
            consumed.put(item)
        consumed.put(None)

    def write() -> None:
        flushed = time.monotonic()
        while (item := encoded.get()) is not done:
            produce(item)
            if time.monotonic() - flushed >= FLUSH_EVERY_S:
                flush()
                flushed = time.monotonic()
        flush()

    threads = [threading.Thread(target=consume), threading.Thread(target=write)]
    for thread in threads:
        thread.start()
    seen = 0
    while (batch := consumed.get()) is not None:
        values, metadata = batch
        for item in transform(values, metadata):
            encoded.put(item)
        seen += len(values)
    encoded.put(done)
    for thread in threads:
        thread.join()
    return seen


def native_threads_way(args: argparse.Namespace, job: Job) -> int:
    produce, flush = _native_producer(args)
    return _staged(args, lambda values, metadata: [job.transform(_decoded(job, values, metadata))], produce, flush)


class _LazyLines:
    """The payloads as ``JsonFormat._typed_piece`` reads them (only for a row that breaks the schema)."""

    def __init__(self, values: pa.BinaryArray) -> None:
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._values.to_pylist())


def _decoded_from_buffer(job: Job, values: pa.BinaryArray, metadata: list[pa.Array[Any]]) -> pa.RecordBatch:
    """An upper bound: the values' bytes go to Arrow's reader as one newline-joined buffer made by an Arrow
    kernel, with no bytes object per record and without ``JsonFormat``'s framing and token checks, which a
    native path would have to do while copying the values."""
    ndjson = pc.binary_join_element_wise(values, pa.scalar(b"", pa.binary()), pa.scalar(b"\n", pa.binary()))
    _, offsets, data = ndjson.buffers()
    buffer = data[:int(np.frombuffer(offsets, np.int32)[len(ndjson)])]
    longest = pc.max(pc.binary_length(values)).as_py()
    fmt: Any = job.input
    piece = fmt._parse(list(range(len(values))), _LazyLines(values), buffer.to_pybytes(), longest)
    return pa.RecordBatch.from_arrays([*piece.batch.columns, *metadata],
                                      names=[*piece.batch.schema.names, "_partition", "_offset", "_timestamp"])


def _encoded_column(job: Job, batch: pa.RecordBatch) -> pa.Array[Any]:
    """``JsonFormat.encode`` up to its last step: the JSON values as an Arrow column, not a list of bytes."""
    fmt: Any = job.output
    batch = conform_batch(batch, fmt.arrow_schema, fmt="json")
    printable = pa.Table.from_batches([map_batch_leaves(batch, wire_schema(batch.schema), value_to_text)])
    connection = fmt._duckdb = fmt._duckdb or duckdb.connect()
    connection.register("encode_rows", printable)
    column = connection.sql("SELECT to_json(encode_rows)::BLOB FROM encode_rows").to_arrow_table().column(0)
    connection.unregister("encode_rows")
    return column.combine_chunks()


def native_buffers_way(args: argparse.Namespace, job: Job) -> int:
    """``native-threads`` with no bytes object per record on either side (``_decoded_from_buffer``)."""
    from epochline_native_spike import ColumnProducer

    producer = ColumnProducer(args.bootstrap, 5)

    def transform(values: pa.BinaryArray, metadata: list[pa.Array[Any]]) -> list[pa.Array[Any]]:
        table = job.sql.process(pa.Table.from_batches([_decoded_from_buffer(job, values, metadata)]), None)
        return [_encoded_column(job, out) for out in table.to_batches()]

    def produce(column: pa.Array[Any]) -> None:
        if len(column):
            _, offsets, data = column.buffers()
            producer.produce_column(args.output, -1, data.to_pybytes(), offsets.to_pybytes())

    return _staged(args, transform, produce, lambda: producer.flush(30))


WAYS = {"python": python_way, "native": native_way, "native-threads": native_threads_way,
        "native-buffers": native_buffers_way}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True, help="input: the benchmark's JSON records (bench/workload.py)")
    parser.add_argument("--output", default=f"spike-out-{uuid.uuid4().hex[:8]}")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--way", choices=sorted(WAYS), required=True)
    args = parser.parse_args()
    create_topic(args.bootstrap, args.output, args.partitions)
    with tempfile.TemporaryDirectory() as schema_dir:
        job = Job(Path(schema_dir))
        report_run(args.way, lambda: WAYS[args.way](args, job))


if __name__ == "__main__":
    main()
