"""A repartitioned event-time window stays exact: every input id is counted into exactly one emitted window or
dead-lettered with its reason (DESIGN.md, "Event time judges only what holds event-time state").

The scenario (``tests.helpers.window_scenario``): 60,000 JSON orders of 40 users, 5 ms of event time apart,
each user's rows on 3 of 6 partitions, a 10 s tumbling window keyed by ``user`` (so re-keyed through the
repartition topic) with ``allowed_lateness: 0s``. The first half is written before the connector starts (a
backlog it replays), the second half after. ``check_windows`` recomputes the windows from every id not
dead-lettered and compares them with the sink, read with read_committed.

Both tests can be repeated without editing them: ``EPOCHLINE_WINDOW_RUNS=10`` runs each one ten times (per
group protocol for the second). ``EPOCHLINE_KEEP_LOGS=DIR`` keeps the connector logs of a failed run.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from engine.testing.connectors import LiveInput, produce_values
from tests.helpers.group import (
    GROUP_PROTOCOLS,
    Instances,
    assert_no_open_transactions,
    finish_at_end,
    group_config,
    protocol_settings,
    wait_for_group_commit,
    wait_for_log,
)
from tests.helpers.window_scenario import (
    PARTITIONS,
    RECORDS,
    SCHEMA,
    TRANSFORM,
    check_windows,
    create_topics,
    event_time,
    logs_kept_on_failure,
    orders,
    with_source_settings,
)

RUNS = pytest.mark.parametrize("run", range(int(os.environ.get("EPOCHLINE_WINDOW_RUNS", "1"))))
"""``EPOCHLINE_WINDOW_RUNS=N`` repeats each test N times (each repetition with its own kill timings)."""

HALF = RECORDS // 2
LATENESS_S = 0


def window_topics_closed(bootstrap: str, name: str, topics: dict[str, str]) -> None:
    """No transaction left open on the sink, the dead-letter, repartition and changelog topics."""
    for topic in (topics["sink"], topics["dlq"], f"{name}-repartition", f"{name}-step0-window-changelog"):
        assert_no_open_transactions(bootstrap, topic)


BATCH_SIZES = pytest.mark.parametrize("max_batch_records", [
    pytest.param(None, id="default-batches"),
    pytest.param(2000, id="2000-record-batches"),
])
"""``source.max_batch_records``: its default (25,000), as in the issue's reproduction, and the 2,000 that
test_group's configs use."""


@BATCH_SIZES
@RUNS
def test_a_replayed_backlog_through_one_instance_judges_no_row_late(
        kafka_bootstrap: str, tmp_path: Path, unique_topic: str, instances_of: list[Instances], run: int,
        max_batch_records: int | None) -> None:
    started = time.monotonic()
    topics = create_topics(kafka_bootstrap, unique_topic)
    name = f"backlog-{unique_topic}"
    config = group_config(tmp_path, name, topics, transform=TRANSFORM, schema=SCHEMA,
                          event_time=event_time(LATENESS_S))
    with_source_settings(config, max_batch_records=max_batch_records)
    instances = Instances(config, kafka_bootstrap)
    instances_of.append(instances)
    with logs_kept_on_failure(tmp_path, f"backlog-{max_batch_records or 'default'}-run{run}-{unique_topic}"):
        rows, key_of = orders(0, HALF)
        produce_values(kafka_bootstrap, topics["source"], rows, PARTITIONS, key_of=key_of)
        instances.start("only")  # the first half is a backlog: read aligned by event time, none of it is late
        time.sleep(5)
        rows, key_of = orders(HALF, RECORDS)
        produce_values(kafka_bootstrap, topics["source"], rows, PARTITIONS, key_of=key_of)
        wait_for_group_commit(kafka_bootstrap, f"epochline-{name}", topics["source"], timeout=120)
        finish_at_end(instances, ["only"])

        report = check_windows(kafka_bootstrap, topics, RECORDS, LATENESS_S * 1000)
        print(f"RESULT backlog max_batch_records={max_batch_records or 'default'} run={run} {report.line()} "
              f"seconds={time.monotonic() - started:.0f}")
        assert report.dead_letter_records == 0, f"a one-instance replay dead-lettered rows: {report.line()}"
        window_topics_closed(kafka_bootstrap, name, topics)


