"""Progress bars on a terminal: batch items, and a ``--stop-at-end`` run's records up to the end offsets.

They share the console text logs print to, so log lines scroll above the bar, and they appear only when
logs are text (a terminal): in JSON mode nothing but JSON lines reaches stderr.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from connectors.checkpoint import SourceCheckpoint
from engine.batch import BatchProgress
from engine.logs import terminal_console


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(f"{task.speed:,.0f} records/s" if task.speed else "– records/s")


@contextmanager
def _bar(enabled: bool, *columns: ProgressColumn | str) -> Iterator[Progress]:
    with Progress(*columns, console=terminal_console(), disable=not enabled) as progress:
        yield progress


class _BatchBar:
    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task = progress.add_task("items", total=None, records=0)

    def begin(self, total_items: int, settled_items: int) -> None:
        self._progress.update(self._task, total=total_items, completed=settled_items)

    def settled(self, records: int) -> None:
        fields = self._progress.tasks[self._task].fields
        self._progress.update(self._task, advance=1, records=fields["records"] + records)


@contextmanager
def batch_progress(enabled: bool) -> Iterator[BatchProgress]:
    """Items settled of the plan's, and the records they moved."""
    with _bar(enabled, TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
              TextColumn("{task.fields[records]:,} records"), TimeElapsedColumn()) as progress:
        yield _BatchBar(progress)


class StopAtEndBar:
    """Records done of those between where the run started and the end offsets captured at its start.

    Counted from positions (offsets), so transaction markers count too and the bar reaches its end exactly
    when the run does."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task: TaskID | None = None
        self._ends: dict[tuple[str, int], int] = {}
        self._starts: dict[tuple[str, int], int] = {}

    def begin(self, ends: Mapping[str, Mapping[int, int]]) -> None:
        self._ends = {(source, p): end for source, partitions in ends.items() for p, end in partitions.items()}

    def positions(self, cuts: Mapping[str, SourceCheckpoint]) -> None:
        now = {(source, p): offset for source, cut in cuts.items() for p, offset in cut.offsets.items()}
        for key, offset in now.items():
            self._starts.setdefault(key, min(offset, self._ends.get(key, offset)))
        total = sum(max(0, end - self._starts.get(key, end)) for key, end in self._ends.items())
        done = sum(max(0, min(now.get(key, start), self._ends[key]) - start) for key, start in self._starts.items()
                   if key in self._ends)
        if self._task is None:
            self._task = self._progress.add_task("records", total=total)
        self._progress.update(self._task, total=total, completed=done)


@contextmanager
def stop_at_end_progress(enabled: bool) -> Iterator[StopAtEndBar]:
    with _bar(enabled, TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), _RateColumn(),
              TimeRemainingColumn()) as progress:
        yield StopAtEndBar(progress)
