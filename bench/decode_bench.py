"""Decode and encode throughput of every wire format on ~150-byte event records.

    python bench/decode_bench.py [--records 1000000] [--batch-size 10000]

Records follow examples/schema-files/event.avsc / event.schema.json (id long, user string, amount double,
ts timestamp, country string, flag boolean, session uuid string, note nullable string). Payloads are made
by each format's own encoder, then decoded in batches of ``--batch-size`` as a Kafka source would, from and
into Arrow binary columns. The "no C codec" rows are the JSON format without ``schemas/_native_json.c``
(Arrow's reader, DuckDB's writer) and Avro without ``schemas/_native_avro.c`` (numpy and Arrow compute). Two
alternatives are measured beside the chosen JSON paths, so the choice stays justified by numbers:
orjson + ``RecordBatch.from_pylist`` for decode, and ``to_pylist`` + ``orjson.dumps`` for encode. The
"peer" row is what a per-record Python consumer does: fastavro with logical types into dicts, no Arrow.
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import fastavro
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from schemas import FormatSpec, avro_columns, make_format
from schemas import native_json as native_json_module
from schemas.avro_arrow import load_avro_schema
from schemas.base import Format, decode_column, encode_column

ROOT = Path(__file__).resolve().parent.parent

EVENT_AVSC = ROOT / "examples" / "schema-files" / "event.avsc"
EVENT_JSON_SCHEMA = ROOT / "examples" / "schema-files" / "event.schema.json"
COUNTRIES = ["DE", "FR", "US", "GB", "NL", "SE", "JP", "BR"]


def event_batch(count: int, schema: pa.Schema) -> pa.RecordBatch:
    """``count`` event rows built column-wise (fast even at millions)."""
    ids = pa.array(range(count), pa.int64())
    return pa.RecordBatch.from_pydict({
        "id": ids,
        "user": [f"user-{n % 100_000:06d}" for n in range(count)],
        "amount": pc.divide(pc.cast(pc.multiply(ids, 7919) if count else ids, pa.float64()), 1000.0),
        "ts": pa.array(range(1_714_564_800_000_000, 1_714_564_800_000_000 + count * 1_001, 1_001),
                       pa.timestamp("us", tz="UTC")),
        "country": [None if n % 50 == 0 else COUNTRIES[n % len(COUNTRIES)] for n in range(count)],
        "flag": [n % 3 == 0 for n in range(count)],
        "session": [f"{n:08x}-0000-4000-8000-{n * 2654435761 % 2**48:012x}" for n in range(count)],
        "note": [None if n % 4 else "manual review" for n in range(count)],
    }, schema=schema)


def batches_of(items: Sequence, size: int) -> list[Sequence]:
    return [items[start:start + size] for start in range(0, len(items), size)]


def throughput(count: int, work: Callable[[], object], repeat: int) -> float:
    """Records per second of the fastest of ``repeat`` runs (on a shared machine, the least disturbed one)."""
    fastest = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        fastest = min(fastest, time.perf_counter() - started)
    return count / fastest


def measure_format(label: str, fmt: Format, batch: pa.RecordBatch, batch_size: int,
                   repeat: int) -> tuple[list[bytes], dict]:
    """Encode and decode as a sink and a source do: Arrow binary columns in and out (``encode_column`` and
    ``decode_column``), so a format that reads and writes columns makes no bytes object per record."""
    slices = [batch.slice(start, batch_size) for start in range(0, batch.num_rows, batch_size)]
    payloads = [payload for part in slices for payload in encode_column(fmt, part).to_pylist()]
    chunks = [pa.array(chunk, pa.binary()) for chunk in batches_of(payloads, batch_size)]
    decoded_rows = sum(decode_column(fmt, chunk).batch.num_rows for chunk in chunks)
    assert decoded_rows == batch.num_rows, f"{label}: decoded {decoded_rows} of {batch.num_rows}"
    encode_rate = throughput(batch.num_rows, lambda: [encode_column(fmt, part) for part in slices], repeat)
    decode_rate = throughput(len(payloads), lambda: [decode_column(fmt, chunk) for chunk in chunks], repeat)
    size = sum(len(p) for p in payloads if p) / len(payloads)
    return payloads, {"format": label, "bytes": size, "decode": decode_rate, "encode": encode_rate}


def json_decode_alternative(payloads: list[bytes], schema: pa.Schema, batch_size: int, repeat: int) -> float:
    """orjson per record + one Arrow build with the wire schema + cast (the path not chosen)."""
    wire = pa.schema([f.with_type(pa.string()) if pa.types.is_timestamp(f.type) else f for f in schema])

    def run() -> None:
        for chunk in batches_of(payloads, batch_size):
            pa.RecordBatch.from_pylist([orjson.loads(p) for p in chunk], schema=wire).cast(schema)

    return throughput(len(payloads), run, repeat)


def json_encode_alternative(batch: pa.RecordBatch, batch_size: int, repeat: int) -> float:
    """Timestamps formatted column-wise, then ``to_pylist`` + ``orjson.dumps`` per row (the path not chosen)."""

    def run() -> None:
        for start in range(0, batch.num_rows, batch_size):
            part = batch.slice(start, batch_size)
            columns = [pc.strftime(c, format="%Y-%m-%dT%H:%M:%SZ") if pa.types.is_timestamp(c.type) else c
                       for c in part.columns]
            rows = pa.RecordBatch.from_arrays(columns, names=part.schema.names).to_pylist()
            [orjson.dumps(row) for row in rows]

    return throughput(batch.num_rows, run, repeat)


def fastavro_dicts_only(payloads: list[bytes], repeat: int) -> float:
    parsed = fastavro.parse_schema(load_avro_schema(EVENT_AVSC))
    return throughput(len(payloads), lambda: [fastavro.schemaless_reader(io.BytesIO(p), parsed, None)
                                              for p in payloads], repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3, help="report the best of this many runs")
    args = parser.parse_args()

    formats = {
        "json (JSON Schema)": make_format(FormatSpec("json", schema=EVENT_JSON_SCHEMA)),
        "json (JSON Schema), no C codec": _without_c_codec(
            native_json_module.SWITCH, native_json_module.native_json,
            lambda: make_format(FormatSpec("json", schema=EVENT_JSON_SCHEMA))),
        "json (inferred)": make_format(FormatSpec("json")),
        "avro": make_format(FormatSpec("avro", schema=EVENT_AVSC)),
        "avro, no C codec": _without_c_codec(
            avro_columns.SWITCH, avro_columns.native_avro, lambda: make_format(FormatSpec("avro", schema=EVENT_AVSC))),
        "avro-confluent": _confluent(),
    }
    batch = event_batch(args.records, formats["avro"].arrow_schema)
    rows = []
    outputs = {}
    for label, fmt in formats.items():
        outputs[label], row = measure_format(label, fmt, batch, args.batch_size, args.repeat)
        rows.append(row)
    raw_values = pa.RecordBatch.from_pydict({"value": pa.array(outputs["json (JSON Schema)"], pa.binary())})
    rows.append(measure_format("raw", make_format(FormatSpec("raw")), raw_values, args.batch_size, args.repeat)[1])
    json_schema = formats["json (JSON Schema)"].arrow_schema
    rows.append({"format": "  alt: json decode orjson+from_pylist", "bytes": rows[0]["bytes"],
                 "decode": json_decode_alternative(outputs["json (JSON Schema)"], json_schema, args.batch_size,
                                                   args.repeat)})
    rows.append({"format": "  alt: json encode to_pylist+orjson", "bytes": rows[0]["bytes"],
                 "encode": json_encode_alternative(batch.cast(json_schema), args.batch_size, args.repeat)})
    rows.append({"format": "  peer: fastavro per record, dicts only", "bytes": rows[3]["bytes"],
                 "decode": fastavro_dicts_only(outputs["avro"], args.repeat)})

    print(f"{args.records:,} records, batches of {args.batch_size:,}, best of {args.repeat}, "
          f"Python {sys.version.split()[0]}, pyarrow {pa.__version__}, fastavro {fastavro.__version__}")
    print(f"{'format':40} {'bytes/rec':>9} {'decode rec/s':>14} {'encode rec/s':>14}")
    for row in rows:
        decode = f"{row['decode']:,.0f}" if "decode" in row else "-"
        encode = f"{row['encode']:,.0f}" if "encode" in row else "-"
        print(f"{row['format']:40} {row['bytes']:9.0f} {decode:>14} {encode:>14}")


def _without_c_codec(switch: str, module: functools._lru_cache_wrapper[ModuleType | None],
                     make: Callable[[], Format]) -> Format:
    """The format as it is without its C module (the environment variable ``switch`` off while it is made)."""
    os.environ[switch] = "0"
    module.cache_clear()
    try:
        return make()
    finally:
        del os.environ[switch]
        module.cache_clear()


def _confluent() -> Format:
    """Confluent framing with the event schema registered (as a local file) under id 1."""
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="epochline-bench-"))
    (directory / "1.avsc").write_text(EVENT_AVSC.read_text())
    return make_format(FormatSpec("avro-confluent", schema_dir=directory, schema_id=1))


if __name__ == "__main__":
    main()
