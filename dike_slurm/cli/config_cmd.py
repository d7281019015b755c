"""`dike-slurm config check FILE`: validate a configuration file."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from dike_slurm.cli import app, console
from dike_slurm.cli.common import JSON_OPTION, emit_json, load, safe

config_app = typer.Typer(help="Configuration files.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("check")
def check_command(
    path: Path = typer.Argument(..., help="TOML configuration file"),
    show: bool = typer.Option(False, "--show", help="print the effective configuration"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Validate FILE (with DIKE_* environment overrides applied); exit 2 on the first problem."""
    config, source = load(path)
    effective = json.loads(config.model_dump_json())
    if as_json:
        emit_json("config check", source, {"ok": True, "policy": config.engine.policy}
                  | ({"effective": effective} if show else {}))
        return
    console.print(safe(source.describe()), highlight=False)
    console.print(f"[green]ok[/]: {path} (policy {config.engine.policy!r})", highlight=False)
    if show:
        console.print_json(data=effective)
