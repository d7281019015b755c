"""`dike-slurm config check [FILE]`: validate a configuration file ($DIKE_CONFIG when none is named)."""

from __future__ import annotations

import getpass
import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer

from dike_slurm.cli.group import app, console
from dike_slurm.cli.common import CONFIG_OPTION, JSON_OPTION, emit_json, load, safe
from dike_slurm.errors import ConfigError, DikeError, InputError

config_app = typer.Typer(help="Configuration files.", no_args_is_help=True)
app.add_typer(config_app, name="config")

VERDICT_PREFIX = {"ok": "", "warn": "warn: ", "FAIL": "FAIL: "}


@config_app.command("check")
def check_command(
    path: Optional[Path] = typer.Argument(None, help="TOML configuration file (default: --config, else $DIKE_CONFIG)"),
    config_path: Optional[Path] = CONFIG_OPTION,
    show: bool = typer.Option(False, "--show", help="print the effective configuration"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Validate FILE (default: $DIKE_CONFIG), with DIKE_* environment overrides applied: every problem,
    one a line (exit 2). Then check that this user can write the files it names, and the deployment
    rules `render` and `doctor` apply too (exit 1 on a FAIL)."""
    from dike_slurm.config import config_source
    from dike_slurm.ops.deploy_rules import deployment_checks
    from dike_slurm.ops.doctor import path_checks
    from dike_slurm.ops.doctor_checks import FAIL

    if path is not None and config_path is not None and path != config_path:
        raise InputError(f"config check: two files named ({path} and --config {config_path}): name one")
    if config_source(path or config_path).path is None:
        raise InputError("config check needs a file: FILE, --config FILE or $DIKE_CONFIG")
    config, source = _load_listing_every_problem(path or config_path)
    assert source.path is not None
    effective = json.loads(config.model_dump_json())
    files = path_checks(config, getpass.getuser())
    rules = deployment_checks(config, source.path.resolve())
    checks = files + rules
    if as_json:
        emit_json("config check", source, {"ok": not any(c.verdict == FAIL for c in checks),
                                           "policy": config.engine.policy, "files": [asdict(c) for c in files],
                                           "deployment": [asdict(c) for c in rules]}
                  | ({"effective": effective} if show else {}))
    else:
        console.print(safe(source.describe()), highlight=False)
        for check in checks:
            console.print(safe(f"{VERDICT_PREFIX[check.verdict]}{check.name}: {check.found}"
                               + (f" ({check.advice})" if check.advice else "")), highlight=False)
        if not any(c.verdict == FAIL for c in checks):
            console.print(f"[green]ok[/]: {source.path} (policy {config.engine.policy!r})", highlight=False)
        if show:
            console.print_json(data=effective)
    unwritable = [c.name for c in files if c.verdict == FAIL]
    broken = [c.name for c in rules if c.verdict == FAIL]
    if unwritable or broken:
        said = ([f"the engine could not write {', '.join(unwritable)}"] if unwritable else []) + (
            [f"the deployment rules fail ({', '.join(broken)}: render would refuse them)"] if broken else [])
        raise DikeError(f"config check: {source.path}: {'; '.join(said)}")


def _load_listing_every_problem(path: Optional[Path]):
    """The configuration, or one error that lists every problem of the file, one a line."""
    try:
        return load(path)
    except ConfigError as exc:
        if len(exc.problems) < 2:
            raise
        lines = "\n".join(f"  {problem}" for problem in exc.problems)
        raise ConfigError(f"{exc.source_name}: {len(exc.problems)} problems:\n{lines}") from None
