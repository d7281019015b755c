"""Who runs a read-only view, and whether Slurm hides other users' jobs from them.

With `PrivateData=jobs` Slurm shows a user only their own jobs (squeue, scontrol, sacct), except
to root, SlurmUser and users of AdminLevel Operator or Administrator (slurm.conf(5)). Such a user
gets the published view: what Slurm shows them, and the engine's numbers from each visible job's
AdminComment (admin_comment.published). The state store and a recomputed plan are never read for
them: the store holds every user's jobs, and a plan built from a filtered queue disagrees with
the engine's.

The name is the login's (getpass.getuser(), as `doctor` takes it). It decides only what the view
leaves out of what this user can already read; Slurm and the store's file mode are the boundary.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dike_slurm.errors import DikeError

if TYPE_CHECKING:
    from dike_slurm.config import Config

SEES_EVERYTHING = frozenset({"Operator", "Administrator"})  # sacctmgr's AdminLevel values


@dataclass(frozen=True)
class Viewer:
    name: str
    restricted: bool  # Slurm hides other users' jobs from this user
    why: str  # one line: what the view shows and why


def private_data(options: Mapping[str, str]) -> set[str]:
    """PrivateData's items from `scontrol show config` (keys lower-case): {"jobs", "usage"}; none -> {}."""
    value = options.get("privatedata", "")
    return {item.strip().lower() for item in value.split(",") if item.strip() and item.strip().lower() != "none"}


def slurm_user(options: Mapping[str, str]) -> str:
    """SlurmUser's name: `scontrol show config` prints `SlurmUser = slurm(64030)`."""
    return options.get("slurmuser", "").split("(", 1)[0].strip()


def viewer_from(name: str, options: Mapping[str, str], admin_level: Callable[[], str | None]) -> Viewer:
    """The viewer `name` under this configuration; `admin_level` is asked only when it decides."""
    if "jobs" not in private_data(options):
        return Viewer(name, False, "Slurm shows every user's jobs (PrivateData has no jobs)")
    if name in ("root", slurm_user(options)):
        return Viewer(name, False, f"{name} sees every job (root or SlurmUser)")
    level = admin_level()
    if level in SEES_EVERYTHING:
        return Viewer(name, False, f"{name} sees every job (AdminLevel={level})")
    return Viewer(name, True, (
        f"PrivateData=jobs: Slurm shows {name} only their own jobs, so this view shows those, with the "
        "engine's level and attained service as it published them in each job's AdminComment"))


def read_viewer(config: Config, run: Callable[[list[str]], str], name: str | None = None) -> Viewer:
    """The viewer running this command: `scontrol show config`, then `sacctmgr show user` when
    PrivateData=jobs leaves it open. `run` runs one argv and returns its stdout (raising DikeError)."""
    from dike_slurm.parsing.slurm_options import parse_show_config

    slurm = config.slurm
    command = (lambda tool: str(slurm.bin_dir / tool)) if slurm.bin_dir else (lambda tool: tool)
    name = name or getpass.getuser()
    if name == "root":  # sees everything whatever PrivateData says; asks Slurm nothing (audit works with Slurm down)
        return Viewer(name, False, "root sees every job")
    try:
        options = parse_show_config(run([command("scontrol"), "show", "config"]))
    except DikeError as exc:  # PrivateData unknown: show only what is certainly this user's
        return Viewer(name, True, f"Slurm's PrivateData is unknown ({exc}): only {name}'s own jobs are shown")

    def admin_level() -> str | None:
        try:
            rows = run([command("sacctmgr"), "-n", "-P", "show", "user", name, "format=user,adminlevel"])
        except DikeError:  # slurmdbd down: no level known, so the narrower view
            return None
        return next((line.split("|")[1] for line in rows.splitlines() if line.split("|")[0] == name), None)

    return viewer_from(name, options, admin_level)


def slurm_runner(config: Config, timeout: float | None = None) -> Callable[[list[str]], str]:
    """Run a read-only Slurm command as the views do: the configured slurm.conf, UTC, one clear error."""
    from dike_slurm.slurm.backends.commands import read_output

    env = dict(os.environ, TZ="UTC")
    if config.slurm.slurm_conf is not None:
        env["SLURM_CONF"] = str(config.slurm.slurm_conf)
    limit = timeout if timeout is not None else config.slurm.command_timeout_s
    return lambda argv: read_output(argv, env, limit)
