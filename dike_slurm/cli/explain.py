"""`dike-slurm explain JOB`: one job's level, priority and constraint, and its record, as a document.

A job is found among the active jobs by its id (`123`) or, for an array task, by `123_4` only;
`123_4` never falls back to job 123. A job that left the queue but has records in the state
store is "finished"; one the engine knows nothing of is "unknown" (the command exits 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dike_slurm.engine import Engine
    from dike_slurm.model import Job


def _matches(job: Job, wanted: tuple[int, int | None]) -> bool:
    head, task = wanted
    if task is not None:
        return job.array_job_id == head and job.array_task_id == task
    return job.job_id == head


def explain(engine: Engine, wanted: tuple[int, int | None], text: str) -> dict[str, Any]:
    """The `explain --json` document (docs/engine.md): status active | outside-scope | finished | unknown."""
    from dike_slurm.cli.views import audit_row, job_row, outside_row, owned_rows

    plan = engine.plan()
    field = engine.strategy_field.value
    found = next((p for p in plan.jobs if _matches(p.job, wanted)), None)
    outside = next((j for j in plan.outside if _matches(j, wanted)), None)
    params = engine.params.model_dump(mode="json")
    document: dict[str, Any] = {"query": text, "policy": engine.policy.name, "policy_parameters": params}
    if found is not None:
        job_id = found.job.job_id
        memory = engine.store.job(job_id)
        document |= {"status": "active", "job": job_row(found, field, memory, plan.expected.get(job_id)) | {
            "run_count": found.job.run_count,
            "forgiven_gpu_hours": round(found.job.attained_at_promotion_gpu_s / 3600, 3),
            "left_to_user": found.hands_off_reason or None,
            "next_writes": [", ".join(f"{k.value}={_value(v)}" for k, v in w.update.values) or "(release)"
                            for w in found.writes],
            "write_reasons": [w.reason for w in found.writes],
            "head_window": plan.window or None,
        }}
    elif outside is not None:
        job_id = outside.job_id
        document |= {"status": "outside-scope", "job": outside_row(outside, field)}
    elif wanted[1] is None:  # a plain id not in the queue: finished, if the engine has a record of it
        job_id = wanted[0]
        document |= {"status": "finished", "job": None}
    else:  # an array task the queue does not show: its own job id is unknown, so there is no record to look up
        return document | {"status": "unknown", "job": None, "owned": [], "audit": []}
    owned = owned_rows(engine.store.owned().get(job_id, {}))
    audit = [audit_row(e) for e in engine.store.audit_log(job_id, limit=20)]
    if document["status"] == "finished" and not audit and not owned and engine.store.job(job_id) is None:
        document["status"] = "unknown"
    return document | {"job_id": job_id, "owned": owned, "audit": audit}


def _value(value: object) -> str:
    from dike_slurm.reconcile import describe_value

    return describe_value(value)  # type: ignore[arg-type]


def explain_lines(document: dict[str, Any]) -> list[str]:
    """The document for a person."""
    status, job, query = document["status"], document["job"], document["query"]
    if status == "unknown":
        return [f"job {query}: not in the queue and not in the engine's state store (unknown, or finished "
                "before the engine saw it)"]
    lines = []
    if status == "finished":
        lines.append(f"job {query}: finished (no longer in the queue); the engine's record of it:")
    elif status == "outside-scope":
        lines.append(f"job {job['job']}: user {job['user']}, account {job['account']}, partition "
                     f"{job['partition']}, {job['state']}: outside the engine's scope ([scope] in the "
                     "configuration): the engine neither ranks nor writes it")
    else:
        lines += [
            f"job {job['job']}: user {job['user']}, account {job['account']}, partition {job['partition']}, "
            f"{job['state']}, {job['gpus']} GPU(s) on {job['nodes']} node(s)",
            f"  attained service: {job['attained_gpu_hours']:.2f} GPU-hours over {job['run_count']} run(s)"
            + (f", {job['forgiven_gpu_hours']:.2f} forgiven by a promotion" if job["forgiven_gpu_hours"] else ""),
        ]
        if job["slurm_reason"]:
            lines.append(f"  Slurm keeps it waiting: {job['slurm_reason']} (squeue's REASON)")
        if not job["managed"]:
            lines.append(f"  not managed: {job['note']}")
        if job["expected_from"] is not None:
            lines.append(f"  expected service: {job['expected_from']['text']} (the service prior: finished jobs "
                         "in the look-back window, shrunk toward coarser groups)")
        lines.append(f"  level {job['level']}: {job['reason']}")
        params = ", ".join(f"{k}={v}" for k, v in document["policy_parameters"].items()
                           if k not in ("comm_rules",))
        lines.append(f"  policy {document['policy']}: {params}")
        planned = job["priority_planned"]
        if job["beyond_head_window"]:
            lines += [
                f"  beyond the head window: the engine orders the first {job['head_window']} pending jobs of each "
                "partition in the policy's order (what Slurm's scheduler looks at, SchedulerParameters "
                "bf_max_job_test, with a margin: engine.head_window);",
                f"  this job stands further down, so Slurm's own factors order it ({job['priority_field']} back to "
                "what it was before the engine). That changes nothing Slurm does now: its passes reach this "
                "far only once the jobs ahead start, and the engine orders it as soon as it comes within the window.",
            ]
        else:
            lines.append(f"  {job['priority_field']}: now {job['priority_now']}, "
                         f"planned {planned if planned is not None else 'nothing (a running job keeps its value)'}")
        lines.append(f"  constraint now: {job['placement_now']}; wanted: {job['placement_planned'] or 'none'}")
        if job["left_to_user"]:
            lines.append(f"  left to the user: {job['left_to_user']}")
        for change, reason in zip(job["next_writes"], job["write_reasons"]):
            lines.append(f"  next cycle writes: {change} ({reason})")
        if job["managed"] and not job["next_writes"] and not job["beyond_head_window"]:
            lines.append("  next cycle writes nothing: Slurm already holds what the policy wants")
    for owned in document["owned"]:
        lines.append(f"  engine owns {owned['field']}: wrote {owned['written']}, original {owned['original']}")
    if document["audit"]:
        lines.append("audit (newest last):")
        for entry in document["audit"]:
            if entry["action"] == "preemption":  # an outcome, not a write: landed, wasted or gone, and why
                lines += [f"  {entry['time']} preemption for it {entry['change']}: {entry['message']}",
                          f"      {entry['reason']}"]
                continue
            outcome = "ok" if entry["ok"] else f"FAILED: {entry['message']}"
            lines += [f"  {entry['time']} {entry['action']}: {entry['change']} [{outcome}]",
                      f"      command: {entry['command']}", f"      undo:    {entry['undo']}"]
    return lines
