"""`dike-slurm doctor`: check a site's Slurm for what the engine needs (dike_slurm.ops.doctor), and
say what to change."""

from __future__ import annotations

import getpass
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from dike_slurm.cli.group import app, console
from dike_slurm.cli.common import CONFIG_OPTION, JSON_OPTION, emit_json, load, safe, say_source, table
from dike_slurm.errors import DikeError

VERDICT_STYLES = {"ok": "green", "warn": "yellow", "FAIL": "bold red"}


@app.command("doctor")
def doctor_command(
    config_path: Optional[Path] = CONFIG_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Check this site's Slurm for what the engine needs; print what to change in slurm.conf (exit 1 on a FAIL)."""
    from dike_slurm.ops.doctor import gather
    from dike_slurm.ops.doctor_checks import FAIL

    config, source = load(config_path)
    say_source(source, as_json)
    checks = gather(config, getpass.getuser(), config_path=source.path)
    failed = [c.name for c in checks if c.verdict == FAIL]
    if as_json:
        emit_json("doctor", source, {"checks": [asdict(c) for c in checks], "failed": failed})
    else:
        result = table("dike-slurm doctor", ["check", "found", "verdict", "what to change"])
        for check in checks:
            style = VERDICT_STYLES[check.verdict]
            result.add_row(safe(check.name), safe(check.found), f"[{style}]{check.verdict}[/]", safe(check.advice))
        console.print(result)
    if failed:
        raise DikeError(f"doctor: {len(failed)} check(s) failed: {', '.join(failed)}")
