"""Instances of one connector share its partitions through the consumer group, exactly once.

Every test runs real ``epochline run`` processes against the real broker, kills, stalls or adds instances
while the input streams in, and then accounts for every input id with ``read_committed``: output plus dead
letters equal the input (no dead letters here), and no output partition is left behind an open transaction.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from engine.testing import read_values
from engine.testing.accounting import assert_dead_letters, assert_exactly_once
from engine.testing.connectors import LiveInput
from tests.helpers.group import (
    GROUP_PROTOCOLS,
    PARTITIONS,
    RECORDS,
    Instances,
    MemberWatch,
    assert_no_open_transactions,
    expected_ids,
    finish_at_end,
    group_config,
    order,
    protocol_settings,
    wait_for_group_commit,
)


@GROUP_PROTOCOLS
def test_instances_killed_and_added_share_the_partitions_exactly_once(
        kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path, unique_topic: str,
        instances_of: list[Instances], protocol: str) -> None:
    name = f"group-{unique_topic}"
    instances = Instances(group_config(tmp_path, name, topics, consumer=protocol_settings(protocol)),
                          kafka_bootstrap)
    instances_of.append(instances)
    watch = MemberWatch(kafka_bootstrap, f"epochline-{name}")
    watch.start()
    stream = LiveInput(kafka_bootstrap, topics["source"], [order(i) for i in range(RECORDS)], PARTITIONS, 45.0)
    names = ["a", "b", "c"]
    for member in names:
        instances.start(member)
    rng = random.Random(12)
    kills = faulted = 0
    started = time.monotonic()
    while kills < 10:
        time.sleep(rng.uniform(2.0, 4.0))
        if kills == 5:
            names.append("d")
            instances.start("d")  # a fourth instance joins mid-run
        victim = rng.choice(names)
        faulted += instances.running[victim].crashed_by_fault()
        instances.kill(victim)
        kills += 1
        instances.start(victim, faults="between-flush-and-commit:0.3" if kills % 3 == 0 else "")
    stream.join()
    finish_at_end(instances, names)
    most = watch.stop()

    assert_exactly_once(kafka_bootstrap, topics["sink"], topics["dlq"], expected_ids(RECORDS))
    assert most >= 3, f"at most {most} members held partitions at once"
    assert_no_open_transactions(kafka_bootstrap, topics["sink"])
    assert len(read_values(kafka_bootstrap, topics["sink"], "read_uncommitted")) >= sum(expected_ids(RECORDS).values())
    print(f"kills={kills} faulted={faulted} seconds={time.monotonic() - started:.0f} most_members={most}")


@GROUP_PROTOCOLS
def test_a_stalled_instance_whose_partitions_moved_cannot_commit_them(
        kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path, unique_topic: str,
        instances_of: list[Instances], protocol: str) -> None:
    name = f"zombie-{unique_topic}"
    # consumer protocol: the test broker's 10 s session (engine.testing.local_broker), also past in 16 s
    session = protocol_settings(protocol, {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"})
    instances = Instances(group_config(tmp_path, name, topics, consumer=session), kafka_bootstrap)
    instances_of.append(instances)
    records = 60_000
    stream = LiveInput(kafka_bootstrap, topics["source"], [order(i) for i in range(records)], PARTITIONS, 30.0)
    zombie = instances.start("zombie")
    instances.start("healthy")
    time.sleep(8)
    os.kill(zombie.process.pid, signal.SIGSTOP)
    time.sleep(16)  # past the session timeout (6 or 10 s) and the transaction timeout (10 s): its partitions move
    os.kill(zombie.process.pid, signal.SIGCONT)
    exited = zombie.wait_for_exit(30)
    log = zombie.log_path.read_text(errors="replace")
    refused = ("partitions lost" in log or "fenced" in log or "checkpoint abandoned" in log
               or "ILLEGAL_GENERATION" in log or "UNKNOWN_MEMBER_ID" in log)
    assert refused, f"the stalled instance did not notice it was fenced:\n{zombie.log_tail(60)}"
    if exited:
        assert zombie.process.returncode != 0 and "epochline:" in log, zombie.log_tail()
        instances.running.pop("zombie")
    stream.join()
    finish_at_end(instances, ["zombie", "healthy"])

    assert_exactly_once(kafka_bootstrap, topics["sink"], topics["dlq"], expected_ids(records))
    assert_no_open_transactions(kafka_bootstrap, topics["sink"])


def test_an_instance_joining_while_a_commit_is_in_flight_keeps_the_output_exact(
        kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path, unique_topic: str,
        instances_of: list[Instances]) -> None:
    name = f"joining-{unique_topic}"
    instances = Instances(group_config(tmp_path, name, topics), kafka_bootstrap)
    instances_of.append(instances)
    records = 60_000
    stream = LiveInput(kafka_bootstrap, topics["source"], [order(i) for i in range(records)], PARTITIONS, 20.0)
    first = instances.start("first", faults="between-flush-and-commit:pause=2")
    deadline = time.monotonic() + 60
    while '"commit paused"' not in first.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, first.log_tail()
        time.sleep(0.1)
    instances.start("second")  # joins while the first is inside its commit
    time.sleep(10)
    stream.join()
    finish_at_end(instances, ["first", "second"])

    assert_exactly_once(kafka_bootstrap, topics["sink"], topics["dlq"], expected_ids(records))
    logs = "".join(connector.log_path.read_text(errors="replace") for connector in instances.exited)
    assert "partitions revoked" in logs, "no partition moved from the first instance to the second"
    assert_no_open_transactions(kafka_bootstrap, topics["sink"])


WINDOW_RECORDS = 120_000
USERS = 40
BASE_TS_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SENTINEL_TS_MS = BASE_TS_MS + 3 * 3_600_000  # far past every window and the allowed lateness: closes them all
WINDOW_SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"}, "user": {"type": "string"},
                                                  "amount": {"type": "number"}, "ts": {"type": "integer"}},
                 "required": ["id", "user", "amount", "ts"]}


def event(i: int) -> dict:
    """Users drawn at random (seeded): every user's rows are on every partition, so the window repartitions."""
    if i >= WINDOW_RECORDS:  # the sentinels: one per user, after the input
        return {"id": i, "user": f"u{i - WINDOW_RECORDS}", "amount": 0.0, "ts": SENTINEL_TS_MS}
    user = random.Random(i).randrange(USERS)
    return {"id": i, "user": f"u{user}", "amount": float(i % 97), "ts": BASE_TS_MS + i * 10}


