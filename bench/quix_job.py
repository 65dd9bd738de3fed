"""quix-eos: the benchmark job written the way Quix Streams documents it, with exactly-once processing.

Per record: deserialize (Quix's JSON deserializer, or its schemaless ``AvroDeserializer`` with the input
schema), drop rows with ``amount < 0``, keep ``id, user, amount * 2 AS amount2, ts``, serialize (JSON, or
``AvroSerializer`` with the output schema) and produce. ``commit_interval=1.0`` gives the same 1 s
transaction cadence as epochline's checkpoints. With ``--count`` the app stops itself through Quix's own
bounded run (``Application.run(count=...)``) once it has produced that many outputs, committing on the way
out; without it the app runs until SIGTERM (the latency probe).

Run by ``bench/run.py`` in its own process so its CPU time and RSS are its own.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from quixstreams import Application
from quixstreams.models.serializers.avro import AvroDeserializer, AvroSerializer
from quixstreams.models.serializers.json import JSONDeserializer, JSONSerializer


def project(row: dict) -> dict:
    return {"id": row["id"], "user": row["user"], "amount2": row["amount"] * 2, "ts": row["ts"]}


def build_app(args: argparse.Namespace) -> Application:
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.group,
        processing_guarantee="exactly-once",
        commit_interval=1.0,
        auto_offset_reset="earliest",
        loglevel="WARNING",
        state_dir=args.state_dir,
    )
    if args.format == "avro":
        input_schema = json.loads(Path(args.input_schema).read_text())
        output_schema = json.loads(Path(args.output_schema).read_text())
        deserializer, serializer = AvroDeserializer(input_schema), AvroSerializer(output_schema)
    else:
        deserializer, serializer = JSONDeserializer(), JSONSerializer()
    source = app.topic(args.input, value_deserializer=deserializer)
    sink = app.topic(args.output, value_serializer=serializer)
    frame = app.dataframe(source)
    frame = frame.filter(lambda row: row["amount"] >= 0).apply(project)
    frame.to_topic(sink)
    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--format", choices=("json", "avro"), required=True)
    parser.add_argument("--input-schema", required=True)
    parser.add_argument("--output-schema", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--count", type=int, default=0, help="stop after this many outputs (0: run until SIGTERM)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    build_app(args).run(count=args.count, collect=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
