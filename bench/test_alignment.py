"""bench/alignment.py's read, on a small topic: both ways read every record, the aligned one in order."""

from __future__ import annotations

from pathlib import Path

from bench.alignment import PARTITIONS, read_all
from bench.workload import generate_input, write_schema_files
from engine.testing import create_unique_topic


def test_both_reads_hand_out_every_record_and_the_aligned_one_no_row_behind_an_earlier_batch(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    topic = create_unique_topic(kafka_bootstrap, "align-bench", PARTITIONS)
    generate_input(kafka_bootstrap, topic, 6_000, "json", spread_over=PARTITIONS)
    schema, _ = write_schema_files(tmp_path)
    plain = read_all(kafka_bootstrap, topic, schema, aligned=False)
    aligned = read_all(kafka_bootstrap, topic, schema, aligned=True)
    assert plain["records"] == aligned["records"] == 6_000
    assert aligned["disorder_ms"] == 0
