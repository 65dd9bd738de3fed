"""Records the pipeline cannot process: kept with their original bytes and the reason, never silently dropped.

A ``DeadLetter`` travels to the dead-letter topic in the same transaction as the epoch's output, so a bad
record is accounted for exactly once. With ``on_error="halt"`` the source raises ``PoisonRecord`` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

HEADER_PREFIX = "epochline."
HEADER_FIELDS = ("stage", "reason", "topic", "partition", "offset")
"""The headers a dead letter carries, each ``epochline.<field>``, in this order."""


@dataclass(frozen=True)
class DeadLetter:
    """Record ``offset`` of ``topic``/``partition`` failed at ``stage`` ("decode", "late", "transform", ...)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    stage: str

    def headers(self) -> list[tuple[str, str | bytes | None]]:
        """Where the record came from and why it failed, as Kafka headers for the dead-letter topic."""
        values = {"stage": self.stage, "reason": self.reason, "topic": self.topic,
                  "partition": str(self.partition), "offset": str(self.offset)}
        return [(HEADER_PREFIX + name, values[name].encode()) for name in HEADER_FIELDS]

    def describe(self) -> str:
        return f"topic {self.topic!r} partition {self.partition} offset {self.offset}: {self.stage}: {self.reason}"


def described(headers: Sequence[tuple[str, bytes | None]]) -> dict[str, str]:
    """The ``epochline.*`` headers of a dead-letter record, by field (``HEADER_FIELDS``); bytes that are not
    UTF-8 are replaced, not refused, as the record is shown to a person."""
    return {name[len(HEADER_PREFIX):]: (value or b"").decode(errors="replace") for name, value in headers
            if name.startswith(HEADER_PREFIX) and name[len(HEADER_PREFIX):] in HEADER_FIELDS}


class PoisonRecord(Exception):
    """A record failed and the source is configured to halt (``on_error="halt"``) rather than dead-letter it."""

    def __init__(self, dead_letter: DeadLetter) -> None:
        super().__init__(f"poison record at {dead_letter.describe()}")
        self.dead_letter = dead_letter
