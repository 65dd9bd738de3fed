"""Recovery against the real broker: zombie fencing, a broker restart mid-run, at-least-once delivery,
and an unreachable broker."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import orjson

from connectors.admin import create_topic
from engine.ports import free_port
from engine.testing import read_values
from engine.testing.accounting import assert_dead_letters, assert_exactly_once, read_dead_letters
from engine.testing.connectors import (
    json_field_counts,
    produce_values,
    start_connector,
    write_config,
)
from engine.testing.local_broker import LocalBroker
from tests.helpers.transforms import POISON_ID

RECORDS = 60_000
PARTITIONS = 3


def value(i: int) -> bytes:
    return orjson.dumps({"id": i, "amount": float(i % 100)})


def slow_config(tmp_path: Path, name: str, source: str, sink: str, delivery: str = "exactly-once") -> Path:
    """About 4k records/s: slow enough that a test can act while the connector is mid-stream."""
    return write_config(tmp_path, {
        "name": name,
        "source": {"topic": source, "format": "json", "max_batch_records": 200},
        "transform": [{"python": "tests.helpers.transforms:slow"}, {"sql": "SELECT id, amount FROM input"}],
        "sink": {"topic": sink, "format": "json", "delivery": delivery},
        "dead_letter": {"topic": f"{sink}-dlq"},
        "checkpoint": {"interval": "500ms", "dir": str(tmp_path / "state")},
    })


def prepare_topics(bootstrap: str, base: str) -> tuple[str, str]:
    source, sink = f"{base}-in", f"{base}-out"
    create_topic(bootstrap, source, PARTITIONS)
    create_topic(bootstrap, sink, PARTITIONS)
    create_topic(bootstrap, f"{sink}-dlq", 1)
    produce_values(bootstrap, source, [value(i) for i in range(RECORDS)], PARTITIONS)
    return source, sink


def test_a_second_instance_fences_the_first_and_output_stays_exact(kafka_bootstrap: str, unique_topic: str,
                                                                  tmp_path: Path) -> None:
    source, sink = prepare_topics(kafka_bootstrap, unique_topic)
    config = slow_config(tmp_path, f"zombie-{unique_topic}", source, sink)
    first = start_connector(config, kafka_bootstrap, log_name="first")
    time.sleep(5)
    assert first.process.poll() is None, first.log_tail()
    second = start_connector(config, kafka_bootstrap, stop_at_end=True, log_name="second")

    assert first.wait(60) != 0, "the fenced instance kept running"
    assert "fenced" in first.log_path.read_text(), first.log_tail()
    assert second.wait(120) == 0, second.log_tail()
    assert_exactly_once(kafka_bootstrap, sink, f"{sink}-dlq", range(RECORDS))


def test_pipeline_recovers_from_a_broker_restart_with_exact_output(tmp_path: Path, unique_topic: str) -> None:
    broker = LocalBroker(tmp_path / "broker")
    port = free_port()
    bootstrap = broker.start(port=port).bootstrap
    try:
        source, sink = prepare_topics(bootstrap, unique_topic)
        config = slow_config(tmp_path, f"restart-{unique_topic}", source, sink)
        connector = start_connector(config, bootstrap, stop_at_end=True, log_name="restart")
        time.sleep(5)
        assert connector.process.poll() is None, connector.log_tail()
        broker.stop()
        time.sleep(3)
        broker.start(port=port)
        assert connector.wait(180) == 0, connector.log_tail()
        assert_exactly_once(bootstrap, sink, f"{sink}-dlq", range(RECORDS))
    finally:
        broker.stop()


def test_at_least_once_delivers_every_record(kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    source, sink = prepare_topics(kafka_bootstrap, unique_topic)
    config = write_config(tmp_path, {
        "name": f"alo-{unique_topic}",
        "source": {"topic": source, "format": "json"},
        "sink": {"topic": sink, "format": "json", "delivery": "at-least-once"},
        "dead_letter": {"topic": f"{sink}-dlq"},
        "checkpoint": {"interval": "1s", "dir": str(tmp_path / "state")},
    })
    connector = start_connector(config, kafka_bootstrap, stop_at_end=True, log_name="alo")
    assert connector.wait(120) == 0, connector.log_tail()
    assert set(json_field_counts(read_values(kafka_bootstrap, sink), "id")) == set(range(RECORDS))
    assert_dead_letters(kafka_bootstrap, f"{sink}-dlq")


def test_an_unreachable_broker_is_a_clear_error(tmp_path: Path) -> None:
    config = write_config(tmp_path, {
        "name": "unreachable",
        "source": {"topic": "in", "format": "raw"},
        "sink": {"topic": "out", "format": "raw"},
        "dead_letter": {"topic": "dlq"},
    })
    connector = start_connector(config, f"127.0.0.1:{free_port()}", stop_at_end=True, log_name="unreachable")
    assert connector.wait(120) == 2
    assert "unreachable" in connector.log_path.read_text()


def poison_config(tmp_path: Path, name: str, source: str, sink: str, **extra: object) -> Path:
    return write_config(tmp_path, {
        "name": name,
        "source": {"topic": source, "format": "json", "max_batch_records": 1000},
        "transform": [{"python": "tests.helpers.transforms:fail_on_poison"}],
        "sink": {"topic": sink, "format": "json"},
        "dead_letter": {"topic": f"{sink}-dlq"},
        "checkpoint": {"interval": "1s", "dir": str(tmp_path / "state")},
        **extra,
    })


def test_a_poison_input_halts_an_exactly_once_connector_without_committing_it(
        kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    source, sink = prepare_topics(kafka_bootstrap, unique_topic)
    connector = start_connector(poison_config(tmp_path, f"poison-{unique_topic}", source, sink), kafka_bootstrap,
                                stop_at_end=True, log_name="poison")
    assert connector.wait(120) == 2
    assert "halting without committing" in connector.log_path.read_text()
    assert POISON_ID not in json_field_counts(read_values(kafka_bootstrap, sink), "id")
    assert_dead_letters(kafka_bootstrap, f"{sink}-dlq")  # halted, not dead-lettered


def test_transform_errors_can_be_dead_lettered_instead(kafka_bootstrap: str, unique_topic: str,
                                                      tmp_path: Path) -> None:
    source, sink = prepare_topics(kafka_bootstrap, unique_topic)
    config = poison_config(tmp_path, f"poison-dlq-{unique_topic}", source, sink, on_transform_error="dead-letter")
    connector = start_connector(config, kafka_bootstrap, stop_at_end=True, log_name="poison-dlq")
    assert connector.wait(120) == 0, connector.log_tail()
    dead = {i for letter in read_dead_letters(kafka_bootstrap, f"{sink}-dlq") for i in letter.ids}
    assert POISON_ID in dead  # with the rest of its cycle, each naming why
    written = assert_exactly_once(kafka_bootstrap, sink, f"{sink}-dlq", range(RECORDS), dead_lettered=dead,
                                  reason=f"cannot handle id {POISON_ID}", stage="transform").output
    assert POISON_ID not in written


def test_sigterm_while_the_broker_is_gone_stops_within_the_commit_in_flight_and_a_later_run_is_exact(
        tmp_path: Path, unique_topic: str) -> None:
    broker = LocalBroker(tmp_path / "broker")
    port = free_port()
    bootstrap = broker.start(port=port).bootstrap
    try:
        source, sink = prepare_topics(bootstrap, unique_topic)
        config = write_config(tmp_path, {  # the commit in flight is bounded by the transaction timeout: 10 s
            "name": f"sigterm-{unique_topic}",
            "source": {"topic": source, "format": "json", "max_batch_records": 200},
            "transform": [{"python": "tests.helpers.transforms:slow"}, {"sql": "SELECT id, amount FROM input"}],
            "sink": {"topic": sink, "format": "json", "transaction_timeout": "10s"},
            "dead_letter": {"topic": f"{sink}-dlq"},
            "checkpoint": {"interval": "500ms", "timeout": "2s", "dir": str(tmp_path / "state")},
        })
        connector = start_connector(config, bootstrap, log_name="interrupted")
        time.sleep(5)
        assert connector.process.poll() is None, connector.log_tail()
        broker.stop()
        time.sleep(2)
        connector.process.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        assert connector.wait(60) == 0, connector.log_tail()
        assert time.monotonic() - stopped < 10 + 10, connector.log_tail()

        broker.start(port=port)
        final = start_connector(config, bootstrap, stop_at_end=True, log_name="final")
        assert final.wait(180) == 0, final.log_tail()
        assert_exactly_once(bootstrap, sink, f"{sink}-dlq", range(RECORDS))
    finally:
        broker.stop()
