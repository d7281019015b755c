"""`dike-slurm doctor`: ask a site's Slurm (read-only) for what the engine needs, and check it.

Read-only: `scontrol --version`, `squeue --json` (its format), `scontrol show config`, `scontrol
show partition -o` and `sacctmgr -nP show qos format=Name,Priority` (the site's own priority, as
the engine reads it, and the names the scope may use), `sacctmgr -nP show account format=Account`
(slurmdbd answers; the accounts) and `sacctmgr show user` (AdminLevel), through the configured
slurm.bin_dir and slurm_conf. The engine's own files are checked for the user running doctor.
The checks themselves are dike_slurm.ops.doctor_checks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dike_slurm.errors import DikeError
from dike_slurm.ops.deploy_rules import deployment_checks
from dike_slurm.ops.doctor_checks import FAIL, OK, Check, diagnose, scope_checks
from dike_slurm.parsing.slurm_options import parse_show_config
from dike_slurm.slurm.backends.commands import read_output

if TYPE_CHECKING:
    from dike_slurm.config import Config
    from dike_slurm.domain.slurm_priority import SlurmPriorityModel

SHOW_ACCOUNTS_ARGV = ("-nP", "show", "account", "format=Account")

Runner = Callable[[list[str], dict[str, str], float], str]  # argv, environment, timeout -> stdout


@dataclass(frozen=True)
class _Slurm:
    """Slurm's commands as the engine runs them: the configured bin_dir, slurm_conf and timeout."""

    runner: Runner
    env: dict[str, str]
    timeout: float
    bin_dir: Path | None

    def command(self, name: str) -> str:
        return str(self.bin_dir / name) if self.bin_dir else name

    def ask(self, name: str, *args: str) -> str:
        return self.runner([self.command(name), *args], self.env, self.timeout)


@dataclass
class _ClusterNames:
    """The names the scope may use, per kind (None: not read), and why a kind could not be read."""

    known: dict[str, list[str] | None] = field(default_factory=dict)
    unknown_why: dict[str, str] = field(default_factory=dict)
    slurmdbd_error: str = ""


def gather(config: Config, user: str, runner: Runner = read_output, config_path: Path | None = None) -> list[Check]:
    """Ask Slurm (read-only) and check what it says, the scope's names, the engine's files and the
    deployment's rules (dike_slurm.ops.deploy_rules, which `render` and `config check` apply too)."""

    slurm = _slurm(config, runner)
    version = slurm.ask("scontrol", "--version").strip()
    json_check = json_format_check(slurm.ask("squeue", "--json"))
    config_text = slurm.ask("scontrol", "show", "config")
    show_config = parse_show_config(config_text)
    priority_model, priority_error = None, ""
    if show_config.get("prioritytype") == "priority/multifactor":
        from dike_slurm.slurm.backends.site_priority import read_priority_model

        try:
            priority_model = read_priority_model(lambda argv: runner(list(argv), slurm.env, slurm.timeout),
                                                 slurm.command, config_text)
        except DikeError as exc:
            priority_error = str(exc)
    names = _cluster_names(slurm, priority_model)
    checks = diagnose(
        version=version, json_format=json_check, config=show_config,
        admin_level=None if names.slurmdbd_error else _admin_level(slurm, user),
        is_root=os.geteuid() == 0, priority_model=priority_model, priority_error=priority_error, user=user,
        slurmdbd_error=names.slurmdbd_error, store_exposure=store_exposure(config.engine.state_db),
        **_engine_settings(config),
    )
    return (checks + scope_checks(config.scope, names.known, names.unknown_why) + path_checks(config, user)
            + deployment_checks(config, config_path))


def _slurm(config: Config, runner: Runner) -> _Slurm:
    slurm = config.slurm
    env = dict(os.environ)
    env["TZ"] = "UTC"
    if slurm.slurm_conf is not None:
        env["SLURM_CONF"] = str(slurm.slurm_conf)
    return _Slurm(runner, env, slurm.command_timeout_s, slurm.bin_dir)


def json_format_check(queue_text: str) -> Check:
    """Which JSON `squeue --json` prints, and whether the engine reads it."""
    import json

    from dike_slurm.slurm.formats import FormatError, detect, slurm_release

    try:
        document = json.loads(queue_text)
        if not isinstance(document, dict):
            raise ValueError("not an object")
        fmt = detect(document, "squeue --json")
        plugin = document["meta"]["plugin"]
        name = plugin.get("data_parser") or plugin.get("type")
        return Check("JSON format", f"{name} ({fmt.family}, Slurm {slurm_release(document)})", OK)
    except FormatError as exc:
        return Check("JSON format", "unknown", FAIL, str(exc))
    except ValueError as exc:
        return Check("JSON format", "unreadable", FAIL, f"squeue --json: {exc}")


