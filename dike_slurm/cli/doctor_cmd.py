"""`dike-slurm doctor`: check a site's Slurm for what the engine needs, and say what to change.

Read-only: `scontrol --version`, `squeue --json` (its format), `scontrol show config`, `scontrol
show partition -o` and `sacctmgr -nP show qos format=Name,Priority` (the site's own priority, as
the engine reads it, and the names the scope may use), `sacctmgr -nP show account format=Account`
(slurmdbd answers; the accounts) and `sacctmgr show user` (AdminLevel), through the configured
slurm.bin_dir and slurm_conf. The engine's own files are checked for the user running doctor.
"""

from __future__ import annotations

import difflib
import getpass
import math
import os
import re
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from dike_slurm.cli.group import app, console
from dike_slurm.cli.common import CONFIG_OPTION, JSON_OPTION, emit_json, load, safe, say_source, table
from dike_slurm.errors import DikeError
from dike_slurm.parsing.slurm_options import parse_show_config, scheduler_parameters
from dike_slurm.parsing.tres import tracks_gpus

if TYPE_CHECKING:  # the model loads when doctor runs, not with the CLI
    from dike_slurm.domain.slurm_priority import SlurmPriorityModel

OK, WARN, FAIL = "ok", "warn", "FAIL"
GRANT_ADVICE = ("run as root or SlurmUser, or: sacctmgr -i modify user {user} set AdminLevel=Admin "
                "(AdminLevel=Operator is enough with engine.admin_comment = false; docs/deployment.md)")
SHOW_ACCOUNTS_ARGV = ("-nP", "show", "account", "format=Account")


