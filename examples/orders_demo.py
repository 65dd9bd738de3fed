"""The quickstart: write orders, run ``examples/orders-clean.yaml`` with ``epochline run --stop-at-end``,
and check the output with read_committed: each expected id exactly once, each malformed record
dead-lettered exactly once.

Each run uses fresh topic names (the config's names plus a run suffix), so it can be repeated on one broker.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import yaml
from confluent_kafka import Producer

from connectors.admin import create_topic
from engine.testing import read_values
from sinks import produce_waiting

MALFORMED_EVERY = 10_000


def order(i: int) -> bytes:
    if i % MALFORMED_EVERY == MALFORMED_EVERY - 1:
        return b'{"id": ' + str(i).encode() + b', "amount": '  # truncated JSON: dead-lettered
    ts = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(milliseconds=i)
    amount = -1.5 if i % 10 == 0 else i % 997 + 0.25
    return orjson.dumps({"id": i, "user": f"user-{i % 100}", "amount": amount, "ts": ts.isoformat()})


def expected_ids(count: int) -> Counter[int]:
    return Counter(i for i in range(count) if i % MALFORMED_EVERY != MALFORMED_EVERY - 1 and i % 10 != 0)


def generate(bootstrap: str, topic: str, count: int) -> None:
    create_topic(bootstrap, topic, partitions=4)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4"})
    for i in range(count):
        produce_waiting(producer, topic, order(i), partition=i % 4, wait_s=0.1)
    producer.flush(60)


def verify(bootstrap: str, output: str, dead_letter: str, count: int) -> bool:
    got = Counter(orjson.loads(v)["id"] for v in read_values(bootstrap, output))
    want = expected_ids(count)
    malformed = count // MALFORMED_EVERY
    dead = read_values(bootstrap, dead_letter)
    duplicates = sum(n - 1 for n in got.values() if n > 1)
    missing = sum((want - got).values())
    print(f"output {sum(got.values())} records (expected {sum(want.values())}): "
          f"{missing} missing, {duplicates} duplicated; dead-lettered {len(dead)} (expected {malformed})")
    return got == want and len(dead) == malformed


def demo_config(template: Path, suffix: str, workdir: Path) -> tuple[Path, dict]:
    """The example config with this run's topic names and state dir; other keys stay as written."""
    config = yaml.safe_load(template.read_text())
    config["name"] = f"{config['name']}-{suffix}"
    for section in ("source", "sink", "dead_letter"):
        config[section]["topic"] = f"{config[section]['topic']}-{suffix}"
    config["source"]["schema"] = str((template.parent / config["source"]["schema"]).absolute())
    config["checkpoint"]["dir"] = str(workdir / "state" / config["name"])
    path = workdir / f"{config['name']}.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path, config


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--config", type=Path, default=Path(__file__).with_name("orders-clean.yaml"))
    parser.add_argument("--workdir", type=Path, default=Path(".epochline/demo"))
    args = parser.parse_args()
    path, config = demo_config(args.config, str(int(time.time())), args.workdir)
    generate(args.bootstrap, config["source"]["topic"], args.count)
    for section in ("sink", "dead_letter"):
        create_topic(args.bootstrap, config[section]["topic"], partitions=4)
    print(f"wrote {args.count} orders to {config['source']['topic']}; running epochline run {path} --stop-at-end")
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "engine.cli", "--log-level", "WARNING", "run", str(path),
                    "--bootstrap-servers", args.bootstrap, "--stop-at-end"], check=True)
    print(f"pipeline finished in {time.monotonic() - started:.1f}s")
    ok = verify(args.bootstrap, config["sink"]["topic"], config["dead_letter"]["topic"], args.count)
    print("exactly once: OK" if ok else "exactly once: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
