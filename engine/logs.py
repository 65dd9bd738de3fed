"""Structured logging: one JSON object per line, with the ``extra`` fields a call site passes.

Why JSON lines: a user running one connector per topic ships these logs to a collector that indexes
fields (checkpoint id, topic, partition), which free text would force them to parse back out.
"""

from __future__ import annotations

import logging
import sys

import orjson

_STANDARD_ATTRIBUTES = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRIBUTES})
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def configure_logging(level: str = "INFO") -> None:
    """Send structured logs to stderr; stdout stays free for command output."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
