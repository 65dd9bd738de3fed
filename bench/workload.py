"""The benchmark's input: deterministic records, their JSON and Avro encodings, and the expected output.

Avro comes schemaless (``avro``) or in the Confluent wire format (``avro-confluent``: magic byte 0 and the
schema's id in ``SCHEMA_IDS`` before each body, the schemas in a ``by-id/<id>.avsc`` directory, as a
Schema Registry would hand them out).

Every contender runs the same job (drop rows with ``amount < 0``, keep ``id, user, amount * 2 AS amount2,
ts``), so the expected output is known from the generator alone: the ids of the rows with a non-negative
amount, each exactly once. The copy contenders (raw-eos, kcat) are expected to reproduce every input id.
"""

from __future__ import annotations

import io
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import fastavro
import orjson
from confluent_kafka import KafkaError, Message, Producer

from sinks import produce_waiting
from sinks.produce import ANY_PARTITION

log = logging.getLogger(__name__)

FORMATS = ("json", "avro", "avro-confluent")
NEGATIVE_SHARE = 0.10  # the share of rows the filter drops
BASE_TS_MS = 1_764_000_000_000
COUNTRIES = ("DE", "FR", "US", "GB", "JP", "BR", "IN", "NL", "ES", "IT")
SQL = "SELECT id, user, amount * 2 AS amount2, ts FROM input WHERE amount >= 0"

INPUT_SCHEMA: dict = {
    "type": "record",
    "name": "Order",
    "namespace": "epochline.bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "country", "type": "string"},
        {"name": "flag", "type": "boolean"},
        {"name": "product", "type": "string"},
        {"name": "session", "type": "string"},
    ],
}

OUTPUT_SCHEMA: dict = {
    "type": "record",
    "name": "OrderOut",
    "namespace": "epochline.bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "user", "type": "string"},
        {"name": "amount2", "type": "double"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}

SCHEMA_IDS = {"Order": 1, "OrderOut": 2}
"""The ids the avro-confluent input and output are framed with (by record name)."""

# Producer settings for the input: large batches, short linger, no compression, so that no contender
# pays for decompression and the kcat copy moves the bytes exactly as they were written.
INPUT_PRODUCER_CONFIG: dict[str, object] = {
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "compression.type": "none",
    "enable.idempotence": True,
    "acks": "all",
    "queue.buffering.max.messages": 500_000,
    "queue.buffering.max.kbytes": 1_048_576,
}


class WorkloadError(RuntimeError):
    """The input could not be written completely (a delivery failed or timed out)."""


def make_record(record_id: int, rng: random.Random) -> dict:
    """One input row; about one in ten has a negative amount and is dropped by the job."""
    magnitude = round(rng.uniform(0.01, 5000.0), 2)
    return {
        "id": record_id,
        "user": f"user-{rng.randrange(10_000_000):07d}",
        "amount": -magnitude if rng.random() < NEGATIVE_SHARE else magnitude,
        "ts": BASE_TS_MS + record_id,
        "country": rng.choice(COUNTRIES),
        "flag": rng.random() < 0.5,
        "product": f"sku-{rng.randrange(1_000_000):06d}",
        "session": f"{rng.getrandbits(96):024x}",
    }


@dataclass(frozen=True)
class Codec:
    """A wire format of the benchmark: how the harness writes input rows and reads ids back."""

    name: str
    encode: Callable[[dict], bytes]
    decode: Callable[[bytes], dict]


def iso_millis(epoch_ms: int) -> str:
    """epochline's JSON wire form of a timestamp-millis: RFC 3339 in UTC, ``2025-11-24T16:00:00.123Z``."""
    seconds, millis = divmod(epoch_ms, 1000)
    return f"{datetime.fromtimestamp(seconds, UTC):%Y-%m-%dT%H:%M:%S}.{millis:03d}Z"


def _json_encode(row: dict) -> bytes:
    return orjson.dumps({**row, "ts": iso_millis(row["ts"])})


def codec(format_name: str, schema: dict) -> Codec:
    """JSON (orjson; ``ts`` as an RFC 3339 string, since JSON has no timestamp), schemaless Avro (fastavro;
    ``ts`` as timestamp-millis) or the same Avro after the Confluent header of ``schema``'s id, bound to
    ``schema``."""
    if format_name == "json":
        return Codec("json", _json_encode, orjson.loads)
    if format_name not in FORMATS:
        raise ValueError(f"unknown benchmark format {format_name!r}; expected one of {FORMATS}")
    parsed = fastavro.parse_schema(schema)
    header = b"\x00" + SCHEMA_IDS[schema["name"]].to_bytes(4, "big") if format_name == "avro-confluent" else b""

    def encode(row: dict) -> bytes:
        out = io.BytesIO(header)
        out.seek(len(header))
        fastavro.schemaless_writer(out, parsed, row)
        return out.getvalue()

    def decode(value: bytes) -> dict:
        body = io.BytesIO(value)
        body.seek(len(header))
        return fastavro.schemaless_reader(body, parsed, None)

    return Codec(format_name, encode, decode)


def write_schema_files(directory: Path) -> tuple[Path, Path]:
    """The input and output ``.avsc`` files that the epochline and Quix contenders are configured with, and
    beside them ``by-id/<id>.avsc`` (``schemas_by_id``) for the avro-confluent format."""
    by_id = schemas_by_id(directory)
    by_id.mkdir(parents=True, exist_ok=True)
    input_path, output_path = directory / "input.avsc", directory / "output.avsc"
    for schema, path in ((INPUT_SCHEMA, input_path), (OUTPUT_SCHEMA, output_path)):
        text = json.dumps(schema, indent=2)
        path.write_text(text)
        (by_id / f"{SCHEMA_IDS[schema['name']]}.avsc").write_text(text)
    return input_path, output_path


def schemas_by_id(directory: Path) -> Path:
    return directory / "by-id"


@dataclass
class Workload:
    """What was written to the input topic, and what a correct job writes from it."""

    records: int
    input_bytes: int
    expected_ids: set[int] = field(repr=False)
    all_ids: range = field(repr=False)
    produce_seconds: float = 0.0

    @property
    def mean_record_bytes(self) -> float:
        return self.input_bytes / self.records if self.records else 0.0


class _Deliveries:
    """Counts delivery reports so a lost input record fails the benchmark before it starts."""

    def __init__(self) -> None:
        self.delivered = 0
        self.first_error: KafkaError | None = None

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self.first_error = self.first_error or error
            return
        self.delivered += 1


def new_producer(bootstrap: str, extra: dict[str, object] | None = None) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "log_level": 4, **INPUT_PRODUCER_CONFIG, **(extra or {})})


