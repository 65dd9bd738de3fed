"""Exactly-once, proven against the real broker by killing real ``epochline run`` processes.

Every assertion accounts for each input id with ``read_committed``: output plus dead letters (each with its
reason) equal the input, and a ``read_uncommitted`` reader saw more (aborted epochs), so the tests can fail.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from connectors.admin import create_topic
from engine.testing import read_values
from engine.testing.accounting import assert_dead_letters, assert_exactly_once
from engine.testing.connectors import LiveInput, start_connector, write_config

RECORDS = 200_000
PARTITIONS = 4
SECONDS_PER_KILL = 3.0  # the input streams in over about as long as the kills take
POISON_EVERY = 25_000
BASE_TS_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def order(i: int) -> bytes:
    if i % POISON_EVERY == POISON_EVERY - 1:
        return b'{"id": ' + str(i).encode() + b', "amount": '  # malformed JSON
    amount = -1.0 if i % 10 == 0 else float(i % 1000)
    return orjson.dumps({"id": i, "user": f"u{i % 50}", "amount": amount, "ts": BASE_TS_MS + i * 10})


def is_poison(i: int) -> bool:
    return i % POISON_EVERY == POISON_EVERY - 1


SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "user": {"type": "string"}, "amount": {"type": "number"},
                   "ts": {"type": "integer"}},
    "required": ["id", "user", "amount", "ts"],
}


def connector_config(tmp_path: Path, name: str, source: str, sink: str, dlq: str, transform: list[dict],
                     lateness: str = "1h") -> Path:
    schema_path = tmp_path / "order.schema.json"
    schema_path.write_bytes(orjson.dumps(SCHEMA))
    return write_config(tmp_path, {
        "name": name,
        "source": {"topic": source, "format": "json", "schema": str(schema_path),
                   "max_batch_records": 5000, "event_time": {"column": "ts", "allowed_lateness": lateness}},
        "transform": transform,
        "sink": {"topic": sink, "format": "json", "delivery": "exactly-once"},
        "dead_letter": {"topic": dlq},
        "checkpoint": {"interval": "1s", "dir": str(tmp_path / "state")},
    })


@pytest.fixture
def topics(kafka_bootstrap: str, unique_topic: str) -> dict[str, str]:
    names = {"source": f"{unique_topic}-in", "sink": f"{unique_topic}-out", "dlq": f"{unique_topic}-dlq"}
    create_topic(kafka_bootstrap, names["source"], PARTITIONS)
    create_topic(kafka_bootstrap, names["sink"], PARTITIONS)
    create_topic(kafka_bootstrap, names["dlq"], 1)
    return names


def user_of(i: int) -> int:
    return i % 50


def keyed_by_user(i: int) -> tuple[int, bytes]:
    """Records keyed by user, so each user's rows share a partition (as the window's state needs)."""
    return user_of(i) % PARTITIONS, f"u{user_of(i)}".encode()


def live_input(bootstrap: str, topic: str, seconds: float) -> LiveInput:
    return LiveInput(bootstrap, topic, [order(i) for i in range(RECORDS)], PARTITIONS, seconds, keyed_by_user)


SQL = {"sql": "SELECT id, amount * 2 AS amount2 FROM input WHERE amount >= 0"}


def expected_sql_ids() -> Counter:
    return Counter(i for i in range(RECORDS) if not is_poison(i) and i % 10 != 0)


POISON_IDS = [i for i in range(RECORDS) if is_poison(i)]
"""Dead-lettered as they came, by the source's decoder: "not JSON"."""


def run_with_kills(config: Path, bootstrap: str, source_topic: str, kills: int, seed: int) -> int:
    """While the input streams in, start the connector, SIGKILL it at a random moment (every other run:
    let an injected fault crash it between flush and commit, killing it only if no fault fired within
    20 s), restart; ``kills`` times. Then let the final run finish with ``--stop-at-end``.

    Returns how many runs died at the injected moment between flush and commit.
    """
    rng = random.Random(seed)
    faulted = 0
    stream = live_input(bootstrap, source_topic, kills * SECONDS_PER_KILL)
    for attempt in range(kills):
        faults = "between-flush-and-commit:0.4" if attempt % 2 else ""
        connector = start_connector(config, bootstrap, faults=faults, log_name=f"run{attempt}")
        if faults:
            connector.wait_for_exit(20.0)
        else:
            time.sleep(rng.uniform(2.5, 6.0))  # start-up (imports, init_transactions) takes ~1.5 s
        connector.kill()
        faulted += connector.crashed_by_fault()
    stream.join()
    final = start_connector(config, bootstrap, stop_at_end=True, log_name="final")
    assert final.wait(240) == 0, final.log_tail()
    return faulted


