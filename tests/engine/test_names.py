"""Connector names follow one rule (``engine.names``): what Kafka allows in topic names, short enough that
every name epochline derives from it is still a valid topic name and a file name."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors.changelog import changelog_topic, repartition_topic
from engine.names import MAX_NAME_LENGTH, InvalidName, check_name

KAFKA_MAX_TOPIC_LENGTH = 249
FILE_NAME_MAX_BYTES = 255


@pytest.mark.parametrize("name", ["a", "orders-clean", "v1.2_final", "A" * MAX_NAME_LENGTH])
def test_letters_digits_dots_underscores_and_dashes_up_to_the_maximum_are_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize(("name", "why"), [
    ("", "not allowed"), ("has space", "not allowed"), ("a/b", "not allowed"), ("ü", "not allowed"),
    (".", "not allowed"), ("..", "not allowed"), ("A" * (MAX_NAME_LENGTH + 1), "too long"),
])
def test_anything_else_is_refused_naming_the_rule(name: str, why: str) -> None:
    with pytest.raises(InvalidName, match=why) as refused:
        check_name(name)
    assert "A-Za-z0-9._-" in str(refused.value) and str(MAX_NAME_LENGTH) in str(refused.value)


def test_a_very_long_name_is_shown_shortened_with_its_length() -> None:
    with pytest.raises(InvalidName) as refused:
        check_name("x" * 300)
    assert "(300 characters)" in str(refused.value) and "x" * 41 not in str(refused.value)


def test_every_name_derived_from_the_longest_name_is_a_valid_topic_and_file_name(tmp_path: Path) -> None:
    name = "n" * MAX_NAME_LENGTH
    derived = [changelog_topic(name, "step999-window"), repartition_topic(name), f"epochline-{name}"]
    assert all(len(topic) <= KAFKA_MAX_TOPIC_LENGTH for topic in derived)
    assert len(name.encode()) <= FILE_NAME_MAX_BYTES
    (tmp_path / name / "config").mkdir(parents=True)  # a worker's connectors/<name>/config
