"""The one requeue guard: the live engine and the replay check a policy's requeues with it.

A requeue is carried out only for a running job that may be preempted (Slurm says it is
requeueable and the site's opt-in rule lets it be preempted), whose current run is at least the
policy's declared minimum, and within the per-cycle rate limit. The requeues made for one blocked
job (`Requeue.for_job`) are kept or refused together, and a refused group's pin (the ReqNodeList
that would send the freed nodes to the blocked job) is dropped with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dike_slurm.domain.decisions import Decisions, Requeue, SetPlacement
from dike_slurm.domain.model import Job
from dike_slurm.policies.base import Policy, PolicyParams


UNLIMITED = 2**31 - 1


@dataclass(frozen=True)
class RequeueLimits:
    """What the guard enforces, whatever the policy asks."""

    min_run_s: float  # the policy's declared shortest preemptible run (Policy.requeue_min_run_s)
    max_per_cycle: int  # engine.max_requeues_per_cycle
    preempts: bool = True  # any requeue may pass: the policy preempts (a minimum run) and max_per_cycle > 0


def requeue_groups(requeues) -> list[list[Requeue]]:
    """The requeues by the blocked job they make room for (a requeue for none is a group alone)."""
    groups: dict[object, list[Requeue]] = {}
    for requeue in requeues:
        key = requeue.for_job if requeue.for_job is not None else ("alone", requeue.job_id)
        groups.setdefault(key, []).append(requeue)
    return list(groups.values())


def requeue_limits(policy: Policy, params: PolicyParams, max_per_cycle: int) -> RequeueLimits:
    """The limits for this policy: its declared minimum run and the site's rate limit.

    A replay-only policy (an oracle: `Policy.live` is False) has no live engine whose rate limit
    the replay should mirror; as an upper bound it is held only to its own parameters.
    """
    min_run_s = policy.requeue_min_run_s(params)
    limit = max_per_cycle if policy.live else UNLIMITED
    return RequeueLimits(min_run_s=min_run_s or 0.0, max_per_cycle=limit, preempts=min_run_s is not None and limit > 0)


def _refusal(requeue: Requeue, job: Job | None, now: float, limits: RequeueLimits) -> str | None:
    if job is None:
        return "not a managed running job"
    if not job.requeueable:
        return "may not be preempted (not requeueable, or not opted in)"
    if job.start_time is None or now - job.start_time < limits.min_run_s:
        return f"ran less than the policy's minimum run of {limits.min_run_s:g}s"
    return None


def guard_requeues(
    decisions: Decisions, running: Mapping[int, Job], now: float, limits: RequeueLimits
) -> tuple[Decisions, list[str]]:
    """The decisions with refused requeues (and the pins made for them) removed, and one note per
    refused requeue. `running`: the running jobs the caller manages, by id."""
    if not decisions.requeues:
        return decisions, []
    kept: list[Requeue] = []
    refused_for: set[int] = set()
    notes: list[str] = []
    for group in requeue_groups(decisions.requeues):
        key = group[0].for_job
        why = None
        for requeue in group:
            why = _refusal(requeue, running.get(requeue.job_id), now, limits)
            if why is not None:
                why = f"job {requeue.job_id} {why}" if len(group) > 1 else why
                break
        if why is None and len(kept) + len(group) > limits.max_per_cycle:
            why = f"max_requeues_per_cycle={limits.max_per_cycle} reached"
        if why is None:
            kept.extend(group)
            continue
        if key is not None:
            refused_for.add(key)
        notes.extend(f"requeue of job {r.job_id} refused: {why}" for r in group)
    if not notes:
        return decisions, []
    placements = tuple(
        p for p in decisions.placements
        if not (isinstance(p, SetPlacement) and p.job_id in refused_for and p.placement.require_nodes)
    )
    # a job stays protected unless the requeues freeing its room were refused (a job protected for
    # an earlier cycle's room keeps it)
    protected = tuple(job_id for job_id in decisions.protected if job_id not in refused_for)
    return Decisions(decisions.priorities, placements, tuple(kept), protected, decisions.expected), notes