@dataclass(frozen=True)
class Check:
    name: str
    found: str
    verdict: str  # OK, WARN or FAIL
    advice: str = ""  # what to change (slurm.conf line or command)


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
    priority_model: SlurmPriorityModel | None = None,
    priority_error: str = "",
    priority_mode: str = "tiers",
    priority_span: int = 1_000_000,
    user: str = "dike-slurm",
    slurmdbd_error: str = "",
    store_exposure: str = "",
    backend: str = "cli",
) -> list[Check]:
    """Every check, from what Slurm printed (pure: unit-tested on recorded output).

    `priority_model`: the site's own priority as the engine reads it (None with `priority_error`
    when it could not be read); `priority_mode` and `priority_span` are the engine's settings;
    `user` runs the engine; `slurmdbd_error`: what sacctmgr said when slurmdbd did not answer;
    `store_exposure`: how every user can read the state file ("" when they cannot).
    """
    checks = [Check("Slurm version", version or "unknown", OK if version else FAIL,
                    "" if version else "scontrol --version printed nothing: is this Slurm?"), json_format]
    if slurmdbd_error:
        checks.append(Check("slurmdbd", f"not answering: {slurmdbd_error}", FAIL,
                            "start slurmdbd and check AccountingStorageHost (the engine reads usage and finished "
                            "jobs with sacct, and the QOS and users with sacctmgr)"))
    else:
        checks.append(Check("slurmdbd", "answers", OK))
    if is_root or admin_level == "Administrator" or (admin_level == "Operator" and not admin_comment):
        checks.append(Check("privileges", f"root ({user})" if is_root else f"{user}: AdminLevel={admin_level}", OK))
    elif slurmdbd_error:
        checks.append(Check("privileges", f"{user}: unknown (slurmdbd did not answer)", WARN,
                            GRANT_ADVICE.format(user=user)))
    else:
        checks.append(Check("privileges", f"{user}: AdminLevel={admin_level or 'None'}", FAIL,
                            GRANT_ADVICE.format(user=user)))
    private = config.get("privatedata", "none")
    if private.lower() not in ("", "none") and store_exposure:
        checks.append(Check("state file privacy", f"PrivateData={private}, but {store_exposure}", WARN,
                            "chmod 600 the state file (and its -wal and -shm), or 640 with engine.state_group: it "
                            "holds every user's levels and reasons"))
    if "jobs" in {item.strip().lower() for item in private.split(",")} and not admin_comment:
        checks.append(Check("users' levels", f"PrivateData={private}, engine.admin_comment = false", WARN,
                            "engine.admin_comment = true: Slurm hides other users' jobs, so a user's `dike-slurm "
                            "queue` and `explain` read the engine's levels from the AdminComment it writes on each "
                            "job (docs/deployment.md, \"Who can read what\"); without it they see none"))
    tracked = [tres.strip() for tres in config.get("accountingstoragetres", "").split(",") if tres.strip()]
    if tracks_gpus(",".join(tracked)):
        checks.append(Check("AccountingStorageTRES", "gres/gpu tracked", OK))
    else:
        # One cause, two symptoms: pyslurm 25.11 takes a job's and a node's GPUs from the tracked
        # TRES too (Job.gpus, Node.allocated_gres are empty without it: issue 34), so the pyslurm
        # backend refuses to read such a cluster (the same test: parsing.tres.tracks_gpus).
        pyslurm_too = (", and the pyslurm backend cannot count any job's or node's GPUs: it refuses to read the "
                       "cluster" if backend == "pyslurm" else "")
        checks.append(Check("AccountingStorageTRES", ",".join(tracked) or "unset", FAIL,
                            f"AccountingStorageTRES={','.join([*tracked, 'gres/gpu'])} (without gres/gpu, sacct "
                            f"shows finished runs with 0 GPUs and every job's attained service is 0{pyslurm_too})"))
    priority = config.get("prioritytype", "")
    if strategy in ("site_factor", "nice") and priority != "priority/multifactor":
        field = "SiteFactor" if strategy == "site_factor" else "Nice"
        checks.append(Check("PriorityType", priority or "unset", FAIL,
                            f"PriorityType=priority/multifactor ({field} is a term of the multifactor priority: "
                            f"under {priority or 'this PriorityType'} what the engine writes has no effect)"))
    else:
        checks.append(Check("PriorityType", priority or "unset", OK))
    if priority == "priority/multifactor":
        checks += priority_checks(priority_model, priority_error, priority_mode, priority_span, strategy,
                                  config.get("priorityflags", ""))
    if strategy == "site_factor":
        plugin = config.get("prioritysitefactorplugin", "")
        checks.append(Check("PrioritySiteFactorPlugin", plugin or "unset",
                            OK if plugin in ("", "site_factor/none") else WARN,
                            "" if plugin in ("", "site_factor/none") else
                            "a site factor plugin recomputes SiteFactor and overwrites the engine's; "
                            "use PrioritySiteFactorPlugin=site_factor/none or priority_strategy=\"priority\""))
    topology = config.get("topologyplugin", "")
    if "tree" in topology:
        checks.append(Check("TopologyPlugin", topology, OK))
    else:
        checks.append(Check("TopologyPlugin", topology or "unset", WARN,
                            "TopologyPlugin=topology/tree and a topology.conf: without it Switches= has no effect"))
    scheduler = config.get("schedulerparameters", "")
    wait = scheduler_parameters(scheduler).get("max_switch_wait")
    wait_s = int(wait) if wait and wait.isdigit() else 300
    if max_consolidation_wait_s is not None and max_consolidation_wait_s > wait_s:
        checks.append(Check("max_switch_wait", f"{wait_s} s", WARN,
                            f"SchedulerParameters=...,max_switch_wait={int(max_consolidation_wait_s)} "
                            f"(Slurm caps Switches=N@WAIT at {wait_s} s)"))
    else:
        checks.append(Check("max_switch_wait", f"{wait_s} s" + ("" if wait else " (default)"), OK))
    checks.append(Check("SchedulerParameters", scheduler or "(default)", OK))
    requeue = config.get("jobrequeue", "")
    if preemption and requeue != "1":
        checks.append(Check("JobRequeue", requeue or "unset", WARN,
                            "JobRequeue=1, or jobs must opt in with --requeue (preemption requeues only those)"))
    else:
        checks.append(Check("JobRequeue", requeue or "unset", OK))
    return checks


