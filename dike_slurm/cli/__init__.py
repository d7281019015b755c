"""The `dike-slurm` command line: each command parses, calls one function, renders with rich."""

from __future__ import annotations

import sys

# Command modules register themselves on `app` (in this order, the order of --help); each imports
# what a command needs when it runs, so that `--help`, `status` and `breaker status` start fast
# (bench/cli_start.py).
from dike_slurm.cli import policies_cmd, config_cmd, engine_cmd, queue_cmd, render_cmd, replay_cmd  # noqa: F401
from dike_slurm.cli import trace_cmd  # noqa: F401
from dike_slurm.cli import eval_cmd  # noqa: F401
from dike_slurm.cli import doctor_cmd  # noqa: F401
from dike_slurm.cli import sweep_cmd  # noqa: F401
from dike_slurm.cli.group import app


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage errors exit 2 (click's standalone mode), known errors one line
    (dike_slurm.cli.group)."""
    try:
        app(args=argv, prog_name="dike-slurm")
    except BrokenPipeError:
        sys.exit(1)
