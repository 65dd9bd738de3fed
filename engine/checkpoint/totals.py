"""What a run moved, counted from what Kafka committed: the line ``epochline run`` ends with.

Records are counted per epoch while it is open and added to the run's totals only when its transaction
commits; an abandoned epoch's records are read again and counted then, so the totals say what is in the
output and dead-letter topics, not how much work was done."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from connectors.dead_letter import DeadLetter

Outcome = Literal["stopped", "finished", "failed"]


@dataclass
class EpochCounts:
    """The open epoch's records: read from the source topic, written to the sink topic, dead-lettered (per
    source topic and partition, which each partition's committed offset metadata sums up)."""

    records_in: int = 0
    records_out: int = 0
    dead_letters: Counter[tuple[str, int]] = field(default_factory=Counter)

    @property
    def dead_lettered(self) -> int:
        return self.dead_letters.total()

    @property
    def unattributed_dead_letters(self) -> int:
        """Dead letters of no source partition (a transform's row the sink refused: partition -1)."""
        return sum(count for (_, partition), count in self.dead_letters.items() if partition < 0)

    def count_dead_letters(self, letters: Iterable[DeadLetter]) -> None:
        self.dead_letters.update((letter.topic, letter.partition) for letter in letters)


@dataclass
class RunTotals:
    """Every committed epoch of a run, across its in-process restarts, and how the run ended."""

    records_in: int = 0
    records_out: int = 0
    dead_lettered: int = 0
    epochs_committed: int = 0
    outcome: Outcome = "stopped"
    started: bool = False
    """Kafka answered and the connector began: a run that never got there has nothing to sum up."""

    def add_committed(self, epoch: EpochCounts) -> None:
        self.records_in += epoch.records_in
        self.records_out += epoch.records_out
        self.dead_lettered += epoch.dead_lettered
        self.epochs_committed += 1

    def line(self) -> str:
        """``stopped: 10,000 records in, 9,998 out, 2 dead-lettered, 14 epochs committed``."""
        epochs = "epoch" if self.epochs_committed == 1 else "epochs"
        return (f"{self.outcome}: {self.records_in:,} records in, {self.records_out:,} out, "
                f"{self.dead_lettered:,} dead-lettered, {self.epochs_committed:,} {epochs} committed")

    def fields(self) -> dict[str, int | str]:
        """The same as log fields, for JSON logs."""
        return {"outcome": self.outcome, "records_in": self.records_in, "records_out": self.records_out,
                "dead_lettered": self.dead_lettered, "epochs_committed": self.epochs_committed}
