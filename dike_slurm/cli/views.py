"""What the read-only commands show, as plain dicts: one source for the tables and for `--json`.

Pure: a cycle plan, the state store's records and the configuration in, rows out. The keys are
the documented JSON schema (docs/engine.md, "Scripting: --json"); the tables show the same values.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dike_slurm.cycle.apply import CycleReport
    from dike_slurm.slurm.backends.base import ClusterState
    from dike_slurm.domain.fields import JobField
    from dike_slurm.domain.model import Job, Placement
    from dike_slurm.cycle.plan import CyclePlan, JobPlan, PlannedWrite
    from dike_slurm.domain.decisions import PriorInForce
    from dike_slurm.domain.service_prior import Prediction
    from dike_slurm.store.state import AuditEntry, CycleSummary, JobMemory, OwnedField

STATES = ("PENDING", "RUNNING", "SUSPENDED")  # as squeue prints them


def utc(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def placement_text(placement: Placement | None) -> str:
    """A constraint as Slurm's fields (`Switches=1@300s Features=leaf_s1`), `-` for none."""
    if placement is None:
        return "-"
    parts = []
    if placement.max_switches:
        wait = f"@{placement.switches_wait_s}s" if placement.switches_wait_s is not None else ""
        parts.append(f"Switches={placement.max_switches}{wait}")
    if placement.features:
        parts.append(f"Features={placement.features}")
    if placement.exclude_nodes:
        parts.append("ExcNodeList=" + ",".join(placement.exclude_nodes))
    if placement.require_nodes:
        parts.append("ReqNodeList=" + ",".join(placement.require_nodes))
    return " ".join(parts) or "-"


def _strategy_writes(job_plan: JobPlan, field_name: str) -> bool:
    return any(k.value == field_name for w in job_plan.writes for k, _ in w.update.values)


def job_row(job_plan: JobPlan, field_name: str, memory: JobMemory | None,
            expected: Prediction | None = None) -> dict[str, Any]:
    """One managed (or in-scope but exempt) job as `queue` and `status` show it; `expected`: the
    policy's service prior for it."""
    from dike_slurm.domain.model import JobState

    job = job_plan.job
    pending = job.state is JobState.PENDING
    # A running job's priority is rewritten only when its level changes: otherwise nothing is planned.
    planned = job_plan.value_wanted if pending or _strategy_writes(job_plan, field_name) else None
    if job_plan.outside_window or not job_plan.managed or any(f.value == field_name for f in job_plan.hands_off):
        planned = None  # beyond the head window (the value is handed back), exempt, or left to the site
    return {
        "job": job.display_id,
        "job_id": job.job_id,
        "name": job.name,
        "user": job.user,
        "account": job.account,
        "partition": job.partition,
        "state": job.state.value,
        "gpus": job.gpus,
        "nodes": job.num_nodes,
        "level": job_plan.level,
        "attained_gpu_hours": round(job.attained_gpu_s / 3600, 3),
        "counted_gpu_hours": round(job.counted_gpu_s / 3600, 3),
        "priority_field": field_name,
        "priority_now": job_plan.value_now,
        "priority_planned": planned,
        "beyond_head_window": job_plan.outside_window,
        "placement_now": placement_text(job.placement),
        "placement_planned": placement_text(job_plan.placement_wanted) if pending else None,
        "managed": job_plan.managed,
        "note": job_plan.note or ("" if job_plan.managed else "not managed"),
        "slurm_reason": job.slurm_reason,
        "reason": job_plan.reason,
        "last_decision": memory.reason if memory is not None else None,
        # 6 decimals: a few seconds on one GPU is 0.001 GPU-h, and 3 would print a short prior as 0
        "expected_gpu_hours": round(expected.gpu_s / 3600, 6) if expected is not None else None,
        "expected_from": expected_source(expected) if expected is not None else None,
    }


