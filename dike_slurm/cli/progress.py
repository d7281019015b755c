"""The progress bar of long offline work (replay, tune, eval): on stderr, only at a terminal, and
only once the work has taken a few seconds."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.console import Console

if TYPE_CHECKING:
    from rich.progress import Progress, Task
    from rich.text import Text

PROGRESS_AFTER_S = 3.0  # a bar appears only for work slower than this


def _jobs_per_second_column():  # a rich ProgressColumn, built only when a bar is shown
    from rich.progress import ProgressColumn
    from rich.text import Text

    class JobsPerSecond(ProgressColumn):
        """Replayed jobs per second, over rich's recent samples."""

        def render(self, task: Task) -> Text:
            speed = task.speed
            return Text(f"{speed:,.0f} jobs/s" if speed else "- jobs/s")

    return JobsPerSecond()


class LazyProgress:
    """One bar per label, each out of `total_jobs`: `progress(index, finished)` moves bar `index`.
    Quiet when stderr is not a terminal (a pipe, a log file, CI)."""

    def __init__(self, labels: list[str], total_jobs: int, console: Console) -> None:
        self.labels = labels
        self.total = total_jobs
        self.console = console
        self.started = time.monotonic()
        self.progress: Progress | None = None
        self.tasks: dict[int, int] = {}
        self.done: dict[int, int] = {}

    def __call__(self, index: int, finished: int) -> None:
        self.done[index] = finished
        if self.progress is None:
            if not self.console.is_terminal or time.monotonic() - self.started < PROGRESS_AFTER_S:
                return
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), _jobs_per_second_column(),
                TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                console=self.console, transient=True,
            )
            self.progress.start()
            for position, label in enumerate(self.labels):
                self.tasks[position] = self.progress.add_task(label, total=self.total)
        for position, count in self.done.items():
            self.progress.update(self.tasks[position], completed=count)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
