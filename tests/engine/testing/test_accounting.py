"""The accounting the exactly-once tests rely on catches what counting only the sink misses: a record moved to
the dead-letter topic without a cause, a duplicated dead letter, a dead letter without its reason."""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest
from confluent_kafka import Producer

from connectors.admin import create_topic
from connectors.dead_letter import DeadLetter
from engine.testing.accounting import assert_dead_letters, assert_exactly_once


def letter(value: bytes, reason: str = "not JSON: unexpected end of data", stage: str = "decode") -> DeadLetter:
    return DeadLetter("in", 0, 0, None, value, reason, stage)


def arrow_ipc(ids: list[int]) -> bytes:
    table = pa.table({"id": ids, "user": ["u1"] * len(ids)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def write(bootstrap: str, base: str, output: list[int], letters: list[DeadLetter]) -> tuple[str, str]:
    sink, dead_letters = f"{base}-out", f"{base}-dlq"
    create_topic(bootstrap, sink, 2)
    create_topic(bootstrap, dead_letters, 1)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in output:
        producer.produce(sink, orjson.dumps({"id": i}), partition=i % 2)
    for dead in letters:
        producer.produce(dead_letters, dead.value, headers=dead.headers())
    assert producer.flush(30) == 0
    return sink, dead_letters


def test_output_and_expected_dead_letters_with_their_reasons_account_for_the_input(
        kafka_bootstrap: str, unique_topic: str) -> None:
    sink, dead_letters = write(kafka_bootstrap, unique_topic, [0, 1, 3], [letter(b'{"id": 2, "amount": ')])

    accounting = assert_exactly_once(kafka_bootstrap, sink, dead_letters, range(4), dead_lettered={2: "not JSON"})

    assert accounting.dead_lettered == {2: 1}


def test_a_record_moved_to_the_dead_letter_topic_without_a_cause_fails_naming_it_and_its_reason(
        kafka_bootstrap: str, unique_topic: str) -> None:
    moved = letter(orjson.dumps({"id": 2}), reason="late row: event time behind its partition's watermark",
                   stage="late")
    sink, dead_letters = write(kafka_bootstrap, unique_topic, [0, 1, 3], [moved])

    with pytest.raises(AssertionError, match=r"unexpected dead letter \[2\] \(late: late row"):
        assert_exactly_once(kafka_bootstrap, sink, dead_letters, range(4))


def test_a_duplicated_dead_letter_or_one_without_a_reason_fails(kafka_bootstrap: str, unique_topic: str) -> None:
    poison = b'{"id": 2, "amount": '
    sink, dead_letters = write(kafka_bootstrap, unique_topic, [0, 1], [letter(poison), letter(poison),
                                                                        letter(b'{"id": 3}', reason="")])

    with pytest.raises(AssertionError) as failure:
        assert_exactly_once(kafka_bootstrap, sink, dead_letters, range(4), dead_lettered=[2, 3])

    assert "read more often than expected (id: times), e.g. {2: 2}" in str(failure.value)
    assert "dead letter without a reason" in str(failure.value)


def test_rows_dead_lettered_by_the_repartition_stage_are_counted_from_their_arrow_ipc_stream(
        kafka_bootstrap: str, unique_topic: str) -> None:
    late = letter(arrow_ipc([4, 5, 6]), reason="late row: behind {0: 1}", stage="late")
    _, dead_letters = write(kafka_bootstrap, unique_topic, [], [late])

    letters = assert_dead_letters(kafka_bootstrap, dead_letters, [4, 5, 6], reason="late row", stage="late")

    assert [dead.ids for dead in letters] == [(4, 5, 6)]
    with pytest.raises(AssertionError, match="3 ids not expected at all"):
        assert_dead_letters(kafka_bootstrap, dead_letters)
