"""Deployment files from the Jinja2 templates shipped in dike_slurm.templates."""

from __future__ import annotations

import re
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from dike_slurm.errors import InputError

if TYPE_CHECKING:  # jinja2, the parsers and the policies load when a file is rendered, not with the CLI
    from jinja2 import Environment

    from dike_slurm.config import Config
    from dike_slurm.policies.base import Policy, PolicyParams

RENDER_KINDS = ("systemd", "timer", "cron", "slurm-conf")
_TEMPLATE_OF = {
    "systemd": "dike-slurm.service.j2",
    "timer": "dike-slurm.timer.j2",
    "cron": "cron.j2",
    "slurm-conf": "slurm-conf.j2",
}
# Paths and names go into unit files and crontabs verbatim: no spaces, quotes, `%` or `$`.
_PLAIN_PATH = re.compile(r"^[A-Za-z0-9_./+@:-]+$")
_USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
DEFAULT_SWITCH_WAIT_S = 300  # Slurm's own max_switch_wait


def _load_template(name: str) -> str:
    return resources.files("dike_slurm.templates").joinpath(name).read_text(encoding="utf-8")


def _environment() -> Environment:
    from jinja2 import Environment, FunctionLoader, StrictUndefined

    return Environment(
        loader=FunctionLoader(_load_template),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def _plain(path: Path | str, what: str) -> str:
    text = str(path)
    if not _PLAIN_PATH.match(text):
        raise InputError(f"{what} {text!r} has characters a unit file or crontab would misread; use a plain path")
    return text


def _policy(config: Config) -> tuple[Policy, PolicyParams]:
    from dike_slurm.registry import default_registry

    policy = default_registry().create(config.engine.policy)
    return policy, config.policy_params(policy.name)


def _switch_wait_s(policy: Policy, params: PolicyParams) -> int:
    """The longest Switches wait the policy asks for (the max_switch_wait it needs); Slurm's default if none."""
    wait = policy.switch_wait_s(params)
    return DEFAULT_SWITCH_WAIT_S if wait is None else int(wait)


def _leaves(config: Config, prefix: str) -> list[dict[str, str]]:
    from dike_slurm.parsing.hostlists import compress_hostlist
    from dike_slurm.parsing.slurm_conf import parse_topology_conf

    path = config.slurm.topology_conf
    if path is None and config.slurm.slurm_conf is not None:
        beside = config.slurm.slurm_conf.parent / "topology.conf"
        path = beside if beside.is_file() else None
    if path is None:
        return []
    try:
        topology = parse_topology_conf(path.read_text(encoding="utf-8"), source=str(path))
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", source=str(path)) from None
    return [
        {"nodes": compress_hostlist(topology.switches[leaf].nodes), "feature": f"{prefix}{leaf}"}
        for leaf in topology.leaves
    ]


def render(kind: str, config: Config, config_path: Path, *, user: str = "dike-slurm", oneshot: bool = False) -> str:
    """The text of one deployment file for this configuration."""
    if kind not in _TEMPLATE_OF:
        raise InputError(f"unknown render kind {kind!r} (known: {', '.join(RENDER_KINDS)})")
    if not _USER_NAME.match(user):
        raise InputError(f"not a plain user name: {user!r}")
    state_db = config.engine.state_db
    lock_file = config.engine.lock_file or Path(f"{state_db}.lock")
    writable = sorted({_plain(state_db.parent, "state_db folder"), _plain(lock_file.parent, "lock_file folder")}
                      | ({_plain(config.engine.metrics_file.parent, "metrics_file folder")}
                         if config.engine.metrics_file is not None else set()))
    policy, params = _policy(config)
    prefix = policy.leaf_feature_prefix(params)
    interval_s = int(round(config.engine.interval_s))
    minutes = max(1, round(config.engine.interval_s / 60))
    context = {
        "policy": config.engine.policy,
        "user": user,
        "oneshot": oneshot,
        "unit_name": "dike-slurm-cycle" if oneshot else "dike-slurm",
        "config_path": _plain(config_path, "config path"),
        "executable": f"{_plain(sys.executable, 'python')} -m dike_slurm",
        "writable": writable,
        "interval_s": interval_s,
        "minutes": minutes,
        "schedule": "* * * * *" if minutes == 1 else f"*/{minutes} * * * *",
        "lock_file": _plain(lock_file, "lock_file"),
        "wait_s": _switch_wait_s(policy, params),
        "leaves": _leaves(config, prefix) if kind == "slurm-conf" else [],
        "feature_prefix": prefix,
    }
    return _environment().get_template(_TEMPLATE_OF[kind]).render(**context)
