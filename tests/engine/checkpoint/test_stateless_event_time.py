"""A stateless connector never dead-letters a row for its event time (DESIGN.md, "Event time judges only what
holds event-time state").

Lateness exists for window operators only: a connector whose steps hold no event-time state must deliver
every row it reads, whatever the Kafka timestamps say, however long a partition stayed quiet, and however the
partitions move between instances. Every test counts output + dead letters = input by id, and requires the
dead-letter topic to stay empty (the input holds no bad record), naming the reason of each dead letter it
finds.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from engine.testing.accounting import assert_exactly_once
from engine.testing.connectors import LiveInput, start_connector
from tests.helpers.group import (
    PARTITIONS,
    SQL,
    Instances,
    MemberWatch,
    assert_no_open_transactions,
    expected_ids,
    finish_at_end,
    group_config,
    order,
    protocol_settings,
    wait_for_group_commit,
    wait_for_log,
)

IDLE_TIMEOUT_S = 2
IDLE_TIMEOUT = f"{IDLE_TIMEOUT_S}s"
"""``source.event_time.idle_timeout`` (30 s by default), lowered so that the quiet period between the two halves
of the input outlasts it without making the test long: a partition quiet for this long is what the defect
needs (its lateness threshold followed the other partitions while it slept)."""
QUIET_S = 3 * IDLE_TIMEOUT_S
"""Nothing is written for this long, once the group has committed the first half: every partition turns idle."""

HALF = 60_000  # per half: 10,000 records on each of the 6 partitions


def native_io_in_logs(instances: Instances, kafka_io: str) -> None:
    """The instances really ran the way ``kafka_io`` says (``EPOCHLINE_NATIVE_IO`` reaches them)."""
    logs = "".join(c.log_path.read_text(errors="replace") for c in [*instances.exited, *instances.running.values()])
    if kafka_io == "per-record":
        assert "native Kafka I/O switched off" in logs, "EPOCHLINE_NATIVE_IO=0 did not reach the instances"
    else:
        assert "native Kafka I/O switched off" not in logs and "native Kafka I/O not available" not in logs


QUIET_BURST_CASES = pytest.mark.parametrize(("protocol", "kafka_io"), [
    pytest.param("classic", "native", id="classic-native"),
    pytest.param("consumer", "per-record", id="consumer-per-record"),
    pytest.param("classic", "per-record", id="classic-per-record", marks=pytest.mark.slow),
    pytest.param("consumer", "native", id="consumer-native", marks=pytest.mark.slow),
], indirect=["kafka_io"])
"""Both group protocols, native Kafka I/O on and off (the ``kafka_io`` fixture sets ``EPOCHLINE_NATIVE_IO``
in this process, whose environment the instances inherit); two combinations by default, the other two
with ``-m slow``."""


@QUIET_BURST_CASES
def test_a_stateless_group_delivers_a_burst_after_a_quiet_period_without_dead_letters(
        kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path, unique_topic: str,
        instances_of: list[Instances], protocol: str, kafka_io: str) -> None:
    name = f"quiet-{unique_topic}"
    # No event-time column, no lateness setting: only the idle timeout, lowered from its 30 s default so the
    # quiet period below outlasts it in a few seconds (see IDLE_TIMEOUT).
    config = group_config(tmp_path, name, topics, consumer=protocol_settings(protocol),
                          transform=[SQL], event_time={"idle_timeout": IDLE_TIMEOUT})
    instances = Instances(config, kafka_bootstrap)
    instances_of.append(instances)
    watch = MemberWatch(kafka_bootstrap, f"epochline-{name}")
    watch.start()
    records = 2 * HALF
    started = time.monotonic()

    # First half: a live stream over 15 s while instances are SIGKILLed and restarted.
    stream = LiveInput(kafka_bootstrap, topics["source"], [order(i) for i in range(HALF)], PARTITIONS, 15.0)
    names = ["a", "b", "c"]
    for member in names:
        instances.start(member)
    rng = random.Random(7)
    for _ in range(3):
        time.sleep(rng.uniform(3.0, 4.0))
        victim = rng.choice(names)
        instances.kill(victim)
        instances.start(victim)
    stream.join()
    # Quiet: once the group has committed the whole first half, nothing is written for longer than the idle
    # timeout, so every partition of every instance turns idle.
    wait_for_group_commit(kafka_bootstrap, f"epochline-{name}", topics["source"], timeout=120)
    time.sleep(QUIET_S)

    # Second half: all six partitions at once (no pacing), while two more instances join (the burst starts as
    # they subscribe, so the group rebalances while it is read) and one instance is killed.
    for member in ("d", "e"):
        names.append(member)
        instances.start(member)
    joined = [instances.running[member] for member in ("d", "e")]
    for connector in joined:
        wait_for_log(connector, '"source subscribed"')
    burst = LiveInput(kafka_bootstrap, topics["source"], [order(i) for i in range(HALF, records)], PARTITIONS, 0.0)
    time.sleep(2.0)
    instances.kill(rng.choice(["a", "b", "c"]))  # restarted by finish_at_end
    burst.join()
    # The live group takes it all (the killed instance's partitions move after its session timeout) before the
    # final runs; the joined instances hold partitions meanwhile.
    wait_for_group_commit(kafka_bootstrap, f"epochline-{name}", topics["source"], timeout=120)
    for connector in joined:
        wait_for_log(connector, '"partitions assigned"')
    finish_at_end(instances, names)
    most = watch.stop()
    native_io_in_logs(instances, kafka_io)

    assert_exactly_once(kafka_bootstrap, topics["sink"], topics["dlq"], expected_ids(records))  # nothing late
    assert_no_open_transactions(kafka_bootstrap, topics["sink"])
    assert_no_open_transactions(kafka_bootstrap, topics["dlq"])
    assert most >= 3, f"at most {most} members held partitions at once"
    print(f"protocol={protocol} kafka_io={kafka_io} seconds={time.monotonic() - started:.0f} most_members={most}")


HOUR_MS = 3_600_000


def test_a_stateless_connector_delivers_records_whose_timestamps_go_backwards_by_hours(
        kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path, unique_topic: str) -> None:
    records = 24_000  # 4,000 per partition: more than one batch (max_batch_records 2000) on each
    now_ms = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for i in range(records):
        # On its partition, each record is an hour older than the one before it.
        producer.produce(topics["source"], order(i), partition=i % PARTITIONS,
                         timestamp=now_ms - (i // PARTITIONS) * HOUR_MS)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0, "could not write the input"
    config = group_config(tmp_path, f"backwards-{unique_topic}", topics, transform=[SQL])
    connector = start_connector(config, kafka_bootstrap, stop_at_end=True)
    assert connector.wait(120) == 0, connector.log_tail()

    assert_exactly_once(kafka_bootstrap, topics["sink"], topics["dlq"], expected_ids(records))  # nothing late
    assert_no_open_transactions(kafka_bootstrap, topics["sink"])
    assert_no_open_transactions(kafka_bootstrap, topics["dlq"])
