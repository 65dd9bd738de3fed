"""Logs: JSON lines off a terminal, the connector's name on every line, librdkafka's repeats held back."""

from __future__ import annotations

import io
import logging

import orjson
import pytest

from engine.logs import CurrentStderrHandler, JsonFormatter, RepeatLimiter, TextFormatter, chosen_format


def record(message: str, **fields: object) -> logging.LogRecord:
    made = logging.makeLogRecord({"name": "librdkafka", "levelno": logging.ERROR, "levelname": "ERROR",
                                  "msg": message})
    for key, value in fields.items():
        setattr(made, key, value)
    return made


def test_a_line_repeated_within_the_window_is_held_back_and_counted_on_the_next_one_shown() -> None:
    now = [0.0]
    limiter = RepeatLimiter(window_s=10.0, clock=lambda: now[0])
    refused = "FAIL [rdkafka#producer-1] 127.0.0.1:1/bootstrap: Connect failed (after {}ms in state CONNECT)"

    shown = []
    for second in range(25):
        now[0] = float(second)
        line = record(refused.format(second))  # only the numbers differ: the same line
        if limiter.filter(line):
            shown.append((second, getattr(line, "repeated", 0)))

    assert shown == [(0, 0), (10, 9), (20, 9)]
    assert limiter.filter(record("another message"))


def test_json_lines_carry_the_fields_of_the_call_and_text_lines_read_as_key_value() -> None:
    line = record("checkpoint committed", checkpoint_id=7, connector="orders-clean")

    assert orjson.loads(JsonFormatter().format(line)) | {"ts": 0} == {
        "ts": 0, "level": "error", "logger": "librdkafka", "event": "checkpoint committed", "checkpoint_id": 7,
        "connector": "orders-clean"}
    assert TextFormatter().format(line) == "checkpoint committed  checkpoint_id=7 connector=orders-clean"


@pytest.mark.parametrize(("requested", "is_terminal", "chosen"), [
    ("auto", True, "text"), ("auto", False, "json"), ("json", True, "json"), ("text", False, "text")])
def test_auto_means_text_on_a_terminal_and_json_elsewhere(monkeypatch: pytest.MonkeyPatch, requested: str,
                                                         is_terminal: bool, chosen: str) -> None:
    monkeypatch.setattr("sys.stderr.isatty", lambda: is_terminal)
    assert chosen_format(requested) == chosen  # type: ignore[arg-type]


def test_json_lines_go_to_the_stderr_of_the_moment_not_to_the_one_closed_since_logging_was_set_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    handler = CurrentStderrHandler()
    handler.setFormatter(JsonFormatter())
    at_setup, later = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stderr", at_setup)
    handler.stream = at_setup
    at_setup.close()
    monkeypatch.setattr("sys.stderr", later)

    handler.handle(record("still shown"))

    assert orjson.loads(later.getvalue())["event"] == "still shown"
