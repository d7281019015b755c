"""`dike-slurm config check FILE`: validate a configuration file."""

from __future__ import annotations

import getpass
import json
from dataclasses import asdict
from pathlib import Path

import typer

from dike_slurm.cli.group import app, console
from dike_slurm.cli.common import JSON_OPTION, emit_json, load, safe
from dike_slurm.errors import DikeError

config_app = typer.Typer(help="Configuration files.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("check")
def check_command(
    path: Path = typer.Argument(..., help="TOML configuration file"),
    show: bool = typer.Option(False, "--show", help="print the effective configuration"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Validate FILE (with DIKE_* environment overrides applied; exit 2 on the first problem) and
    check that this user can write the files it names (exit 1 when not)."""
    from dike_slurm.ops.doctor import path_checks
    from dike_slurm.ops.doctor_checks import FAIL

    config, source = load(path)
    effective = json.loads(config.model_dump_json())
    files = path_checks(config, getpass.getuser())
    failed = [check for check in files if check.verdict == FAIL]
    if as_json:
        emit_json("config check", source, {"ok": not failed, "policy": config.engine.policy,
                                           "files": [asdict(check) for check in files]}
                  | ({"effective": effective} if show else {}))
    else:
        console.print(safe(source.describe()), highlight=False)
        for check in files:
            console.print(safe(f"{check.name}: {check.found}" + (f" ({check.advice})" if check.advice else "")),
                          highlight=False)
        if not failed:
            console.print(f"[green]ok[/]: {path} (policy {config.engine.policy!r})", highlight=False)
        if show:
            console.print_json(data=effective)
    if failed:
        raise DikeError(f"config check: {path}: the engine could not write {', '.join(c.name for c in failed)}")
