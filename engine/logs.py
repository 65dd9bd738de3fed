"""Structured logging: JSON lines for collectors, readable coloured lines for a person at a terminal.

Why JSON lines by default off a terminal: a user running one connector per topic ships these logs to a
collector that indexes fields (checkpoint id, topic, partition), which free text would force them to parse
back out. On a terminal the same records print as ``time LEVEL event key=value ...`` through rich, and the
``--stop-at-end`` progress bar shares that console so log lines scroll above it. librdkafka's own lines
reach the same handler: every client epochline creates passes its module's logger as ``logger``.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Literal, TextIO

import orjson

if TYPE_CHECKING:
    from rich.console import Console

LogFormat = Literal["auto", "text", "json"]

_STANDARD_ATTRIBUTES = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName",
                                                                "color_message"}  # uvicorn's ANSI copy of msg
CLIENT_LOGGER_NAME = "librdkafka"  # connectors.clients.CLIENT_LOGGER: every Kafka client's own lines
_context: dict[str, object] = {}


def set_context(**fields: object) -> None:
    """Fields every later log record carries unless it names them itself (e.g. ``connector``)."""
    _context.update(fields)


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class RepeatLimiter(logging.Filter):
    """librdkafka repeats a failing connection's line at every reconnect; let one line per message through
    per ``window_s`` and say on the next one how many were held back. Messages that differ only in numbers
    (durations, counters) count as the same."""

    def __init__(self, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._window_s = window_s
        self._clock = clock
        self._seen: dict[str, tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = _DIGITS.sub("#", record.getMessage())
        now = self._clock()
        shown_at, held = self._seen.get(key, (float("-inf"), 0))
        if now - shown_at < self._window_s:
            self._seen[key] = (shown_at, held + 1)
            return False
        if held:
            record.repeated = held
        self._seen[key] = (now, 0)
        return True


_DIGITS = re.compile(r"\d+")


def _fields(record: logging.LogRecord) -> dict[str, object]:
    """The ``extra`` fields a call site passed."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRIBUTES}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


class TextFormatter(logging.Formatter):
    """``event key=value ...``; rich adds the time and the coloured level."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{key}={_text(value)}" for key, value in _fields(record).items())
        line = f"{record.getMessage()}  {fields}" if fields else record.getMessage()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text(value: object) -> str:
    if isinstance(value, str):
        return value if value and " " not in value else repr(value)
    return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


@cache
def terminal_console() -> Console:
    """The one stderr console that text logs and progress bars share (rich is only imported for a terminal:
    a worker logging JSON starts without it)."""
    from rich.console import Console

    return Console(stderr=True)


class CurrentStderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time of each record, as rich's console does for text.

    Why: a handler that kept the stream of the moment it was made writes into a closed file once that
    stream is replaced and closed (a command run in-process under a test runner that captures stderr)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        """Ignored: the stream is always the current ``sys.stderr``."""


def chosen_format(requested: LogFormat) -> Literal["text", "json"]:
    """``auto``: text when stderr is a terminal, JSON otherwise (files, pipes, collectors)."""
    if requested != "auto":
        return requested
    return "text" if sys.stderr.isatty() else "json"


def configure_logging(level: str = "INFO", log_format: LogFormat = "auto") -> Literal["text", "json"]:
    """Send logs to stderr (stdout stays free for command output); returns the format chosen."""
    chosen = chosen_format(log_format)
    handler: logging.Handler
    if chosen == "text":
        from rich.logging import RichHandler

        handler = RichHandler(console=terminal_console(), show_path=False, markup=False, rich_tracebacks=False,
                              log_time_format="%H:%M:%S")
        handler.setFormatter(TextFormatter())
    else:
        handler = CurrentStderrHandler()
        handler.setFormatter(JsonFormatter())
    handler.addFilter(_ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    client_logger = logging.getLogger(CLIENT_LOGGER_NAME)
    client_logger.filters[:] = [RepeatLimiter()]
    return chosen
