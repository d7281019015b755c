"""`dike-slurm config check FILE`: validate a configuration file."""

from __future__ import annotations

from pathlib import Path

import typer

from dike_slurm.cli import app, console

config_app = typer.Typer(help="Configuration files.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("check")
def check_command(
    path: Path = typer.Argument(..., help="TOML configuration file"),
    show: bool = typer.Option(False, "--show", help="print the effective configuration"),
) -> None:
    """Validate FILE (with DIKE_* environment overrides applied); exit 2 on the first problem."""
    from dike_slurm.config import load_config

    config = load_config(path)
    console.print(f"[green]ok[/]: {path} (policy {config.engine.policy!r})", highlight=False)
    if show:
        console.print_json(config.model_dump_json())
