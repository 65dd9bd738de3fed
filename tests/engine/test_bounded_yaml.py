"""YAML is read with bounds (``engine.bounded_yaml``): an alias bomb, a recursive alias, deep nesting or a
huge text is refused at once, naming the bound; ordinary aliases still work."""

from __future__ import annotations

import time

import pytest
import yaml

from engine.bounded_yaml import MAX_YAML_BYTES, YamlRefused, read_yaml


def alias_bomb(levels: int) -> str:
    """Each level is a list of nine aliases of the level before: 9**levels strings from a few hundred bytes."""
    lines = ['l0: &l0 ["lol", "lol", "lol"]']
    lines += [f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * 9)}]" for level in range(1, levels)]
    return "\n".join(lines)


def test_an_alias_bomb_is_refused_within_a_second() -> None:
    began = time.monotonic()
    with pytest.raises(YamlRefused, match="aliases"):
        read_yaml(alias_bomb(12))
    assert time.monotonic() - began < 1.0


def test_aliases_that_stay_within_the_bound_are_expanded_as_usual() -> None:
    assert read_yaml(alias_bomb(3))["l2"] == [[["lol"] * 3] * 9] * 9
    assert read_yaml("base: &b {a: 1}\nmerged: {<<: *b, c: 2}") == {"base": {"a": 1}, "merged": {"a": 1, "c": 2}}


def test_long_strings_repeated_by_aliases_count_by_their_length() -> None:
    with pytest.raises(YamlRefused, match="aliases"):
        read_yaml(f"s: &s {'x' * 100_000}\nmany: [{', '.join(['*s'] * 50)}]")


@pytest.mark.parametrize(("text", "why"), [
    ("a: &a [1, *a]", "recursive alias"),
    ("[" * 50_000 + "]" * 50_000, "nests deeper"),
    ("x" * (MAX_YAML_BYTES + 1), "bytes"),
])
def test_recursive_too_deep_or_too_large_yaml_is_refused_naming_why(text: str, why: str) -> None:
    with pytest.raises(YamlRefused, match=why):
        read_yaml(text)


def test_yaml_that_does_not_parse_is_a_yaml_error_as_before() -> None:
    with pytest.raises(yaml.YAMLError):
        read_yaml("a: [1")
