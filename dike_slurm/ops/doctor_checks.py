"""`dike-slurm doctor`'s checks of what Slurm printed (pure: unit-tested on recorded output)."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dike_slurm.parsing.slurm_options import scheduler_parameters
from dike_slurm.parsing.tres import tracks_gpus

if TYPE_CHECKING:
    from dike_slurm.domain.slurm_priority import PriorityWeights, SlurmPriorityModel

OK, WARN, FAIL = "ok", "warn", "FAIL"
GRANT_ADVICE = ("run as root or SlurmUser, or: sacctmgr -i modify user {user} set AdminLevel=Admin "
                "(AdminLevel=Operator is enough with engine.admin_comment = false; docs/deployment.md)")


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
    """Every check, from what Slurm printed.

    `config`: `scontrol show config` (keys lower-case); `priority_model`: the site's own priority
    as the engine reads it (None with `priority_error` when it could not be read);
    `priority_mode` and `priority_span` are the engine's settings; `user` runs the engine;
    `slurmdbd_error`: what sacctmgr said when slurmdbd did not answer; `store_exposure`: how
    every user can read the state file ("" when they cannot).
    """
    checks = [Check("Slurm version", version or "unknown", OK if version else FAIL,
                    "" if version else "scontrol --version printed nothing: is this Slurm?"), json_format]
    checks += access_checks(admin_level, is_root, admin_comment, user, slurmdbd_error)
    checks += privacy_checks(config, admin_comment, store_exposure)
    checks.append(gpu_accounting_check(config, backend))
    checks += priority_type_checks(config, strategy)
    if config.get("prioritytype", "") == "priority/multifactor":
        checks += priority_checks(priority_model, priority_error, priority_mode, priority_span, strategy,
                                  config.get("priorityflags", ""))
    if strategy == "site_factor":
        checks.append(site_factor_plugin_check(config))
    checks += topology_checks(config, max_consolidation_wait_s)
    requeue = config.get("jobrequeue", "")
    if preemption and requeue != "1":
        checks.append(Check("JobRequeue", requeue or "unset", WARN,
                            "JobRequeue=1, or jobs must opt in with --requeue (preemption requeues only those)"))
    else:
        checks.append(Check("JobRequeue", requeue or "unset", OK))
    return checks


def access_checks(admin_level: str | None, is_root: bool, admin_comment: bool, user: str,
                  slurmdbd_error: str) -> list[Check]:
    """Whether slurmdbd answers, and whether `user` may write what the engine writes."""
    if slurmdbd_error:
        checks = [Check("slurmdbd", f"not answering: {slurmdbd_error}", FAIL,
                        "start slurmdbd and check AccountingStorageHost (the engine reads usage and finished "
                        "jobs with sacct, and the QOS and users with sacctmgr)")]
    else:
        checks = [Check("slurmdbd", "answers", OK)]
    if is_root or admin_level == "Administrator" or (admin_level == "Operator" and not admin_comment):
        checks.append(Check("privileges", f"root ({user})" if is_root else f"{user}: AdminLevel={admin_level}", OK))
    elif slurmdbd_error:
        checks.append(Check("privileges", f"{user}: unknown (slurmdbd did not answer)", WARN,
                            GRANT_ADVICE.format(user=user)))
    else:
        checks.append(Check("privileges", f"{user}: AdminLevel={admin_level or 'None'}", FAIL,
                            GRANT_ADVICE.format(user=user)))
    return checks


def privacy_checks(config: Mapping[str, str], admin_comment: bool, store_exposure: str) -> list[Check]:
    """What PrivateData hides, against what the state file and the AdminComment show."""
    checks = []
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
    return checks


def gpu_accounting_check(config: Mapping[str, str], backend: str) -> Check:
    """Whether accounting tracks GPUs (gres/gpu in AccountingStorageTRES)."""
    tracked = [tres.strip() for tres in config.get("accountingstoragetres", "").split(",") if tres.strip()]
    if tracks_gpus(",".join(tracked)):
        return Check("AccountingStorageTRES", "gres/gpu tracked", OK)
    # One cause, two symptoms: pyslurm 25.11 takes a job's and a node's GPUs from the tracked TRES
    # too (Job.gpus and Node.allocated_gres are empty without it), so the pyslurm backend refuses
    # to read such a cluster (the same test: parsing.tres.tracks_gpus).
    pyslurm_too = (", and the pyslurm backend cannot count any job's or node's GPUs: it refuses to read the "
                   "cluster" if backend == "pyslurm" else "")
    return Check("AccountingStorageTRES", ",".join(tracked) or "unset", FAIL,
                 f"AccountingStorageTRES={','.join([*tracked, 'gres/gpu'])} (without gres/gpu, sacct "
                 f"shows finished runs with 0 GPUs and every job's attained service is 0{pyslurm_too})")


def priority_type_checks(config: Mapping[str, str], strategy: str) -> list[Check]:
    """Whether what the engine writes (`strategy`) counts under the site's PriorityType."""
    priority = config.get("prioritytype", "")
    if strategy in ("site_factor", "nice") and priority != "priority/multifactor":
        field = "SiteFactor" if strategy == "site_factor" else "Nice"
        return [Check("PriorityType", priority or "unset", FAIL,
                      f"PriorityType=priority/multifactor ({field} is a term of the multifactor priority: "
                      f"under {priority or 'this PriorityType'} what the engine writes has no effect)")]
    return [Check("PriorityType", priority or "unset", OK)]


