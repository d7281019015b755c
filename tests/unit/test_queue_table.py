"""`queue` and `status` on a terminal: a line per job, the columns that fit, never folded."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from dike_slurm.cli.queue_cmd import QUEUE_COLUMNS, STATUS_COLUMNS, _job_table

REASON = ("level=0 attained=0.00gpuh expected=12.40gpuh (from 37 finished jobs of alice / train.sh / 4 GPUs); "
          "fair=0.42 wait=0.02")


def rows(columns, count=3):
    """Invented rows with every field of the table, some long."""
    out = []
    for i in range(count):
        row = {key: "" for _, key in columns}
        row.update(job=str(1000 + i), name="finetune-llama-70b-with-a-long-name", user="dikeuser2",
                   account="research", partition="gpu", state="PENDING", gpus=8, level=0, attained_gpu_hours="0.00",
                   counted_gpu_hours="0.00", expected_gpu_hours="12.40", priority_now=766197 + i,
                   priority_planned=766528, placement_now="Switches=1@1800", placement_planned=None,
                   slurm_reason="Priority", reason=REASON, note="")
        out.append(row)
    return out


def rendered(columns, width: int) -> list[str]:
    console = Console(width=width, file=io.StringIO(), force_terminal=False, color_system=None)
    _job_table("dike-slurm queue", rows(columns), columns, out=console)
    return console.file.getvalue().splitlines()


@pytest.mark.parametrize("columns", [QUEUE_COLUMNS, STATUS_COLUMNS], ids=["queue", "status"])
@pytest.mark.parametrize("width", [80, 100])
def test_a_terminal_gets_a_line_per_job_and_the_columns_that_fit(columns, width):
    lines = rendered(columns, width)
    assert max(len(line) for line in lines) <= width
    body = [line for line in lines if line.startswith("│")]
    assert [line.split("│")[1].strip() for line in body] == ["1000", "1001", "1002"]  # one line each: nothing folds
    header = next(line for line in lines if line.startswith("┃"))
    shown = [cell.strip() for cell in header.strip("┃").split("┃")]
    assert {"job", "user", "state", "GPUs", "level"} <= set(shown)  # who and what come first
    assert shown == [name for name, _ in columns if name in shown]  # in the table's own order
    bottom = next(i for i, line in enumerate(lines) if line.startswith("└"))
    left_out = " ".join(line.strip() for line in lines[bottom + 1:])  # a sentence, wrapped at the width
    missing = [name for name, _ in columns if name not in shown]
    assert missing and left_out == f"not shown: {', '.join(missing)} (--json has every field)"


def test_job_names_are_shown_as_written_never_as_markup():
    columns = QUEUE_COLUMNS
    console = Console(width=10_000, file=io.StringIO(), force_terminal=False, color_system=None)
    hostile = rows(columns, 1)
    hostile[0]["name"] = "[bold]x[/bold]"
    _job_table("q", hostile, columns, out=console)
    assert "[bold]x[/bold]" in console.file.getvalue()


def test_piped_output_keeps_every_column_and_cuts_nothing():
    lines = rendered(QUEUE_COLUMNS, 10_000)
    header = next(line for line in lines if line.startswith("┃"))
    assert [cell.strip() for cell in header.strip("┃").split("┃")] == [name for name, _ in QUEUE_COLUMNS]
    assert sum(REASON in line for line in lines) == 3 and not any(line.startswith("not shown") for line in lines)