def _cluster_names(slurm: _Slurm, priority_model: SlurmPriorityModel | None) -> _ClusterNames:
    """The partitions, accounts and QOS of the cluster: from the site's priority where it was
    read, else asked; the accounts tell whether slurmdbd answers."""
    from dike_slurm.slurm.backends.site_priority import (
        SHOW_PARTITIONS_ARGV, SHOW_QOS_ARGV, partitions_from_scontrol, qos_from_sacctmgr)

    names = _ClusterNames()
    if priority_model is not None:
        names.known["partitions"] = list(priority_model.partitions)
    else:
        try:
            partitions = slurm.ask("scontrol", *SHOW_PARTITIONS_ARGV)
            names.known["partitions"] = [name for name, _, _ in partitions_from_scontrol(partitions)[0]]
        except DikeError as exc:
            names.unknown_why["partitions"] = str(exc)
    try:
        accounts = slurm.ask("sacctmgr", *SHOW_ACCOUNTS_ARGV)
        names.known["accounts"] = [line.strip() for line in accounts.splitlines() if line.strip()]
    except DikeError as exc:
        names.slurmdbd_error = str(exc)
        names.unknown_why["accounts"] = names.unknown_why["qos"] = "slurmdbd did not answer"
    if priority_model is not None and priority_model.qos_priority:
        names.known["qos"] = list(priority_model.qos_priority)
    elif not names.slurmdbd_error:
        try:
            names.known["qos"] = list(qos_from_sacctmgr(slurm.ask("sacctmgr", *SHOW_QOS_ARGV)))
        except DikeError as exc:
            names.unknown_why["qos"] = str(exc)
    return names


def _admin_level(slurm: _Slurm, user: str) -> str | None:
    """`user`'s AdminLevel in slurmdbd (None: not read)."""
    try:
        rows = slurm.ask("sacctmgr", "-n", "-P", "show", "user", user, "format=user,adminlevel")
    except DikeError:
        return None
    return next((line.split("|")[1] for line in rows.splitlines() if "|" in line), None)


def _engine_settings(config: Config) -> dict:
    """What the checks need of the engine's configuration and its policy's hooks."""
    from dike_slurm.registry import default_registry

    policy = default_registry().create(config.engine.policy)
    params = config.policy_params(policy.name)
    wait = policy.switch_wait_s(params)
    engine = config.engine
    return dict(
        strategy=engine.priority_strategy, max_consolidation_wait_s=float(wait) if wait is not None else None,
        preemption=policy.requeue_min_run_s(params) is not None,  # the hook a preemptive policy declares
        admin_comment=engine.admin_comment, priority_mode=engine.priority_mode, priority_span=engine.priority_span,
        backend=config.slurm.backend,
    )


def writable(path: Path) -> tuple[bool, str]:
    """Whether this user can write `path` (and its folder, where files are replaced and journals
    kept), or create it: the nearest folder that exists must then be writable."""
    try:
        return _writable_or_raise(path)
    except OSError as exc:  # a folder on the way this user may not search
        return False, f"cannot be reached: {exc.strerror} ({exc.filename})"


def _writable_or_raise(path: Path) -> tuple[bool, str]:
    folder = path.parent
    if path.exists():
        if not os.access(path, os.W_OK):
            return False, f"{path} is not writable"
        if not os.access(folder, os.W_OK | os.X_OK):
            return False, f"its folder {folder} is not writable (new files and journals go there)"
        return True, "writable"
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return False, f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return False, f"cannot be created: {existing} is not writable"
    return True, "can be created" if existing != folder else "can be created in its folder"


def store_exposure(path: Path) -> str:
    """How any user can read the state file: "" when its mode or its folder's keeps them out."""
    import stat

    try:
        file_mode, folder_mode = path.stat().st_mode, path.parent.stat().st_mode
    except OSError:  # not there yet (the engine creates it 0600), or not reachable by this user
        return ""
    if file_mode & stat.S_IROTH and folder_mode & stat.S_IXOTH:
        return f"{path} is readable by every user (mode {stat.S_IMODE(file_mode):o})"
    return ""


def path_checks(config: Config, user: str) -> list[Check]:
    """The files the engine writes (state, lock, metrics), for `user`, who runs this check."""
    engine = config.engine
    files = [("engine.state_db", engine.state_db),
             ("engine.lock_file", engine.lock_file or Path(f"{engine.state_db}.lock"))]
    if engine.metrics_file is not None:
        files.append(("engine.metrics_file", engine.metrics_file))
    checks = []
    for name, path in files:
        ok, why = writable(path)
        checks.append(Check(name, f"{path}: {why} by {user}", OK if ok else FAIL,
                            "" if ok else f"install -d -o {user} -g {user} {path.parent} (as root), and run doctor as "
                                          f"the user the service runs as (sudo -u SERVICE_USER dike-slurm doctor)"))
    return checks