def scope_checks(scope, known: dict[str, list[str] | None], unknown_why: dict[str, str]) -> list[Check]:
    """Each scope list (partitions, accounts, QOS) against the names the cluster has: a name it
    lacks matches no job, so the engine quietly manages nothing there. `known[kind]` is None when it
    could not be read (`unknown_why[kind]` says why)."""
    checks = []
    for kind, names in (("partitions", scope.partitions), ("accounts", scope.accounts), ("qos", scope.qos)):
        name = f"scope.{kind}"
        if not names:
            checks.append(Check(name, "all (empty list)", OK))
            continue
        cluster = known.get(kind)
        if cluster is None:
            checks.append(Check(name, f"{', '.join(names)}: cannot check ({unknown_why.get(kind, 'not read')})", WARN))
            continue
        missing = [n for n in names if n not in cluster]
        if not missing:
            checks.append(Check(name, ", ".join(names), OK))
            continue
        hints = []
        for wrong in missing:
            close = difflib.get_close_matches(wrong, cluster, n=1, cutoff=0.6)
            hints.append(f"{wrong!r}: did you mean {close[0]!r}?" if close else f"{wrong!r}: no close name")
        checks.append(Check(name, f"{', '.join(map(repr, missing))} not in this cluster (it has: "
                                  f"{', '.join(sorted(cluster)) or 'none'})", FAIL,
                            "; ".join(hints) + " (a name the cluster lacks matches no job)"))
    return checks


def _writable(path: Path) -> tuple[bool, str]:
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


def path_checks(config, user: str) -> list[Check]:
    """The files the engine writes (state, lock, metrics), for `user`, who runs this check."""
    engine = config.engine
    files = [("engine.state_db", engine.state_db),
             ("engine.lock_file", engine.lock_file or Path(f"{engine.state_db}.lock"))]
    if engine.metrics_file is not None:
        files.append(("engine.metrics_file", engine.metrics_file))
    checks = []
    for name, path in files:
        ok, why = _writable(path)
        checks.append(Check(name, f"{path}: {why} by {user}", OK if ok else FAIL,
                            "" if ok else f"install -d -o {user} -g {user} {path.parent} (as root), and run doctor as "
                                          f"the user the service runs as (sudo -u SERVICE_USER dike-slurm doctor)"))
    return checks


def _num(value: float) -> str:
    """A weight or priority as Slurm prints it: an integer without an exponent where it is one."""
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def qos_weight_for(model: SlurmPriorityModel, step: float) -> int | None:
    """The PriorityWeightQOS that makes the site's smallest QOS step weigh `step` (None: no tiers)."""
    from dike_slurm.domain.slurm_priority import tier_gap

    gap = tier_gap(model)
    if gap is None or not model.weights.qos:
        return None
    return int(math.ceil(step * model.weights.qos / gap))


