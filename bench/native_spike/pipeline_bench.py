"""The benchmark's whole JSON job (decode, SQL, encode) in one process, with its records moved between Kafka
and Arrow in several ways, each ``--way``:

- ``python``: confluent-kafka's per-record calls (a Python object per record: what sources and sinks do
  with ``EPOCHLINE_NATIVE_IO=0``);
- ``native``: the Rust spike's own clients (``src/lib.rs``), ``c``: the C module sources and sinks use
  (``connectors/_native_io.c``, first written here as ``c/fastio.c``) on confluent-kafka's clients; each
  inline, ``-threads`` (consuming and producing on threads of their own: the calls release the GIL, so they
  overlap the main thread's decode, SQL and encode), or ``-buffers`` (threads, and no bytes object per record
  on either side: ``JsonFormat.decode_column``).

The transform is epochline's own (``JsonFormat``, ``SqlOperator``). Every way flushes the producer every
second (idempotent, no transaction). CPU from getrusage (every thread).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from bench.native_spike.timing import report_run
from bench.workload import SQL, write_schema_files
from connectors.admin import create_topic
from connectors.fetched import ColumnFetcher, RecordColumns
from connectors.metadata import METADATA_FIELDS
from connectors.native_io import native_io
from connectors.source import FETCH_DEFAULTS, PREFETCH_BOUND, decode_records
from engine.transforms.sql import SqlOperator
from schemas import Format
from schemas.factory import FormatSpec, make_format
from schemas.json_format import JsonFormat
from sinks.produce import produce_all, produce_column

BATCH = 10_000  # the source's max_batch_records default when the spike was measured
FLUSH_EVERY_S = 1.0  # the benchmark's checkpoint interval
Batch = tuple[pa.BinaryArray, list["pa.Array[Any]"]]  # the values and the partition, offset and timestamp columns


class Job:
    """Decode a batch of JSON values, run the benchmark's SQL, encode the rows as JSON."""

    def __init__(self, schema_dir: Path) -> None:
        input_schema, output_schema = write_schema_files(schema_dir)
        self.input: Format = make_format(FormatSpec(format="json", schema=input_schema))
        self.output = cast(JsonFormat, make_format(FormatSpec(format="json", schema=output_schema)))
        self.sql = SqlOperator(SQL)

    def transform(self, batch: pa.RecordBatch) -> list[bytes]:
        table = self.sql.process(pa.Table.from_batches([batch]), None)
        values: list[bytes] = []
        for out in table.to_batches():
            values += self.output.encode(out)
        return values


def _consumer_config(args: argparse.Namespace) -> dict[str, Any]:
    """The source's settings (``connectors.source``) that matter here."""
    return {"bootstrap.servers": args.bootstrap, "group.id": f"spike-{uuid.uuid4().hex}",
            "enable.auto.commit": False, "isolation.level": "read_committed", **FETCH_DEFAULTS, **PREFETCH_BOUND}


def _producer_config(args: argparse.Namespace) -> dict[str, Any]:
    """The sink's settings (``sinks.writer.KafkaWriter``) that matter here, without a transaction."""
    return {"bootstrap.servers": args.bootstrap, "linger.ms": 5, "batch.num.messages": 10_000,
            "compression.type": "lz4", "enable.idempotence": True, "delivery.report.only.error": True}


def python_way(args: argparse.Namespace, job: Job) -> int:
    consumer = Consumer(_consumer_config(args))
    consumer.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in range(args.partitions)])
    producer = Producer(_producer_config(args))
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


@dataclass(frozen=True)
class Ends:
    """Where the records come from and go to: the Rust spike's own clients, or the C functions on
    confluent-kafka's clients. ``produce`` takes an Arrow binary column; ``flush`` waits for delivery."""

    batches: Callable[[], Iterator[Batch]]
    produce: Callable[[pa.Array[Any]], None]
    flush: Callable[[], None]


def _columns(count: int, data: bytes, value_offsets: bytes, parts: bytes, offsets: bytes,
             stamps: bytes) -> Batch:
    """A batch's buffers as the value column and the partition, offset and timestamp columns."""
    values = pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(value_offsets), pa.py_buffer(data)])
    return values, [pa.Array.from_buffers(pa.int32(), count, [None, pa.py_buffer(parts)]),
                    pa.Array.from_buffers(pa.int64(), count, [None, pa.py_buffer(offsets)]),
                    pa.Array.from_buffers(pa.timestamp("ms", tz="UTC"), count, [None, pa.py_buffer(stamps)])]


def rust_ends(args: argparse.Namespace) -> Ends:
    from epochline_native_spike import ColumnConsumer, ColumnProducer

    producer = ColumnProducer(args.bootstrap, 5)

    def batches() -> Iterator[Batch]:
        consumer = ColumnConsumer(args.bootstrap, f"spike-{uuid.uuid4().hex}", args.topic, args.partitions)
        seen = 0
        while seen < args.records:
            data, value_offsets, parts, offsets, stamps, count = consumer.poll_columns(BATCH, 5000)
            if count == 0:
                return
            seen += count
            yield _columns(count, data, value_offsets, parts, offsets, stamps)

    def produce(column: pa.Array[Any]) -> None:
        if len(column):
            _, offsets, data = column.buffers()
            producer.produce_column(args.output, -1, data.to_pybytes(), offsets.to_pybytes())  # one copy each

    return Ends(batches, produce, lambda: producer.flush(30))