def site_factor_plugin_check(config: Mapping[str, str]) -> Check:
    """A site factor plugin would overwrite the SiteFactor the engine writes."""
    plugin = config.get("prioritysitefactorplugin", "")
    if plugin in ("", "site_factor/none"):
        return Check("PrioritySiteFactorPlugin", plugin or "unset", OK, "")
    return Check("PrioritySiteFactorPlugin", plugin, WARN,
                 "a site factor plugin recomputes SiteFactor and overwrites the engine's; "
                 "use PrioritySiteFactorPlugin=site_factor/none or priority_strategy=\"priority\"")


def topology_checks(config: Mapping[str, str], max_consolidation_wait_s: float | None) -> list[Check]:
    """The topology plugin Switches= needs, and the cap Slurm puts on a Switches wait."""
    topology = config.get("topologyplugin", "")
    if "tree" in topology:
        checks = [Check("TopologyPlugin", topology, OK)]
    else:
        checks = [Check("TopologyPlugin", topology or "unset", WARN,
                        "TopologyPlugin=topology/tree and a topology.conf: without it Switches= has no effect")]
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
    if model is None:
        if not error:
            return []
        # the engine needs them unless it writes over every tier; then they are only shown here
        return [Check("site priority", "unreadable", WARN if mode == "over" else FAIL,
                      f"{error} (the engine reads it when it starts, to size its span)")]
    return weight_checks(model.weights, flags) + tier_checks(model) + span_checks(model, mode, configured_span,
                                                                                 strategy)


def weight_checks(w: PriorityWeights, flags: str) -> list[Check]:
    """A line per PriorityWeight*, their sum but QOS, and the factors Slurm does not normalize."""
    from dike_slurm.parsing.durations import format_duration

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
    checks.append(Check("site factors but QOS", f"{_num(w.others_total)} at most (each factor at its full weight)", OK))
    not_normal = sorted(f for f in (x.strip().upper() for x in flags.split(",")) if f.startswith("NO_NORMAL"))
    if not_normal:
        checks.append(Check("PriorityFlags", ",".join(not_normal), WARN,
                            "the spans below assume Slurm's normalized factors (each at most 1); with "
                            f"{', '.join(not_normal)} a factor can weigh more than its weight"))
    return checks


