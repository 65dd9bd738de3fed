"""Decode and encode throughput of protobuf-confluent, beside confluent-kafka's own per-record deserializer.

    python bench/protobuf_bench.py [--records 100000] [--batch-size 10000]

Two message types: ``event`` (examples/schema-files/event.proto, the 8-field record of the other format
benchmarks) and ``all-types`` (tests/schemas/protos/all_types.proto: every mapped type, nested, repeated,
maps, wrappers, timestamps). Payloads are made by protobuf-confluent's encoder (no registry: the schema file
and schema id 1), then decoded in batches of ``--batch-size`` as a Kafka source would. The "peer" rows are
confluent-kafka's ``ProtobufDeserializer`` without a registry, which only parses each payload into a
message object (no Arrow), to show what the column building costs on top of parsing.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import google.protobuf
import pyarrow as pa
from decode_bench import batches_of, event_batch, throughput  # bench scripts run as python bench/NAME.py

from schemas import FormatSpec, make_format
from schemas.protobuf_format import ProtobufConfluentFormat

ROOT = Path(__file__).resolve().parent.parent
EVENT_PROTO = ROOT / "examples" / "schema-files" / "event.proto"
ALL_TYPES_PROTO = ROOT / "tests" / "schemas" / "protos" / "all_types.proto"
def all_types_batch(count: int, schema: pa.Schema) -> pa.RecordBatch:
    rng = random.Random(5)
    rows = [_all_types_row(n, rng) for n in range(count)]
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def _all_types_row(n: int, rng: random.Random) -> dict[str, Any]:
    micros = 1_700_000_000_000_000 + n * 1_001
    return {
        "i32": rng.randrange(-2**31, 2**31), "s32": -n, "sf32": n, "i64": rng.randrange(-2**63, 2**63),
        "s64": -n * 3, "sf64": n * 5, "u32": n, "f32": n * 2, "u64": rng.randrange(2**64), "f64": n,
        "fl": 0.5 * n, "db": rng.random(), "flag": n % 2 == 0, "text": f"text-{n}", "blob": b"\x00\x01" * (n % 4),
        "color": ["RED", "GREEN", "BLUE"][n % 3], "maybe_text": None if n % 3 else "m", "maybe_count": n or None,
        "maybe_color": None, "address": None if n % 5 == 0 else {"street": f"{n} Main St", "zip": n % 99_999},
        "tags": [f"t{k}" for k in range(n % 4)], "deltas": [-1, 2][: n % 3], "palette": ["RED"] * (n % 2),
        "visits": [{"at": micros + k, "page": f"/p{k}"} for k in range(n % 3)],
        "counts": [(f"k{k}", k) for k in range(n % 3)], "addresses": [(1, {"street": "x", "zip": None})],
        "ratios": [(False, 0.5), (True, 1.5)][: n % 3], "created": micros, "history": [micros, micros + 1],
        "w_double": 1.5, "w_float": None, "w_int64": -n, "w_uint64": None, "w_int32": n % 100, "w_uint32": None,
        "w_bool": n % 2 == 1, "w_string": f"s{n}", "w_bytes": None,
        "card": f"card-{n}" if n % 2 else None, "account": n if n % 2 == 0 else None, "billing": None,
    }


def measure(label: str, fmt: ProtobufConfluentFormat, batch: pa.RecordBatch, batch_size: int,
            repeat: int) -> list[dict[str, Any]]:
    slices = [batch.slice(start, batch_size) for start in range(0, batch.num_rows, batch_size)]
    payloads = [payload for part in slices for payload in fmt.encode(part)]
    chunks = batches_of(payloads, batch_size)
    decoded = pa.Table.from_batches([fmt.decode(chunk).batch for chunk in chunks])
    assert decoded.equals(pa.Table.from_batches([batch])), f"{label}: decode(encode(batch)) differs"
    decode = throughput(len(payloads), lambda: [fmt.decode(chunk) for chunk in chunks], repeat)
    encode = throughput(batch.num_rows, lambda: [fmt.encode(part) for part in slices], repeat)
    size = sum(len(p) for p in payloads) / len(payloads)
    return [{"format": label, "bytes": size, "decode": decode, "encode": encode},
            {"format": f"  peer: ProtobufDeserializer, {label}", "bytes": size,
             "decode": _peer_decode(fmt, payloads, repeat)}]


def _peer_decode(fmt: ProtobufConfluentFormat, payloads: list[bytes], repeat: int) -> float:
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

    deserializer = ProtobufDeserializer(fmt.message_class, {"use.deprecated.format": False})
    return throughput(len(payloads), lambda: [deserializer(p, None) for p in payloads], repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3, help="report the best of this many runs")
    args = parser.parse_args()

    event = make_format(FormatSpec("protobuf-confluent", schema=EVENT_PROTO, schema_id=1))
    everything = make_format(FormatSpec("protobuf-confluent", schema=ALL_TYPES_PROTO, schema_id=1,
                                        message="epochline.test.Everything"))
    assert isinstance(event, ProtobufConfluentFormat) and isinstance(everything, ProtobufConfluentFormat)
    rows = [*measure("event", event, event_batch(args.records, event.arrow_schema), args.batch_size, args.repeat),
            *measure("all-types", everything, all_types_batch(args.records, everything.arrow_schema),
                     args.batch_size, args.repeat)]

    print(f"{args.records:,} records, batches of {args.batch_size:,}, best of {args.repeat}, "
          f"Python {sys.version.split()[0]}, pyarrow {pa.__version__}, protobuf {google.protobuf.__version__}")
    print(f"{'format':44} {'bytes/rec':>9} {'decode rec/s':>14} {'encode rec/s':>14}")
    for row in rows:
        encode = f"{row['encode']:,.0f}" if "encode" in row else "-"
        print(f"{row['format']:44} {row['bytes']:9.0f} {row['decode']:>14,.0f} {encode:>14}")


if __name__ == "__main__":
    main()
