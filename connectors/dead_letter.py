"""Records the pipeline cannot process: kept with their original bytes and the reason, never silently dropped.

A ``DeadLetter`` travels to the dead-letter topic in the same transaction as the epoch's output, so a bad
record is accounted for exactly once. With ``on_error="halt"`` the source raises ``PoisonRecord`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

HEADER_PREFIX = "epochline."


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
        return [
            (HEADER_PREFIX + "stage", self.stage.encode()),
            (HEADER_PREFIX + "reason", self.reason.encode()),
            (HEADER_PREFIX + "topic", self.topic.encode()),
            (HEADER_PREFIX + "partition", str(self.partition).encode()),
            (HEADER_PREFIX + "offset", str(self.offset).encode()),
        ]

    def describe(self) -> str:
        return f"topic {self.topic!r} partition {self.partition} offset {self.offset}: {self.stage}: {self.reason}"


class PoisonRecord(Exception):
    """A record failed and the source is configured to halt (``on_error="halt"``) rather than dead-letter it."""

    def __init__(self, dead_letter: DeadLetter) -> None:
        super().__init__(f"poison record at {dead_letter.describe()}")
        self.dead_letter = dead_letter