def window_reference() -> dict[tuple[str, int], tuple[float, int]]:
    sums: dict[tuple[str, int], list] = {}
    for i in range(WINDOW_RECORDS):
        row = event(i)
        total = sums.setdefault((row["user"], row["ts"] - row["ts"] % 10_000), [0.0, 0])
        total[0] += row["amount"]
        total[1] += 1
    return {key: (value[0], value[1]) for key, value in sums.items()}


def test_window_state_moves_with_its_partitions_between_instances_with_private_state_dirs(
        kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path, unique_topic: str,
        instances_of: list[Instances]) -> None:
    name = f"windows-{unique_topic}"
    transform = [{"window": {"kind": "tumbling", "size": "10s", "key": ["user"], "time_column": "ts",
                             "aggregates": {"total": "sum(amount)", "n": "count(*)"}}}]
    names = ["a", "b", "c"]
    configs = {member: group_config(tmp_path / member, name, topics, transform=transform, schema=WINDOW_SCHEMA,
                                    state_dir=tmp_path / member / "private-state",
                                    event_time={"column": "ts", "allowed_lateness": "2h"})
               for member in names}
    instances = Instances(configs["a"], kafka_bootstrap, configs)
    instances_of.append(instances)
    rows = [orjson.dumps(event(i)) for i in range(WINDOW_RECORDS)]
    stream = LiveInput(kafka_bootstrap, topics["source"], rows, PARTITIONS, 30.0)
    for member in names:
        instances.start(member)
    rng = random.Random(5)
    for kill in range(6):
        time.sleep(rng.uniform(2.0, 4.0))
        victim = rng.choice(names)
        instances.kill(victim)
        instances.start(victim, faults="between-flush-and-commit:0.3" if kill % 2 else "")
    stream.join()
    # The sentinels close every window only once every row is through the repartition topic: rows of
    # lagging source partitions arriving after them would be late, as the documented rule says.
    wait_for_group_commit(kafka_bootstrap, f"epochline-{name}", topics["source"], timeout=120)
    sentinels = [orjson.dumps(event(i)) for i in range(WINDOW_RECORDS, WINDOW_RECORDS + USERS)]
    LiveInput(kafka_bootstrap, topics["source"], sentinels, PARTITIONS, 0.0).join()
    finish_at_end(instances, names)

    emitted = [orjson.loads(value) for value in read_values(kafka_bootstrap, topics["sink"])]
    windows = Counter((row["user"], row["window_start"]) for row in emitted)
    assert windows and max(windows.values()) == 1, "a window was emitted twice"
    got = {(row["user"], epoch_ms(row["window_start"])): (row["total"], row["n"]) for row in emitted
           if epoch_ms(row["window_start"]) < SENTINEL_TS_MS - 10_000}
    expected = window_reference()
    assert set(got) == set(expected)
    assert all(got[key] == (pytest.approx(total), count) for key, (total, count) in expected.items())
    assert_dead_letters(kafka_bootstrap, topics["dlq"])  # none: every row reached its window
    for topic in (topics["sink"], f"{name}-repartition", f"{name}-step0-window-changelog"):
        assert_no_open_transactions(kafka_bootstrap, topic)


def epoch_ms(value: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
