"""What reading a backlog aligned by event time costs, and what it buys: a source over a 6-partition JSON topic.

    python bench/alignment.py [--records 600000] [--repeat 3] [--bootstrap HOST:PORT]

The input is bench/workload.py's (``ts`` grows with the id; id ``i`` on partition ``i % 6``), written once.
Each repetition reads the whole topic with a ``KafkaSource`` twice, in alternating order: as a stateless
connector reads it, and aligned by ``ts`` (``align_event_time``, what a repartitioned window's source does).
Per read: records/s over the wall time from ``open`` to the last record, the process CPU (user+sys) per
record, and **disorder**: how far behind the largest ``ts`` handed out before it the earliest row of each
batch is, at the worst batch (how late, in event time, a row would arrive at a repartition topic).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo's packages (bench, connectors) importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow.compute as pc

from bench.run import RESULTS_DIR, broker, delete_or_warn
from bench.workload import generate_input, write_schema_files
from connectors.admin import create_topic, end_offsets
from connectors.source import KafkaSource, SourceSettings
from schemas import FormatSpec

PARTITIONS = 6


def read_all(bootstrap: str, topic: str, schema: Path, aligned: bool) -> dict[str, float]:
    settings = SourceSettings(name="bench", topic=topic, format=FormatSpec("json", schema=schema),
                              event_time_column="ts", align_event_time=aligned)
    ends = end_offsets(bootstrap, topic)
    records = 0
    seen_max: int | None = None
    disorder = 0
    cpu_before, wall_before = time.process_time(), time.monotonic()
    with KafkaSource(settings, bootstrap, f"bench-align-{uuid.uuid4().hex[:8]}") as source:
        source.open()
        while not source.reached(ends):
            batch = source.poll_batch(0.1)
            if batch is None:
                continue
            times = pc.cast(batch.batch.column("ts"), "int64")
            earliest, latest = pc.min(times).as_py() // 1000, pc.max(times).as_py() // 1000
            if seen_max is not None:
                disorder = max(disorder, seen_max - earliest)
            seen_max = latest if seen_max is None else max(seen_max, latest)
            records += batch.batch.num_rows
    wall, cpu = time.monotonic() - wall_before, time.process_time() - cpu_before
    return {"records": records, "records_per_s": records / wall, "cpu_us_per_record": cpu / records * 1e6,
            "disorder_ms": disorder}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=600_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bootstrap", help="use this broker instead of starting a private one")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"unaligned": [], "aligned": []}
    with broker(args.bootstrap) as (bootstrap, _), tempfile.TemporaryDirectory() as workdir:
        schema, _ = write_schema_files(Path(workdir))
        topic = f"align-{uuid.uuid4().hex[:8]}"
        try:
            create_topic(bootstrap, topic, PARTITIONS)
            generate_input(bootstrap, topic, args.records, "json", spread_over=PARTITIONS)
            for repeat in range(args.repeat):
                order = ["unaligned", "aligned"] if repeat % 2 == 0 else ["aligned", "unaligned"]
                for mode in order:
                    result = read_all(bootstrap, topic, schema, aligned=mode == "aligned")
                    runs[mode].append(result)
                    print(f"{mode:>9}: {result['records_per_s']:>9,.0f} records/s, "
                          f"{result['cpu_us_per_record']:.2f} us CPU/record, disorder {result['disorder_ms']:,} ms")
        finally:
            delete_or_warn(bootstrap, [topic])
    for mode, results in runs.items():
        print(f"{mode:>9} median: {statistics.median(r['records_per_s'] for r in results):,.0f} records/s, "
              f"{statistics.median(r['cpu_us_per_record'] for r in results):.2f} us CPU/record, "
              f"worst disorder {max(r['disorder_ms'] for r in results):,} ms")
    out = RESULTS_DIR / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-alignment.json"
    out.write_text(json.dumps({"records": args.records, "partitions": PARTITIONS, "runs": runs}, indent=2))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