def prior_row(prior: PriorInForce | None) -> dict[str, Any] | None:
    """The service prior in force (its measured power, the trust in its run times, its weight), or None."""
    if prior is None:
        return None
    return {"power": round(prior.power, 4), "trust": round(prior.trust, 4), "weight": prior.weight,
            "finished_jobs": prior.jobs, "never_ran_jobs": prior.not_run, "text": prior.describe()}


def expected_source(prediction: Prediction) -> dict[str, Any]:
    """Where a prediction came from: its group (this job's own values) and how many finished jobs
    it holds; never another user's job ids or names."""
    return {"group": dict(zip(prediction.group, prediction.values)), "finished_jobs": prediction.count,
            "own_jobs_only": prediction.own, "text": prediction.describe()}


def outside_row(job: Job, field_name: str) -> dict[str, Any]:
    """An active job outside the engine's scope: Slurm's values only."""
    return {
        "job": job.display_id, "job_id": job.job_id, "name": job.name, "user": job.user, "account": job.account,
        "partition": job.partition, "state": job.state.value, "gpus": job.gpus, "nodes": job.num_nodes,
        "level": None, "attained_gpu_hours": None, "counted_gpu_hours": None, "priority_field": field_name,
        "priority_now": None, "priority_planned": None, "beyond_head_window": False,
        "placement_now": placement_text(job.placement),
        "placement_planned": None, "managed": False, "note": "outside the engine's scope",
        "slurm_reason": job.slurm_reason, "reason": "",
        "last_decision": None, "expected_gpu_hours": None, "expected_from": None,
    }


def published_rows(cluster: ClusterState, key: JobField, in_scope: Callable[[Job], bool]) -> list[dict[str, Any]]:
    """Every job Slurm shows the viewer, with the engine's numbers as it published them in the
    job's AdminComment (level, attained service at its last write) and the value Slurm holds; what
    only the engine's state knows (planned values, reasons, the prior) stays None. The rows of
    `queue` and `status` for a user PrivateData=jobs restricts (cli/visibility.py)."""
    from dike_slurm.domain.admin_comment import published
    from dike_slurm.cycle.reconcile import strategy_now

    rows = []
    for job in sorted(cluster.jobs, key=lambda j: j.job_id):
        if not in_scope(job):
            rows.append(outside_row(job, key.value))
            continue
        mine = published(cluster.admin_comments.get(job.job_id, ""))
        hours = mine.attained_gpu_hours if mine is not None else None
        rows.append(outside_row(job, key.value) | {
            "level": mine.level if mine is not None else None, "attained_gpu_hours": hours, "counted_gpu_hours": hours,
            "priority_now": strategy_now(key, job, cluster, {})[0], "managed": True,
            "note": "published by the engine (AdminComment)" if mine is not None else "no level published yet",
        })
    return rows


def queue_rows(
    plan: CyclePlan,
    field_name: str,
    memory: dict[int, JobMemory],
    *,
    users: Iterable[str] = (),
    accounts: Iterable[str] = (),
    partitions: Iterable[str] = (),
    states: Iterable[str] = (),
    include_outside: bool = True,
) -> list[dict[str, Any]]:
    """Every active job (in the engine's order: level, then planned priority), filtered as squeue
    filters (`matching`)."""
    ordered = sorted(plan.jobs, key=lambda p: (p.level if p.level is not None else 99, -(p.value_wanted or 0),
                                                p.job.job_id))
    rows = [job_row(p, field_name, memory.get(p.job.job_id), plan.expected.get(p.job.job_id)) for p in ordered]
    if include_outside:
        rows += [outside_row(j, field_name) for j in sorted(plan.outside, key=lambda j: j.job_id)]
    return matching(rows, users=users, accounts=accounts, partitions=partitions, states=states)