def priority_checks(model: SlurmPriorityModel | None, error: str, mode: str, configured_span: int, strategy: str,
                    flags: str = "") -> list[Check]:
    """The site's weights (a line per factor), its QOS and partition tiers, the span each
    `engine.priority_mode` gives Dike, and whether Dike can lift a job over a QOS tier."""
    from dike_slurm.parsing.durations import format_duration
    from dike_slurm.domain.slurm_priority import PRIORITY_MAX, PRIORITY_MODES, effective_span, tier_gap

    if model is None:
        if not error:
            return []
        # the engine needs them unless it writes over every tier; then they are only shown here
        return [Check("site priority", "unreadable", WARN if mode == "over" else FAIL,
                      f"{error} (the engine reads it when it starts, to size its span)")]
    w = model.weights
    checks = [
        Check("PriorityWeightAge", f"{_num(w.age)} (all of it once a job waited PriorityMaxAge "
              f"{format_duration(w.max_age_s)})", OK),
        Check("PriorityWeightFairshare",
              f"{_num(w.fairshare)} ({'Fair Tree' if w.fair_tree else 'classic fair share, NO_FAIR_TREE'})", OK),
        Check("PriorityWeightJobSize", f"{_num(w.job_size)}" + (" (PriorityFavorSmall)" if w.favor_small else ""), OK),
        Check("PriorityWeightPartition", f"{_num(w.partition)}", OK),
        Check("PriorityWeightQOS", f"{_num(w.qos)}", OK),
        Check("PriorityWeightAssoc", f"{_num(w.assoc)}", OK),
    ]
    if w.tres:
        checks += [Check(f"PriorityWeightTRES {name}", f"{_num(weight)}", OK) for name, weight in w.tres.items()]
    else:
        checks.append(Check("PriorityWeightTRES", "none", OK))
    others = w.others_total
    checks.append(Check("site factors but QOS", f"{_num(others)} at most (each factor at its full weight)", OK))
    not_normal = sorted(f for f in (x.strip().upper() for x in flags.split(",")) if f.startswith("NO_NORMAL"))
    if not_normal:
        checks.append(Check("PriorityFlags", ",".join(not_normal), WARN,
                            "the spans below assume Slurm's normalized factors (each at most 1); with "
                            f"{', '.join(not_normal)} a factor can weigh more than its weight"))

    gap = tier_gap(model)
    by_priority = sorted(model.qos_priority.items(), key=lambda item: (item[1], item[0]))
    if gap is None:
        why = "PriorityWeightQOS=0" if not w.qos else "no QOS has a priority"
        listed = ", ".join(f"{name} {p}" for name, p in by_priority) or "no QOS table (no slurmdbd)"
        checks.append(Check("QOS tiers", f"none: {why} (QOS priorities: {listed})", OK))
    else:
        tiers = ", ".join(f"{name} {_num(w.qos * model.qos_factor(name))}" for name, _ in by_priority)
        checks.append(Check("QOS tiers", f"{tiers} (smallest step {_num(gap)})", OK))
    part_tiers = sorted({p.tier for p in model.partitions.values()})
    if len(part_tiers) > 1:
        listed = ", ".join(f"{name} {p.tier}" for name, p in sorted(model.partitions.items()))
        checks.append(Check("partition PriorityTier", listed, OK,
                            "Slurm tries a higher PriorityTier first, whatever the priority: Dike orders inside each"))

    spans = {m: effective_span(m, configured_span, model) for m in PRIORITY_MODES}
    span = spans[mode]
    checks.append(Check("Dike's span", ", ".join(f"{m} 1..{s}" for m, s in spans.items())
                        + f"; engine.priority_mode = {mode}: 1..{span}", OK))
    if gap is not None:
        room = others + configured_span + 1  # a step that leaves Dike its whole configured span
        weight = qos_weight_for(model, room)
        to_keep = f"PriorityWeightQOS={weight}" if weight is not None else ""
        if weight is not None and others + weight + configured_span > PRIORITY_MAX:  # the top QOS adds all of it
            to_keep += " (too much for Slurm's 32-bit priority: lower engine.priority_span too)"
        if others >= gap:
            checks.append(Check(
                "QOS tiers kept", f"no: the site's own factors (up to {_num(others)}) exceed the smallest QOS step "
                f"({_num(gap)}), so a job of a lower QOS can pass a higher one even without Dike"
                + (f"; tiers mode leaves Dike 1..{span}: it changes no order" if mode == "tiers" else ""), WARN,
                f"{to_keep}: each QOS step then weighs {_num(room)} (the other factors + Dike's span + 1)"))
        elif span - 1 + others >= gap:
            checks.append(Check(
                "QOS tiers kept", f"no: engine.priority_mode = {mode} writes SiteFactor up to {span}, which with "
                f"the site's own factors (up to {_num(others)}) can lift a job over a QOS step of {_num(gap)}", WARN,
                f'engine.priority_mode = "tiers" (Dike then writes 1..{spans["tiers"]} inside each tier), '
                f"or {to_keep} to keep the span {configured_span} in tiers mode"))
        elif mode == "tiers" and span < 1000:
            checks.append(Check(
                "QOS tiers kept", f"yes, but only {span} SiteFactor values fit under the smallest QOS step "
                f"({_num(gap)}) after the site's own factors (up to {_num(others)}): those weigh more than Dike", WARN,
                f"{to_keep}: Dike then writes 1..{configured_span} inside each tier"))
        else:
            checks.append(Check(
                "QOS tiers kept", f"yes: Dike's 1..{span} and the site's own factors (up to {_num(others)}) stay under "
                f"the smallest QOS step ({_num(gap)})", OK))
        if strategy == "priority":
            checks.append(Check(
                "priority_strategy", "priority: Priority= pins each managed job, so its QOS no longer counts", WARN,
                'priority_strategy = "site_factor" keeps the QOS tiers of managed jobs'))
    return checks


