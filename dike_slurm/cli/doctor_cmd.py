"""`dike-slurm doctor`: check a site's Slurm for what the engine needs, and say what to change.

Read-only: `scontrol --version`, `squeue --json` (its format), `scontrol show config`, and
`sacctmgr show user` (AdminLevel), through the configured slurm.bin_dir and slurm_conf.
"""

from __future__ import annotations

import getpass
import os
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional


from dike_slurm.cli import app, console
from dike_slurm.cli.common import CONFIG_OPTION, JSON_OPTION, emit_json, load, safe, say_source, table
from dike_slurm.errors import DikeError

OK, WARN, FAIL = "ok", "warn", "FAIL"
GRANT_ADVICE = ("run as root or SlurmUser, or: sacctmgr -i modify user USER set AdminLevel=Admin "
                "(AdminLevel=Operator is enough with engine.admin_comment = false; docs/deployment.md)")


@dataclass(frozen=True)
class Check:
    name: str
    found: str
    verdict: str  # OK, WARN or FAIL
    advice: str = ""  # what to change (slurm.conf line or command)


def parse_show_config(text: str) -> dict[str, str]:
    """`Key = value` lines of `scontrol show config`."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and " " not in key.strip():
            values[key.strip()] = value.strip()
    return values


def _option(parameters: str, name: str) -> str | None:
    for item in parameters.split(","):
        key, _, value = item.strip().partition("=")
        if key == name:
            return value
    return None


def diagnose(
    *,
    version: str,
    json_format: Check,
    config: dict[str, str],
    admin_level: str | None,
    is_root: bool,
    strategy: str,
    max_consolidation_wait_s: float | None,
    preemption: bool,
    admin_comment: bool = True,
) -> list[Check]:
    """Every check, from what Slurm printed (pure: unit-tested on recorded output)."""
    checks = [Check("Slurm version", version or "unknown", OK if version else FAIL,
                    "" if version else "scontrol --version printed nothing: is this Slurm?"), json_format]
    if is_root or admin_level == "Administrator" or (admin_level == "Operator" and not admin_comment):
        checks.append(Check("privileges", "root" if is_root else f"AdminLevel={admin_level}", OK))
    else:
        checks.append(Check("privileges", f"AdminLevel={admin_level or 'None'}", FAIL, GRANT_ADVICE))
    priority = config.get("PriorityType", "")
    if strategy == "site_factor" and priority != "priority/multifactor":
        checks.append(Check("PriorityType", priority or "unset", FAIL,
                            "PriorityType=priority/multifactor (SiteFactor is a term of the multifactor priority)"))
    else:
        checks.append(Check("PriorityType", priority or "unset", OK))
    if strategy == "site_factor":
        plugin = config.get("PrioritySiteFactorPlugin", "(null)")
        checks.append(Check("PrioritySiteFactorPlugin", plugin,
                            OK if plugin in ("(null)", "", "site_factor/none") else WARN,
                            "" if plugin in ("(null)", "", "site_factor/none") else
                            "a site factor plugin recomputes SiteFactor and overwrites the engine's; "
                            "use PrioritySiteFactorPlugin=site_factor/none or priority_strategy=\"priority\""))
    topology = config.get("TopologyPlugin", "")
    if "tree" in topology:
        checks.append(Check("TopologyPlugin", topology, OK))
    else:
        checks.append(Check("TopologyPlugin", topology or "unset", WARN,
                            "TopologyPlugin=topology/tree and a topology.conf: without it Switches= has no effect"))
    scheduler = config.get("SchedulerParameters", "")
    wait = _option(scheduler, "max_switch_wait")
    wait_s = int(wait) if wait and wait.isdigit() else 300
    if max_consolidation_wait_s is not None and max_consolidation_wait_s > wait_s:
        checks.append(Check("max_switch_wait", f"{wait_s} s", WARN,
                            f"SchedulerParameters=...,max_switch_wait={int(max_consolidation_wait_s)} "
                            f"(Slurm caps Switches=N@WAIT at {wait_s} s)"))
    else:
        checks.append(Check("max_switch_wait", f"{wait_s} s" + ("" if wait else " (default)"), OK))
    checks.append(Check("SchedulerParameters", scheduler or "(default)", OK))
    requeue = config.get("JobRequeue", "")
    if preemption and requeue != "1":
        checks.append(Check("JobRequeue", requeue or "unset", WARN,
                            "JobRequeue=1, or jobs must opt in with --requeue (preemption requeues only those)"))
    else:
        checks.append(Check("JobRequeue", requeue or "unset", OK))
    return checks


def _run(argv: list[str], env: dict[str, str], timeout: float) -> str:
    from dike_slurm.backends.cli import run_command

    result = run_command(argv, env, timeout)
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or [f"exit {result.returncode}"])[-1]
        raise DikeError(f"{shlex.join(argv)} failed: {detail}")
    return result.stdout


def gather(config, user: str, runner: Callable[[list[str], dict[str, str], float], str] = _run) -> list[Check]:
    """Ask Slurm (read-only) and diagnose."""
    import json

    from dike_slurm.slurm_formats import FormatError, detect, slurm_release

    slurm = config.slurm
    command = (lambda name: str(slurm.bin_dir / name)) if slurm.bin_dir else (lambda name: name)
    env = dict(os.environ)
    env["TZ"] = "UTC"
    if slurm.slurm_conf is not None:
        env["SLURM_CONF"] = str(slurm.slurm_conf)
    timeout = slurm.command_timeout_s
    version = runner([command("scontrol"), "--version"], env, timeout).strip()
    queue_text = runner([command("squeue"), "--json"], env, timeout)
    try:
        document = json.loads(queue_text)
        if not isinstance(document, dict):
            raise ValueError("not an object")
        fmt = detect(document, "squeue --json")
        plugin = document["meta"]["plugin"]
        name = plugin.get("data_parser") or plugin.get("type")
        json_check = Check("JSON format", f"{name} ({fmt.family}, Slurm {slurm_release(document)})", OK)
    except FormatError as exc:
        json_check = Check("JSON format", "unknown", FAIL, str(exc))
    except ValueError as exc:
        json_check = Check("JSON format", "unreadable", FAIL, f"squeue --json: {exc}")
    show_config = parse_show_config(runner([command("scontrol"), "show", "config"], env, timeout))
    admin_level = None
    try:
        rows = runner([command("sacctmgr"), "-n", "-P", "show", "user", user, "format=user,adminlevel"], env, timeout)
        admin_level = next((line.split("|")[1] for line in rows.splitlines() if "|" in line), None)
    except DikeError:
        admin_level = None
    from dike_slurm.registry import default_registry

    policy = default_registry().create(config.engine.policy)
    params = config.policy_params(policy.name)
    wait = policy.switch_wait_s(params)
    return diagnose(
        version=version, json_format=json_check, config=show_config, admin_level=admin_level,
        is_root=os.geteuid() == 0, strategy=config.engine.priority_strategy,
        max_consolidation_wait_s=float(wait) if wait is not None else None,
        preemption=policy.requeue_min_run_s(params) is not None,  # the hook a preemptive policy declares
        admin_comment=config.engine.admin_comment,
    )


@app.command("doctor")
def doctor_command(
    config_path: Optional[Path] = CONFIG_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Check this site's Slurm for what the engine needs; print what to change in slurm.conf (exit 1 on a FAIL)."""
    config, source = load(config_path)
    say_source(source, as_json)
    checks = gather(config, getpass.getuser())
    failed = [c.name for c in checks if c.verdict == FAIL]
    if as_json:
        emit_json("doctor", source, {"checks": [asdict(c) for c in checks], "failed": failed})
    else:
        result = table("dike-slurm doctor", ["check", "found", "verdict", "what to change"])
        for check in checks:
            style = {"ok": "green", "warn": "yellow", "FAIL": "bold red"}[check.verdict]
            result.add_row(safe(check.name), safe(check.found), f"[{style}]{check.verdict}[/]", safe(check.advice))
        console.print(result)
    if failed:
        raise DikeError(f"doctor: {len(failed)} check(s) failed: {', '.join(failed)}")