def matching(rows: list[dict[str, Any]], *, users: Iterable[str] = (), accounts: Iterable[str] = (),
             partitions: Iterable[str] = (), states: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The rows squeue's filters keep: a list option keeps the jobs matching any of its values; a
    job of several partitions matches each of them."""
    users, accounts, partitions = set(users), set(accounts), set(partitions)
    states = {s.upper() for s in states}
    return [
        row for row in rows
        if (not users or row["user"] in users)
        and (not accounts or row["account"] in accounts)
        and (not partitions or partitions & set(row["partition"].split(",")))
        and (not states or row["state"] in states)
    ]


def audit_row(entry: AuditEntry) -> dict[str, Any]:
    return {
        "id": entry.id, "at": entry.at, "time": utc(entry.at), "cycle": entry.cycle, "job_id": entry.job_id,
        "user": entry.user, "action": entry.action, "change": entry.change, "command": entry.command, "undo": entry.undo,
        "ok": entry.ok, "message": entry.message, "reason": entry.reason,
    }


def cycle_row(cycle: CycleSummary | None) -> dict[str, Any] | None:
    if cycle is None:
        return None
    return {
        "started": cycle.started, "time": utc(cycle.started), "seconds": round(cycle.seconds, 3),
        "policy": cycle.policy, "applied": cycle.applied, "jobs": cycle.jobs, "managed": cycle.managed,
        "writes": cycle.writes, "errors": cycle.errors, "slurm_calls": cycle.slurm_calls, "note": cycle.note,
    }


def owned_rows(owned: dict) -> list[dict[str, Any]]:
    from dike_slurm.cycle.field_values import describe_value

    mine: Iterable[OwnedField] = owned.values()
    return [{"field": o.field.value, "written": describe_value(o.written), "original": describe_value(o.original),
             "written_at": o.written_at} for o in mine]


def write_row(write: PlannedWrite, job_plan: JobPlan | None, result: str | None) -> dict[str, Any]:
    """One planned (or written) update: the job, each field from what Slurm held to the new value."""
    from dike_slurm.cycle.apply import field_changes
    from dike_slurm.cycle.field_values import describe_value

    job = job_plan.job if job_plan is not None else None
    return {
        "job": job.display_id if job is not None else str(write.job_id),
        "job_id": write.job_id,
        "user": job.user if job is not None else None,
        "state": job.state.value if job is not None else None,
        "level": job_plan.level if job_plan is not None else None,
        "changes": [{"field": k.value, "old": describe_value(old), "new": describe_value(new)}
                    for k, old, new in field_changes(write)],
        "released": [f.value for f in write.restores],
        "reason": write.reason,
        "result": result,
    }


def cycle_document(report: CycleReport) -> dict[str, Any]:
    """`run --once --json`: what the cycle planned or wrote."""
    plan = report.plan
    jobs = {p.job.job_id: p for p in plan.jobs}
    outcome = {id(w): o for w, o in report.outcomes}

    def result(write: PlannedWrite) -> str | None:
        if not report.applied:
            return None
        done = outcome.get(id(write))
        return "not run" if done is None else "ok" if done.ok else done.message

    return {
        "applied": report.applied,
        "time": plan.time,
        "policy": plan.policy,
        "strategy": plan.strategy,
        "jobs": len(plan.jobs),
        "managed": sum(1 for p in plan.jobs if p.managed),
        "out_of_scope": plan.out_of_scope,
        "writes": [write_row(w, jobs.get(w.job_id), result(w)) for w in plan.writes],
        "requeues": [{"job_id": r.job_id, "reason": r.reason, "result": "ok" if o.ok else o.message}
                     for r, o in report.requeued],
        "preemptions": [{"job_id": o.room.job_id, "outcome": o.outcome, "why": o.why} for o in plan.room_outcomes],
        "errors": report.errors,
        "denied": report.denied or None,
        "slurm_calls": report.slurm_calls,
        "seconds": round(report.seconds, 3),
        "notes": list(plan.notes + report.notes)
        + [f"sacct rows skipped: {count} x {reason}" for reason, count in plan.accounting_skipped.items()],
    }