def failure(argv: list[str], returncode: int, stderr: str) -> DikeError:
    """A failed command as one line: its last two messages, without the `NAME: error:` prefix
    (sacctmgr names the host and port first, then what it was doing)."""
    lines = [re.sub(r"^\S+: error: ", "", line.strip()) for line in stderr.splitlines() if line.strip()]
    return DikeError(f"{shlex.join(argv)} failed: {'; '.join(lines[-2:]) or f'exit {returncode}'}")


def _run(argv: list[str], env: dict[str, str], timeout: float) -> str:
    from dike_slurm.slurm.backends.commands import run_command

    result = run_command(argv, env, timeout)
    if result.returncode != 0:
        raise failure(argv, result.returncode, result.stderr)
    return result.stdout


def gather(config, user: str, runner: Callable[[list[str], dict[str, str], float], str] = _run) -> list[Check]:
    """Ask Slurm (read-only) and diagnose."""
    import json

    from dike_slurm.slurm.formats import FormatError, detect, slurm_release
    from dike_slurm.slurm.backends.site_priority import SHOW_PARTITIONS_ARGV, SHOW_QOS_ARGV, partitions_from_scontrol, qos_from_sacctmgr

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
    config_text = runner([command("scontrol"), "show", "config"], env, timeout)
    show_config = parse_show_config(config_text)
    priority_model, priority_error = None, ""
    if show_config.get("prioritytype") == "priority/multifactor":
        from dike_slurm.slurm.backends.site_priority import read_priority_model

        try:
            priority_model = read_priority_model(lambda argv: runner(list(argv), env, timeout), command, config_text)
        except DikeError as exc:
            priority_error = str(exc)
    # the scope's names: the partitions and QOS the site's priority holds, read only where it was not
    known: dict[str, list[str] | None] = {}
    unknown_why: dict[str, str] = {}
    if priority_model is not None:
        known["partitions"] = list(priority_model.partitions)
    else:
        try:
            partitions = runner([command("scontrol"), *SHOW_PARTITIONS_ARGV], env, timeout)
            known["partitions"] = [name for name, _, _ in partitions_from_scontrol(partitions)[0]]
        except DikeError as exc:
            unknown_why["partitions"] = str(exc)
    slurmdbd_error = ""
    try:
        accounts = runner([command("sacctmgr"), *SHOW_ACCOUNTS_ARGV], env, timeout)
        known["accounts"] = [line.strip() for line in accounts.splitlines() if line.strip()]
    except DikeError as exc:
        slurmdbd_error = str(exc)
        unknown_why["accounts"] = unknown_why["qos"] = "slurmdbd did not answer"
    if priority_model is not None and priority_model.qos_priority:
        known["qos"] = list(priority_model.qos_priority)
    elif not slurmdbd_error:
        try:
            known["qos"] = list(qos_from_sacctmgr(runner([command("sacctmgr"), *SHOW_QOS_ARGV], env, timeout)))
        except DikeError as exc:
            unknown_why["qos"] = str(exc)
    admin_level = None
    if not slurmdbd_error:
        try:
            rows = runner([command("sacctmgr"), "-n", "-P", "show", "user", user, "format=user,adminlevel"], env,
                          timeout)
            admin_level = next((line.split("|")[1] for line in rows.splitlines() if "|" in line), None)
        except DikeError:
            admin_level = None
    from dike_slurm.registry import default_registry

    policy = default_registry().create(config.engine.policy)
    params = config.policy_params(policy.name)
    wait = policy.switch_wait_s(params)
    checks = diagnose(
        version=version, json_format=json_check, config=show_config, admin_level=admin_level,
        is_root=os.geteuid() == 0, strategy=config.engine.priority_strategy,
        max_consolidation_wait_s=float(wait) if wait is not None else None,
        preemption=policy.requeue_min_run_s(params) is not None,  # the hook a preemptive policy declares
        admin_comment=config.engine.admin_comment, priority_model=priority_model, priority_error=priority_error,
        priority_mode=config.engine.priority_mode, priority_span=config.engine.priority_span, user=user,
        slurmdbd_error=slurmdbd_error, store_exposure=store_exposure(config.engine.state_db),
        backend=config.slurm.backend,
    )
    return checks + scope_checks(config.scope, known, unknown_why) + path_checks(config, user)


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
