"""Deployment files from the Jinja2 templates shipped in dike_slurm.templates."""

from __future__ import annotations

import math
import re
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dike_slurm.ops.alerting import ALERTING_KINDS, grafana_dashboard, prometheus_rule_values
from dike_slurm.ops.deploy_rules import (
    INSTALL_COMMAND, PLAIN_PATH, WARN, deployment_checks, failures, lock_path, source_checkout, state_directory)
from dike_slurm.errors import InputError

if TYPE_CHECKING:  # jinja2, the parsers and the policies load when a file is rendered, not with the CLI
    from jinja2 import Environment

    from dike_slurm.config import Config
    from dike_slurm.ops.doctor_checks import Check
    from dike_slurm.policies.base import Policy, PolicyParams

RENDER_KINDS = ("systemd", "timer", "cron", "slurm-conf", *ALERTING_KINDS)
_TEMPLATE_OF = {
    "systemd": "dike-slurm.service.j2",
    "timer": "dike-slurm.timer.j2",
    "cron": "cron.j2",
    "slurm-conf": "slurm-conf.j2",
}
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
    if not PLAIN_PATH.match(text):
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
    from dike_slurm.slurm.slurm_conf import parse_topology_conf

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


# The QOS tiers assumed where neither a qos.txt beside slurm.conf nor [replay] qos_priority gives the
# site's: one tier above the default QOS (sacctmgr -i add qos urgent set Priority=1).
ASSUMED_QOS = {"normal": 0, "urgent": 1}
_TRES_SPELLING = {"cpu": "CPU", "mem": "Mem", "node": "Node", "billing": "Billing", "energy": "Energy"}


def _tres_name(name: str) -> str:
    kind, sep, rest = name.partition("/")
    return f"{kind.upper()}/{rest}" if sep else _TRES_SPELLING.get(name, name)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _round_up(value: float, to: int = 1000) -> int:
    return int(math.ceil(value / to) * to)


def _priority(config: Config) -> dict[str, Any]:
    """The priority lines of slurm.conf: PriorityType=priority/multifactor, the weights (the site's
    slurm.conf's where it sets any, else `slurm_priority.TYPICAL_WEIGHTS`) and a PriorityWeightQOS
    whose smallest QOS step is larger than every other factor plus Dike's whole span, so that in
    `engine.priority_mode = "tiers"` Dike writes 1..engine.priority_span and no job passes a QOS tier."""
    from dike_slurm.slurm.slurm_conf import QOS_FILE, parse_slurm_conf
    from dike_slurm.domain.slurm_priority import (
        OPTION_NAMES,
        PRIORITY_MAX,
        TYPICAL_WEIGHTS,
        build_model,
        effective_span,
        parse_qos_dump,
        tier_gap,
    )

    options: dict[str, str] = {}
    weights_from, unread = "typical", ""
    qos, qos_from = None, ""
    slurm_conf = config.slurm.slurm_conf
    if slurm_conf is not None and slurm_conf.is_file():
        try:
            conf = parse_slurm_conf(slurm_conf.read_text(encoding="utf-8", errors="replace"), source=str(slurm_conf))
        except (OSError, InputError) as exc:  # said in the output: the typical weights are proposed instead
            unread = f"{slurm_conf}: {exc.strerror if isinstance(exc, OSError) else exc}"
        else:
            if any(key.startswith("priorityweight") and key != "priorityweightqos" for key in conf.options):
                options = {k: v for k, v in conf.options.items() if k.startswith("priority")}
                weights_from = str(slurm_conf)
        qos_file = slurm_conf.parent / QOS_FILE
        if qos_file.is_file():
            try:
                qos = parse_qos_dump(qos_file.read_text(encoding="utf-8", errors="replace"), source=str(qos_file))
            except OSError as exc:
                raise InputError(f"cannot read: {exc.strerror}", source=str(qos_file)) from None
            qos_from = str(qos_file)
    if not options:
        options = {k.lower(): v for k, _, v in (line.partition("=") for line in TYPICAL_WEIGHTS)}
    if not qos or len(set(qos.values())) < 2:
        if config.replay.qos_priority and len(set(config.replay.qos_priority.values())) > 1:
            qos, qos_from = dict(config.replay.qos_priority), "[replay] qos_priority"
        else:
            qos, qos_from = dict(ASSUMED_QOS), ""
    span = config.engine.priority_span
    unit = build_model({**options, "priorityweightqos": "1"}, (), 1, 1, qos, "render")  # the QOS weight set to 1
    weights = unit.weights
    others = weights.others_total
    ratio = tier_gap(unit) or 1.0  # the smallest step as a share of PriorityWeightQOS
    qos_weight = _round_up((others + span + 1) / ratio)
    model = build_model({**options, "priorityweightqos": str(qos_weight)}, (), 1, 1, qos, "render")
    lines = ["PriorityType=priority/multifactor"]
    for key, value in options.items():
        if key in ("prioritytype", "priorityweightqos") or not value:
            continue
        if key == "priorityweighttres":
            value = ",".join(f"{_tres_name(name)}={_num(weight)}" for name, weight in weights.tres.items())
        lines.append(f"{OPTION_NAMES.get(key, _SPELLING.get(key, key))}={value}")
    top = others + qos_weight + span  # the top QOS adds the whole weight
    return {
        "lines": lines,
        "weights_from": weights_from,
        "unread": unread,
        "qos_weight": qos_weight,
        "qos_from": qos_from,
        "qos": ", ".join(f"{name}={priority}" for name, priority in sorted(qos.items(), key=lambda item: item[1])),
        "step_share": f"{ratio:.6g}",
        "others": _num(others),
        "step": _num(others + span + 1),
        "span": span,
        "tiers_span": effective_span("tiers", span, model),
        "mode": config.engine.priority_mode,
        "mode_span": effective_span(config.engine.priority_mode, span, model),
        "top": _num(top),
        "overflow": top > PRIORITY_MAX,
    }


