"""The command group every command registers on, and the consoles the commands print to."""

from __future__ import annotations

import sys
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from dike_slurm.errors import DikeError


class _Commands(TyperGroup):
    """The command group: a known error (DikeError) becomes one line on stderr and its exit code, in
    the console script and for a caller of `app` alike (tests run it in process with CliRunner)."""

    def invoke(self, ctx: typer.Context) -> object:
        try:
            return super().invoke(ctx)
        except DikeError as exc:
            err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None


app = typer.Typer(
    cls=_Commands,
    name="dike-slurm",
    help="Dike policy engine for Slurm GPU clusters: live engine and offline replay.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
    rich_markup_mode=None,  # plain click help: typer's rich help loads rich.markdown (0.1 s of --help)
    context_settings={"help_option_names": ["-h", "--help"]},
)
# Piped or redirected, output is for a program or a file: as wide as a line needs, never cut at
# 80 columns. On a terminal rich uses its width and the tables fold long cells.
PIPE_WIDTH = 10_000
console = Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else PIPE_WIDTH)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"dike-slurm {version('dike-slurm')}")
        except PackageNotFoundError:
            print("dike-slurm (not installed: run from the source tree)")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Optional[bool] = typer.Option(None, "--version", "-V", callback=_version, is_eager=True,
                                                help="print the version and exit"),
) -> None:
    """Dike policy engine for Slurm GPU clusters: live engine and offline replay."""