HOLDS_SOURCE_PARTITIONS = '"event":"partitions assigned","source":"source"'
"""The pipeline's log line when an instance takes source partitions over (after restoring their state)."""


STALL_S = 16
"""Past the session timeout (6 s classic, the test broker's 10 s under the consumer protocol) and the transaction
timeout (10 s): the stalled instance's partitions move, as in test_group's stalled-instance test."""


@pytest.mark.slow
@GROUP_PROTOCOLS
@RUNS
def test_windows_stay_exact_with_four_instances_kills_and_a_stalled_instance(
        kafka_bootstrap: str, tmp_path: Path, unique_topic: str, instances_of: list[Instances], protocol: str,
        run: int) -> None:
    started = time.monotonic()
    topics = create_topics(kafka_bootstrap, unique_topic)
    name = f"wx-{unique_topic}"
    session = protocol_settings(protocol, {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"})
    config = group_config(tmp_path, name, topics, consumer=session, transform=TRANSFORM, schema=SCHEMA,
                          event_time=event_time(LATENESS_S))
    with_source_settings(config, max_batch_records=None)  # the default, as in the reproduction
    instances = Instances(config, kafka_bootstrap)
    instances_of.append(instances)
    rng = random.Random(1000 * run + (protocol == "consumer"))
    names = ["a", "b", "c", "d"]
    kills: list[str] = []
    with logs_kept_on_failure(tmp_path, f"group-{protocol}-run{run}-{unique_topic}"):
        # First half: live over 10 s while four instances start and two are SIGKILLed and restarted.
        rows, key_of = orders(0, HALF)
        stream = LiveInput(kafka_bootstrap, topics["source"], rows, PARTITIONS, 10.0, key_of=key_of)
        for member in names:
            instances.start(member)
        for _ in range(2):
            time.sleep(rng.uniform(2.5, 4.0))
            victim = rng.choice(names)
            instances.kill(victim)
            instances.start(victim)
            kills.append(victim)
        stream.join()

        # A pause past the idle timeout (5 s), during which one instance is stalled (SIGSTOP).
        zombie_name = rng.choice(names)
        zombie = instances.running[zombie_name]
        time.sleep(2)
        wait_for_log(zombie, HOLDS_SOURCE_PARTITIONS)  # a stall of an instance holding nothing proves nothing
        os.kill(zombie.process.pid, signal.SIGSTOP)
        stalled_at = time.monotonic()
        time.sleep(6)

        # Second half: live over 10 s while two other instances are SIGKILLed and restarted.
        rows, key_of = orders(HALF, RECORDS)
        stream = LiveInput(kafka_bootstrap, topics["source"], rows, PARTITIONS, 10.0, key_of=key_of)
        others = [member for member in names if member != zombie_name]
        for _ in range(2):
            time.sleep(rng.uniform(2.0, 3.5))
            victim = rng.choice(others)
            instances.kill(victim)
            instances.start(victim)
            kills.append(victim)
        time.sleep(max(0.0, stalled_at + STALL_S - time.monotonic()))
        os.kill(zombie.process.pid, signal.SIGCONT)
        refusals = ("partitions lost", "fenced", "checkpoint abandoned", "ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and zombie.process.poll() is None:
            if any(sign in zombie.log_path.read_text(errors="replace") for sign in refusals):
                break
            time.sleep(0.5)
        log = zombie.log_path.read_text(errors="replace")
        assert any(sign in log for sign in refusals), \
            f"the stalled instance did not notice its partitions moved:\n{zombie.log_tail(60)}"
        zombie_exited = zombie.process.poll() is not None
        if zombie_exited:  # it stopped with a clear error: finish_at_end starts it again
            assert zombie.process.returncode != 0 and "epochline:" in log, zombie.log_tail()
            instances.exited.append(instances.running.pop(zombie_name))
        stream.join()
        finish_at_end(instances, names)

        report = check_windows(kafka_bootstrap, topics, RECORDS, LATENESS_S * 1000)
        window_topics_closed(kafka_bootstrap, name, topics)
    print(f"RESULT group protocol={protocol} run={run} pass {report.line()} kills={kills} "
          f"stalled={zombie_name} stalled_exited={zombie_exited} seconds={time.monotonic() - started:.0f}")
