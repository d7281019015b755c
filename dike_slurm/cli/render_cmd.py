"""`dike-slurm render`: deployment files (systemd, timer, cron, slurm.conf lines, Prometheus alert rules, a
Grafana dashboard) from the configuration."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from dike_slurm.cli.group import app, console, err_console
from dike_slurm.cli.common import CONFIG_OPTION, load, safe
from dike_slurm.errors import InputError
from dike_slurm.ops.render import RENDER_KINDS


@app.command("render")
def render_command(
    kind: str = typer.Argument(..., help="|".join(RENDER_KINDS)),
    config_path: Optional[Path] = CONFIG_OPTION,
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="write here instead of stdout"),
    user: str = typer.Option("dike-slurm", "--user", help="the dedicated account the service runs as"),
    oneshot: bool = typer.Option(False, "--oneshot", help="systemd: the one-cycle service a timer starts"),
) -> None:
    """Deployment files from templates: systemd service, timer, cron line, slurm.conf lines, Prometheus
    alert rules (prometheus-rules) and a Grafana dashboard (grafana) over the engine's metrics.

    The file names the configuration the deployed engine reads: --config, else $DIKE_CONFIG. The
    service and the cron line run this environment's dike-slurm: render them from a release installed
    into a prefix of its own (make install PREFIX=/opt/dike-slurm). They apply the rules doctor and
    config check apply: a FAIL is refused (every one named), a warning is said.
    """
    from dike_slurm.ops.render import render_checked

    config, source = load(config_path)
    if source.path is None:
        raise InputError("render needs the configuration file the deployed engine reads: --config FILE or $DIKE_CONFIG")
    err_console.print(safe(source.describe()), highlight=False)  # stdout is the file itself
    text, warnings = render_checked(kind, config, source.path.resolve(), user=user, oneshot=oneshot)
    for check in warnings:  # the rules doctor and config check apply too (dike_slurm.ops.deploy_rules)
        err_console.print(safe(f"warning: {check.name}: {check.found}. What to do: {check.advice}"), highlight=False)
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror}", source=str(out)) from None
    console.print(safe(f"wrote {out}"))