def tier_checks(model: SlurmPriorityModel) -> list[Check]:
    """The site's QOS tiers (their weighted priorities) and partition PriorityTiers."""
    from dike_slurm.domain.slurm_priority import tier_gap

    w = model.weights
    gap = tier_gap(model)
    by_priority = sorted(model.qos_priority.items(), key=lambda item: (item[1], item[0]))
    if gap is None:
        why = "PriorityWeightQOS=0" if not w.qos else "no QOS has a priority"
        listed = ", ".join(f"{name} {p}" for name, p in by_priority) or "no QOS table (no slurmdbd)"
        checks = [Check("QOS tiers", f"none: {why} (QOS priorities: {listed})", OK)]
    else:
        tiers = ", ".join(f"{name} {_num(w.qos * model.qos_factor(name))}" for name, _ in by_priority)
        checks = [Check("QOS tiers", f"{tiers} (smallest step {_num(gap)})", OK)]
    part_tiers = sorted({p.tier for p in model.partitions.values()})
    if len(part_tiers) > 1:
        listed = ", ".join(f"{name} {p.tier}" for name, p in sorted(model.partitions.items()))
        checks.append(Check("partition PriorityTier", listed, OK,
                            "Slurm tries a higher PriorityTier first, whatever the priority: Dike orders inside each"))
    return checks


def span_checks(model: SlurmPriorityModel, mode: str, configured_span: int, strategy: str) -> list[Check]:
    """The span each priority mode leaves Dike, and whether the site's QOS tiers hold."""
    from dike_slurm.domain.slurm_priority import PRIORITY_MODES, effective_span, tier_gap

    spans = {m: effective_span(m, configured_span, model) for m in PRIORITY_MODES}
    span = spans[mode]
    checks = [Check("Dike's span", ", ".join(f"{m} 1..{s}" for m, s in spans.items())
                    + f"; engine.priority_mode = {mode}: 1..{span}", OK)]
    gap = tier_gap(model)
    if gap is None:
        return checks
    checks.append(tiers_kept_check(model, gap, mode, spans, configured_span))
    if strategy == "priority":
        checks.append(Check(
            "priority_strategy", "priority: Priority= pins each managed job, so its QOS no longer counts", WARN,
            'priority_strategy = "site_factor" keeps the QOS tiers of managed jobs'))
    return checks


def tiers_kept_check(model: SlurmPriorityModel, gap: float, mode: str, spans: Mapping[str, int],
                     configured_span: int) -> Check:
    """Whether Dike's span and the site's other factors stay under the smallest QOS step (`gap`)."""
    from dike_slurm.domain.slurm_priority import PRIORITY_MAX

    others, span = model.weights.others_total, spans[mode]
    room = others + configured_span + 1  # a step that leaves Dike its whole configured span
    weight = qos_weight_for(model, room)
    to_keep = f"PriorityWeightQOS={weight}" if weight is not None else ""
    if weight is not None and others + weight + configured_span > PRIORITY_MAX:  # the top QOS adds all of it
        to_keep += " (too much for Slurm's 32-bit priority: lower engine.priority_span too)"
    if others >= gap:
        return Check(
            "QOS tiers kept", f"no: the site's own factors (up to {_num(others)}) exceed the smallest QOS step "
            f"({_num(gap)}), so a job of a lower QOS can pass a higher one even without Dike"
            + (f"; tiers mode leaves Dike 1..{span}: it changes no order" if mode == "tiers" else ""), WARN,
            f"{to_keep}: each QOS step then weighs {_num(room)} (the other factors + Dike's span + 1)")
    if span - 1 + others >= gap:
        return Check(
            "QOS tiers kept", f"no: engine.priority_mode = {mode} writes SiteFactor up to {span}, which with "
            f"the site's own factors (up to {_num(others)}) can lift a job over a QOS step of {_num(gap)}", WARN,
            f'engine.priority_mode = "tiers" (Dike then writes 1..{spans["tiers"]} inside each tier), '
            f"or {to_keep} to keep the span {configured_span} in tiers mode")
    if mode == "tiers" and span < 1000:
        return Check(
            "QOS tiers kept", f"yes, but only {span} SiteFactor values fit under the smallest QOS step "
            f"({_num(gap)}) after the site's own factors (up to {_num(others)}): those weigh more than Dike", WARN,
            f"{to_keep}: Dike then writes 1..{configured_span} inside each tier")
    return Check(
        "QOS tiers kept", f"yes: Dike's 1..{span} and the site's own factors (up to {_num(others)}) stay under "
        f"the smallest QOS step ({_num(gap)})", OK)
