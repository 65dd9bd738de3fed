"""What a run moved, counted from what Kafka committed: the line ``epochline run`` ends with.

Records are counted per epoch while it is open and added to the run's totals only when its transaction
commits; an abandoned epoch's records are read again and counted then, so the totals say what is in the
output and dead-letter topics, not how much work was done."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Outcome = Literal["stopped", "finished", "failed"]


@dataclass
class EpochCounts:
    """The open epoch's records: read from the source topic, written to the sink topic, dead-lettered."""

    records_in: int = 0
    records_out: int = 0
    dead_lettered: int = 0


@dataclass
class RunTotals:
    """Every committed epoch of a run, across its in-process restarts, and how the run ended."""

    committed: EpochCounts = field(default_factory=EpochCounts)
    epochs_committed: int = 0
    outcome: Outcome = "stopped"
    started: bool = False
    """Kafka answered and the connector began: a run that never got there has nothing to sum up."""

    def add_committed(self, epoch: EpochCounts) -> None:
        self.committed.records_in += epoch.records_in
        self.committed.records_out += epoch.records_out
        self.committed.dead_lettered += epoch.dead_lettered
        self.epochs_committed += 1

    def line(self) -> str:
        """``stopped: 10,000 records in, 9,998 out, 2 dead-lettered, 14 epochs committed``."""
        done = self.committed
        epochs = "epoch" if self.epochs_committed == 1 else "epochs"
        return (f"{self.outcome}: {done.records_in:,} records in, {done.records_out:,} out, "
                f"{done.dead_lettered:,} dead-lettered, {self.epochs_committed:,} {epochs} committed")

    def fields(self) -> dict[str, int | str]:
        """The same as log fields, for JSON logs."""
        done = self.committed
        return {"outcome": self.outcome, "records_in": done.records_in, "records_out": done.records_out,
                "dead_lettered": done.dead_lettered, "epochs_committed": self.epochs_committed}