@pytest.mark.parametrize("kills", [10, pytest.param(40, marks=pytest.mark.slow)])
def test_sql_pipeline_is_exactly_once_across_random_kills(kafka_bootstrap: str, topics: dict[str, str],
                                                          tmp_path: Path, kills: int) -> None:
    config = connector_config(tmp_path, f"crash-{topics['sink']}", topics["source"], topics["sink"],
                              topics["dlq"], [SQL])
    faulted = run_with_kills(config, kafka_bootstrap, topics["source"], kills=kills, seed=7 + kills)

    committed = assert_exactly_once(kafka_bootstrap, topics["sink"], topics["dlq"],
                                    expected_sql_ids() + Counter(POISON_IDS), dead_lettered=POISON_IDS,
                                    reason="not JSON").output
    uncommitted = read_values(kafka_bootstrap, topics["sink"], isolation="read_uncommitted")
    assert len(uncommitted) > sum(committed.values()), "no aborted epoch was observed: the kills proved nothing"
    assert faulted >= 1, "no run crashed between flush and commit"


def test_poison_records_are_dead_lettered_exactly_once_with_their_reason(
        kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path) -> None:
    config = connector_config(tmp_path, f"dlq-{topics['sink']}", topics["source"], topics["sink"],
                              topics["dlq"], [SQL])
    run_with_kills(config, kafka_bootstrap, topics["source"], kills=3, seed=11)

    letters = assert_exactly_once(kafka_bootstrap, topics["sink"], topics["dlq"],
                                  expected_sql_ids() + Counter(POISON_IDS), dead_lettered=POISON_IDS).dead_letters
    assert sorted(letter.value for letter in letters) == sorted(order(i) for i in POISON_IDS)
    for letter in letters:
        assert "json" in letter.reason.lower() or "decode" in letter.reason.lower(), letter.reason


def window_reference(dead_lettered: set[int]) -> dict[tuple[str, int], tuple[float, int]]:
    """Per (user, window_start): sum of amounts and count, over 10 s tumbling windows of the input rows that
    were not dead-lettered."""
    sums: dict[tuple[str, int], list] = {}
    for i in range(RECORDS):
        if i in dead_lettered or i % 10 == 0:
            continue
        ts = BASE_TS_MS + i * 10
        total = sums.setdefault((f"u{i % 50}", ts - ts % 10_000), [0.0, 0])
        total[0] += float(i % 1000)
        total[1] += 1
    return {key: (value[0], value[1]) for key, value in sums.items()}


def final_watermarks() -> dict[int, int]:
    """Per partition, the newest event time (no allowed lateness): each partition closes its own windows."""
    newest = {}
    for i in range(RECORDS):
        if not is_poison(i):
            newest[keyed_by_user(i)[0]] = BASE_TS_MS + i * 10
    return newest


def epoch_ms(value: int | str) -> int:
    if isinstance(value, int):
        return value
    from datetime import datetime

    return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)


def test_windowed_aggregation_is_exact_across_random_kills(kafka_bootstrap: str, topics: dict[str, str],
                                                           tmp_path: Path) -> None:
    transform = [
        {"sql": "SELECT user, amount, ts, __kafka_key, __kafka_partition FROM input WHERE amount >= 0"},
        {"window": {"kind": "tumbling", "size": "10s", "key": ["__kafka_key", "user"], "time_column": "ts",
                    "aggregates": {"total": "sum(amount)", "n": "count(*)"}}},
    ]
    config = connector_config(tmp_path, f"window-{topics['sink']}", topics["source"], topics["sink"],
                              topics["dlq"], transform, lateness="0s")
    run_with_kills(config, kafka_bootstrap, topics["source"], kills=8, seed=3)

    letters = assert_dead_letters(kafka_bootstrap, topics["dlq"], POISON_IDS, reason="not JSON")
    rows = [orjson.loads(v) for v in read_values(kafka_bootstrap, topics["sink"])]
    emitted = Counter((row["user"], epoch_ms(row["window_start"])) for row in rows)
    assert emitted and max(emitted.values()) == 1, "a window was missing entirely or emitted twice"
    watermarks = final_watermarks()
    dead_lettered = {i for letter in letters for i in letter.ids}
    closed = {key: value for key, value in window_reference(dead_lettered).items()
              if key[1] + 10_000 <= watermarks[int(key[0][1:]) % PARTITIONS]}
    got = {(row["user"], epoch_ms(row["window_start"])): (row["total"], row["n"]) for row in rows}
    assert set(got) == set(closed)
    for key, (total, count) in closed.items():
        assert got[key] == (pytest.approx(total), count), key