# slurm.conf's spelling of the priority options other than the weights (OPTION_NAMES has those)
_SPELLING = {name.lower(): name for name in (
    "PriorityWeightTRES", "PriorityMaxAge", "PriorityDecayHalfLife", "PriorityFavorSmall", "PriorityFlags",
    "PriorityCalcPeriod", "PriorityUsageResetPeriod", "PriorityParameters", "PrioritySiteFactorPlugin",
    "PrioritySiteFactorParameters")}


def console_script() -> Path:
    """The `dike-slurm` script of the environment this Python runs in (what pip installed)."""
    script = Path(sys.prefix) / "bin" / "dike-slurm"
    if not script.is_file():
        raise InputError(f"no dike-slurm script in {sys.prefix}/bin: install a release into a prefix of its own "
                         f"({INSTALL_COMMAND}) and render from there")
    return script


def _folders(config: Config, user: str, lock_file: Path) -> dict[str, Any]:
    """What the unit opens for writing: the state folder (systemd's StateDirectory when it is a
    folder of /var/lib), the lock file's folder and the metrics file's own folder, and the commands
    that prepare the folders systemd does not create. A state folder that also holds the metrics
    file (allowed where the admin makes it: deploy_rules.metrics_placement) is made 0755, so that
    node-exporter reads the metrics; the state file in it is 0600 whatever its folder."""
    state_folder = config.engine.state_db.parent
    metrics_file = config.engine.metrics_file
    state_dir = state_directory(config)
    metrics_folder = metrics_file.parent if metrics_file else None
    writable, prepare = [], []
    for folder, what, mode in ((state_folder, "state_db folder", "0755" if metrics_folder == state_folder else "0750"),
                               (lock_file.parent, "lock_file folder", "0750"),
                               (metrics_folder, "metrics_file folder", "0755")):
        if folder is None or (folder == state_folder and state_dir):
            continue
        path = _plain(folder, what)
        if path not in writable:
            writable.append(path)
            prepare.append(f"install -d -o {user} -g {user} -m {mode} {path}")
    return {"state_directory": state_dir, "writable": writable, "prepare": prepare,
            "metrics_file": _plain(metrics_file, "metrics_file") if metrics_file else ""}


def render(kind: str, config: Config, config_path: Path, *, user: str = "dike-slurm", oneshot: bool = False) -> str:
    """The text of one deployment file for this configuration (`render_checked` also gives the warnings)."""
    return render_checked(kind, config, config_path, user=user, oneshot=oneshot)[0]


def render_checked(kind: str, config: Config, config_path: Path, *, user: str = "dike-slurm",
                   oneshot: bool = False) -> tuple[str, list[Check]]:
    """The text of one deployment file, and the warnings of the deployment rules (deploy_rules,
    which `doctor` and `config check` apply too) for the files that run the engine (systemd, cron).
    Every FAIL of those rules is refused, all of them in one error."""
    if kind == "prometheus-rules":
        return _environment().get_template("prometheus-rules.yml.j2").render(
            rules=prometheus_rule_values(config), interval_s=f"{config.engine.interval_s:g}",
            config_path=config_path), []
    if kind == "grafana":
        return grafana_dashboard(config), []
    if kind not in _TEMPLATE_OF:
        raise InputError(f"unknown render kind {kind!r} (known: {', '.join(RENDER_KINDS)})")
    if not _USER_NAME.match(user):
        raise InputError(f"not a plain user name: {user!r}")
    warnings: list[Check] = []
    if kind in ("systemd", "cron"):  # they run the engine: the rules of its files and its install
        checks = deployment_checks(config, config_path)
        refused = failures(checks)
        if refused:
            raise InputError(f"render {kind}: {refused}")
        warnings = [c for c in checks if c.verdict == WARN]
    lock_file = lock_path(config)
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
        "interval_s": interval_s,
        "minutes": minutes,
        "schedule": "* * * * *" if minutes == 1 else f"*/{minutes} * * * *",
        "lock_file": _plain(lock_file, "lock_file"),
        "wait_s": _switch_wait_s(policy, params),
        "leaves": _leaves(config, prefix) if kind == "slurm-conf" else [],
        "feature_prefix": prefix,
        "priority": _priority(config) if kind == "slurm-conf" else {},
        "warnings": [f"{c.name}: {c.found}. What to do: {c.advice}" for c in warnings],
    }
    if kind in ("systemd", "cron"):  # they run the engine: the installed script, and (a unit) its folders
        context["executable"] = _plain(console_script(), "console script")
    if kind == "systemd":
        context |= {"source_checkout": source_checkout() or "", **_folders(config, user, lock_file)}
    return _environment().get_template(_TEMPLATE_OF[kind]).render(**context), warnings
