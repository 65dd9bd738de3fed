"""Structured logging: JSON lines for collectors, readable coloured lines for a person at a terminal.

Why JSON lines by default off a terminal: a user running one connector per topic ships these logs to a
collector that indexes fields (checkpoint id, topic, partition), which free text would force them to parse
back out. On a terminal the same records print as ``time LEVEL event key=value ...`` through rich, and the
``--stop-at-end`` progress bar shares that console so log lines scroll above it. librdkafka's own lines
reach the same handler: every client epochline creates passes its module's logger as ``logger``.
"""

from __future__ import annotations

import logging
import sys
from functools import cache
from typing import Literal

import orjson
from rich.console import Console
from rich.logging import RichHandler

LogFormat = Literal["auto", "text", "json"]

_STANDARD_ATTRIBUTES = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


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
    """The one stderr console that text logs and progress bars share."""
    return Console(stderr=True)


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
        handler = RichHandler(console=terminal_console(), show_path=False, markup=False, rich_tracebacks=False,
                              log_time_format="%H:%M:%S")
        handler.setFormatter(TextFormatter())
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    return chosen