def _flush(producer: Producer, deliveries: _Deliveries, expected: int, topic: str, timeout: float) -> None:
    remaining = producer.flush(timeout)
    if remaining or deliveries.first_error is not None or deliveries.delivered != expected:
        raise WorkloadError(
            f"writing {expected} records to {topic!r}: {deliveries.delivered} delivered, {remaining} still "
            f"queued after {timeout:.0f}s, first error: {deliveries.first_error}"
        )


def generate_input(bootstrap: str, topic: str, records: int, format_name: str, seed: int = 7,
                   spread_over: int | None = None) -> Workload:
    """Write ``records`` rows with ids ``0..records-1`` to ``topic`` and wait until all are acknowledged.

    By default librdkafka's partitioner places them (keyless: whole batches per partition, so partitions
    may get very different shares); ``spread_over=P`` writes id ``i`` to partition ``i % P`` instead, for
    benchmarks whose consumers split the partitions between them (bench/scale_out.py)."""
    encode = codec(format_name, INPUT_SCHEMA).encode
    rng = random.Random(seed)
    producer = new_producer(bootstrap)
    deliveries = _Deliveries()
    expected_ids: set[int] = set()
    input_bytes = 0
    started = time.monotonic()
    for record_id in range(records):
        row = make_record(record_id, rng)
        if row["amount"] >= 0:
            expected_ids.add(record_id)
        value = encode(row)
        input_bytes += len(value)
        produce_waiting(producer, topic, value, on_delivery=deliveries,
                        partition=record_id % spread_over if spread_over else ANY_PARTITION)
        if record_id % 10_000 == 0:
            producer.poll(0)
    _flush(producer, deliveries, records, topic, timeout=120.0)
    elapsed = time.monotonic() - started
    log.info("input written", extra={"topic": topic, "records": records, "seconds": round(elapsed, 2)})
    return Workload(records, input_bytes, expected_ids, range(records), elapsed)


def produce_paced(bootstrap: str, topic: str, format_name: str, ids: range, rate: float,
                  stamps: dict[int, int], until: Callable[[], bool] | None = None) -> None:
    """Write one non-negative row per id at ``rate`` rows/s; put each row's producer stamp into ``stamps``.
    ``until``, asked before each row, ends the writing early when it says True.

    The timestamp comes from the delivery report, i.e. the message timestamp the broker stored, so the
    latency is measured from the same clock value a consumer of the input topic sees.
    """
    encode = codec(format_name, INPUT_SCHEMA).encode
    rng = random.Random(11)
    producer = new_producer(bootstrap, {"linger.ms": 0})
    # Connected before the first row, as the engine's sink is (sinks.transactional): an idempotent producer
    # asks for its producer id only over an open connection and otherwise asks again 500 ms later, so the
    # first rows reached the topic 0.35-0.5 s after they were written (a consumer made 0.15 s in saw its first
    # one 0.36 s later, against 0.01 s once the producer was 1 s old); a start timed from a warm task
    # process, 0.2 s to its first fetch, measured that wait instead of its own.
    for _ in range(2):
        producer.list_topics(topic, timeout=10)
    deliveries = _Deliveries()

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        deliveries(error, message)
        if error is None:
            stamps[int(message.key())] = message.timestamp()[1]

    sent = 0
    started = time.monotonic()
    for record_id in ids:
        if until is not None and until():
            break
        row = make_record(record_id, rng)
        row["amount"] = abs(row["amount"])
        due = started + sent / rate
        pause = due - time.monotonic()
        if pause > 0:
            producer.poll(pause)
        producer.produce(topic, key=str(record_id).encode(), value=encode(row), on_delivery=on_delivery)
        producer.poll(0)
        sent += 1
    _flush(producer, deliveries, sent, topic, timeout=30.0)