def c_ends(args: argparse.Namespace) -> Ends:
    """The C module the source and sink use (``connectors/_native_io.c``), on confluent-kafka's clients with
    the same settings, through the same calls: ``connectors.fetched.ColumnFetcher`` and
    ``sinks.produce.produce_column``."""
    native = native_io()
    if native is None:
        raise SystemExit("the C module (connectors/_native_io.c) is not built: pip install -e . with a C compiler")
    producer = Producer(_producer_config(args))

    def batches() -> Iterator[Batch]:
        consumer = Consumer(_consumer_config(args))
        fetcher = ColumnFetcher(consumer, args.topic, BATCH, native)
        consumer.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in range(args.partitions)])
        fetcher.attach(range(args.partitions))
        seen = 0
        while seen < args.records:
            records = fetcher.fetch(5.0).records
            if not len(records):
                return
            seen += len(records)
            yield records.values, records.metadata_arrays()[:3]
        fetcher.close()
        consumer.close()

    return Ends(batches, lambda column: produce_column(native, producer, args.output, column),
                lambda: producer.flush(30))


def _with_metadata(batch: pa.RecordBatch, metadata: list[pa.Array[Any]]) -> pa.RecordBatch:
    """The decoded values beside the partition, offset and timestamp columns, named as the source names them."""
    names = [field.name for field in METADATA_FIELDS[:len(metadata)]]
    return pa.RecordBatch.from_arrays([*batch.columns, *metadata], names=[*batch.schema.names, *names])


def _decoded(job: Job, values: pa.BinaryArray, metadata: list[pa.Array[Any]]) -> pa.RecordBatch:
    decoded = job.input.decode(values.to_pylist())
    if len(decoded.indices) != len(values):
        raise RuntimeError("the spike's input has no bad records")
    return _with_metadata(decoded.batch, metadata)


def _inline(ends: Ends, job: Job) -> int:
    seen, flushed = 0, time.monotonic()
    for values, metadata in ends.batches():
        ends.produce(pa.array(job.transform(_decoded(job, values, metadata)), pa.binary()))
        seen += len(values)
        if time.monotonic() - flushed >= FLUSH_EVERY_S:
            ends.flush()
            flushed = time.monotonic()
    ends.flush()
    return seen


def _staged(ends: Ends, transform: Callable[[pa.BinaryArray, list[pa.Array[Any]]], list[Any]]) -> int:
    """Consuming and producing each on a thread of their own, two batches in flight between the stages; the
    calling thread transforms each consumed batch into the columns to produce."""
    consumed: queue.Queue[Batch | None] = queue.Queue(maxsize=2)
    encoded: queue.Queue[Any] = queue.Queue(maxsize=2)
    done = object()

    def consume() -> None:
        for item in ends.batches():
            consumed.put(item)
        consumed.put(None)

    def write() -> None:
        flushed = time.monotonic()
        while (item := encoded.get()) is not done:
            ends.produce(item)
            if time.monotonic() - flushed >= FLUSH_EVERY_S:
                ends.flush()
                flushed = time.monotonic()
        ends.flush()

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


def _threads(ends: Ends, job: Job) -> int:
    """Consuming and producing on threads of their own; the values still a list of bytes in between."""
    return _staged(ends, lambda values, metadata: [pa.array(job.transform(_decoded(job, values, metadata)),
                                                            pa.binary())])


def _decoded_from_column(job: Job, values: pa.BinaryArray, metadata: list[pa.Array[Any]]) -> pa.RecordBatch:
    """``JsonFormat.decode_column``: the values joined by an Arrow kernel and parsed with no bytes object per
    record, after the format's checks made on the joined buffer (as the source decodes)."""
    decoded = cast(JsonFormat, job.input).decode_column(values)
    if len(decoded.indices) != len(values):
        raise RuntimeError("the spike's input has no bad records")
    return _with_metadata(decoded.batch, metadata)


def _buffers(ends: Ends, job: Job) -> int:
    """``_threads`` with no bytes object per record on either side (``_decoded_from_column``)."""

    def transform(values: pa.BinaryArray, metadata: list[pa.Array[Any]]) -> list[pa.Array[Any]]:
        table = job.sql.process(pa.Table.from_batches([_decoded_from_column(job, values, metadata)]), None)
        return [job.output.encode_column(out).combine_chunks() for out in table.to_batches()]

    return _staged(ends, transform)


ENDS = {"native": rust_ends, "c": c_ends}
STAGES = {"": _inline, "-threads": _threads, "-buffers": _buffers}
WAYS: dict[str, Callable[[argparse.Namespace, Job], int]] = {
    "python": python_way,
    **{f"{end}{stage}": (lambda args, job, end=end, stage=stage: STAGES[stage](ENDS[end](args), job))
       for end in ENDS for stage in STAGES},
}


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
