"""A progress bar of items and records on a terminal."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from engine.batch.job import BatchProgress


class _RichProgress:
    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task = progress.add_task("items", total=None, records=0)

    def begin(self, total_items: int, settled_items: int) -> None:
        self._progress.update(self._task, total=total_items, completed=settled_items)

    def settled(self, records: int) -> None:
        fields = self._progress.tasks[self._task].fields
        self._progress.update(self._task, advance=1, records=fields["records"] + records)


@contextmanager
def rich_progress() -> Iterator[BatchProgress]:
    """A progress bar of items and records on stderr; silent when stderr is not a terminal."""
    console = Console(stderr=True)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[records]:,} records"), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        yield _RichProgress(progress)
