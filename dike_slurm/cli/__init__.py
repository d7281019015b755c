"""The `dike-slurm` command line: each command parses, calls one function, renders with rich."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

from dike_slurm.errors import DikeError

app = typer.Typer(
    name="dike-slurm",
    help="Dike policy engine for Slurm GPU clusters: live engine and offline replay.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # plain click help: typer's rich help loads rich.markdown (0.1 s of --help)
)
console = Console()
err_console = Console(stderr=True)


def main(argv: list[str] | None = None) -> None:
    """Entry point: known errors become one line on stderr and a non-zero exit code."""
    # Standalone mode handles usage errors (exit 2); our own errors are caught here.
    try:
        app(args=argv, prog_name="dike-slurm")
    except DikeError as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(1)


# Command modules register themselves on `app`; each imports what a command needs when it runs,
# so that `--help`, `status` and `breaker status` start fast (bench/cli_start.py).
from dike_slurm.cli import policies_cmd, config_cmd, engine_cmd, replay_cmd  # noqa: E402,F401
from dike_slurm.cli import trace_cmd  # noqa: E402,F401
from dike_slurm.cli import eval_cmd  # noqa: E402,F401
from dike_slurm.cli import doctor_cmd  # noqa: E402,F401
