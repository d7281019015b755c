"""`dike-slurm explain JOB`: one job's level, priority and constraint, and its record, as a document.

A job is found among the active jobs by its id (`123`) or, for an array task, by `123_4` only;
`123_4` never falls back to job 123. A job that left the queue but has records in the state
store is "finished"; one the engine knows nothing of is "unknown" (the command exits 1).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from dike_slurm.domain.fields import JobField
from dike_slurm.domain.model import JobState

if TYPE_CHECKING:
    from dike_slurm.slurm.backends.base import ClusterState
    from dike_slurm.cycle.engine import CyclePlan, Engine
    from dike_slurm.domain.model import Job
    from dike_slurm.cycle.plan import JobPlan


def _matches(job: Job, wanted: tuple[int, int | None]) -> bool:
    head, task = wanted
    if task is not None:
        return job.array_job_id == head and job.array_task_id == task
    return job.job_id == head


def explain(engine: Engine, wanted: tuple[int, int | None], text: str) -> dict[str, Any]:
    """The `explain --json` document (docs/engine.md): status active | outside-scope | finished | unknown."""
    from dike_slurm.cli.views import audit_row, job_row, outside_row, owned_rows, prior_row

    plan = engine.plan()
    field = engine.strategy_field.value
    found = next((p for p in plan.jobs if _matches(p.job, wanted)), None)
    outside = next((j for j in plan.outside if _matches(j, wanted)), None)
    params = engine.params.model_dump(mode="json")
    document: dict[str, Any] = {"query": text, "policy": engine.policy.name, "policy_parameters": params,
                                "view": "engine"}
    document["expected_starts"], start = _expected_start(engine, plan, found.job if found is not None else outside)
    if found is not None:
        job_id = found.job.job_id
        memory = engine.store.job(job_id)
        left_to_site = JobField.SITE_FACTOR in found.hands_off
        document |= {"status": "active", "job": job_row(found, field, memory, plan.expected.get(job_id)) | {
            "run_count": found.job.run_count,
            "forgiven_gpu_hours": round(found.job.attained_at_promotion_gpu_s / 3600, 3),
            "left_to_user": (found.hands_off_reason or None) if not left_to_site else None,
            "left_to_site": found.hands_off_reason if left_to_site else None,
            "unused_by_slurm": found.priority_unused,
            "next_writes": [", ".join(f"{k.value}={_value(v)}" for k, v in w.update.values) or "(release)"
                            for w in found.writes],
            "write_reasons": [w.reason for w in found.writes],
            "head_window": plan.window or None,
            "tolerance": engine.config.engine.priority_tolerance,
            "billing": billing(engine, found.job),
        } | start, "service_prior": prior_row(plan.prior)}
        if found.job.state is JobState.PENDING and found.managed:
            document["standing"] = standing(plan, found)
            document["would_change"] = what_would_change(engine, plan, found)
    elif outside is not None:
        job_id = outside.job_id
        document |= {"status": "outside-scope", "job": outside_row(outside, field) | start}
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


def _expected_start(engine: Engine, plan: CyclePlan, job: Job | None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """`expected_starts` (what the simulation took; None unless the job is pending) and the job's
    start fields, for its row. The simulation runs for a pending job only."""
    from dike_slurm.cli.expected_start import forecast_row, safe_forecast, start_fields

    if job is None:
        return None, {}
    forecast, why_none = safe_forecast(engine, plan) if job.state is JobState.PENDING else (None, "")
    return forecast_row(forecast), start_fields(forecast, job.job_id, job.state.value, why_none)


def explain_published(engine: Engine, cluster: ClusterState, rows: list[dict[str, Any]],
                      wanted: tuple[int, int | None], text: str) -> dict[str, Any]:
    """The `explain --json` document for a viewer PrivateData=jobs restricts (cli/visibility.py):
    the job as Slurm shows it to them with the engine's published numbers (`rows`:
    views.published_rows of `cluster`), or "unknown" for any job Slurm does not show them, hidden
    or gone alike; the state store is not read."""
    document: dict[str, Any] = {"query": text, "policy": engine.policy.name,
                                "policy_parameters": engine.params.model_dump(mode="json"), "view": "published",
                                "owned": [], "audit": []}
    found = next((j for j in cluster.jobs if _matches(j, wanted)), None)
    if found is None:
        return document | {"status": "unknown", "job": None}
    from dike_slurm.cli.expected_start import PUBLISHED_NO_START, start_fields

    row = next(r for r in rows if r["job_id"] == found.job_id)
    row = row | start_fields(None, found.job_id, row["state"], PUBLISHED_NO_START)
    status = "active" if row["managed"] else "outside-scope"
    return document | {"status": status, "job_id": found.job_id, "job": row, "expected_starts": None}


def billing(engine: Engine, job: Job) -> dict[str, Any]:
    """What a GPU-second of the job is charged in its attained service and fair share:
    the weight of its run's GPU type under the site's TRESBillingWeights (the partition's, else
    slurm.conf's), or, pending, the weight of each type it may run on; 1 where the site weighs none."""
    from dike_slurm.slurm.usage import run_gpu_types

    model = engine.site_priority
    weighs = model.billing_of(job.partition) if model is not None else None
    set_by = None
    if model is not None and weighs is not None:
        own = model.partitions.get(job.partition)
        set_by = (f"partition {job.partition}'s TRESBillingWeights" if own is not None and own.billing is not None
                  else "the cluster's TRESBillingWeights")
    weight_of = model.gpu_weight if model is not None else (lambda _partition, _types: 1.0)
    if job.state is JobState.RUNNING:
        types = run_gpu_types(job.nodes, engine.node_types)
        return {"set_by": set_by, "run_gpu_types": list(types), "weight": weight_of(job.partition, types),
                "weights": {t: weight_of(job.partition, (t,)) for t in types}}
    usable = job.gpu_types or tuple(sorted({t for types in engine.node_types.values() for t in types}))
    return {"set_by": set_by, "run_gpu_types": None,
            "weight": None if usable else weight_of(job.partition, ()),  # untyped GPUs: one weight
            "weights": {t: weight_of(job.partition, (t,)) for t in usable}}


def _billing_line(charged: dict[str, Any]) -> str:
    why = (f"by {charged['set_by']}" if charged["set_by"] is not None
           else "the site weighs no GPU in TRESBillingWeights, so every GPU counts 1")
    if charged["run_gpu_types"] is not None:
        types = "/".join(charged["run_gpu_types"]) or "untyped"
        return f"  a GPU-hour of its run counts {charged['weight']:g} in its service and fair share ({types} GPUs, {why})"
    if not charged["weights"]:
        return (f"  a GPU-hour counts {charged['weight']:g} in its service and fair share once it runs (untyped GPUs, "
                f"{why})")
    each = ", ".join(f"{t} {w:g}" for t, w in charged["weights"].items())
    return (f"  a GPU-hour will count, by the type of the nodes it gets: {each} in its service and fair share "
            f"({why})")


def standing(plan: CyclePlan, mine: JobPlan) -> dict[str, Any]:
    """Where a pending job stands in its partition, in the order the engine writes (its planned
    value, else Slurm's; submit time between equals): its place and the jobs ahead, by why."""
    def value(p: JobPlan) -> int:
        return p.value_wanted if p.value_wanted is not None else p.value_now or 0

    queue = sorted((p for p in plan.jobs if p.job.state is JobState.PENDING and p.managed
                    and p.job.partition == mine.job.partition),
                   key=lambda p: (-value(p), p.job.submit_time, p.job.job_id))
    place = next(i for i, p in enumerate(queue) if p.job.job_id == mine.job.job_id)
    ahead = queue[:place]
    better = sum(1 for p in ahead if p.level is not None and mine.level is not None and p.level < mine.level)
    return {"partition": mine.job.partition, "place": place + 1, "pending": len(queue), "ahead": len(ahead),
            "ahead_at_a_better_level": better, "ahead_at_its_level": len(ahead) - better}


def what_would_change(engine: Engine, plan: CyclePlan, mine: JobPlan) -> list[str]:
    """What would move a pending job: a job ending, a promotion at a time, a preemption, or why none."""
    from dike_slurm.parsing.durations import format_duration

    job = mine.job
    running = [p for p in plan.jobs if p.job.state is JobState.RUNNING and p.job.partition == job.partition]
    out = [f"a running job ending: it needs {job.gpus} GPU(s) on {job.num_nodes} node(s), and {len(running)} "
           f"job(s) run in partition {job.partition}"]
    if mine.level:
        at = engine.policy.promotion_at(job, engine.params)
        out.append(f"a promotion to level 0 at {_utc(at)} UTC, in {format_duration(max(0.0, at - plan.time))}, "
                   "for waiting" if at is not None else f"no promotion: policy {engine.policy.name} promotes no "
                   "job for waiting with these parameters")
    if engine.policy.requeue_min_run_s(engine.params) is None:
        out.append(f"no preemption: policy {engine.policy.name} never preempts with these parameters")
        return out
    worse = [p for p in running if p.level is not None and mine.level is not None and p.level > mine.level]
    victims = [p for p in worse if p.job.requeueable]  # the engine's jobs: requeueable means opted in too
    gains = engine.policy.preemption_gains(engine.params, plan.expected)
    promising = [p for p in victims if gains is None or gains(job, p.job)]
    if promising:
        out.append(f"a preemption: {len(promising)} running job(s) of a worse level in its partition may be "
                   "requeued for it, once they have run their minimum")
    elif victims:
        out.append(f"no preemption: the {len(victims)} running job(s) of a worse level in its partition that may "
                   "be preempted promise no gain for it (its own user's jobs of the same name and size, or, with "
                   "preemption_gain, jobs not expected to run long enough longer)")
    else:
        out.append(f"no preemption: none of the {len(worse)} running job(s) of a worse level in its partition "
                   "may be preempted (a job opts in with the dike:preemptible comment tag, or runs in a partition "
                   "or QOS the site lists in engine.preemptible_*)" if worse else
                   "no preemption: no running job in its partition is at a worse level")
    return out


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at))


def _value(value: object) -> str:
    from dike_slurm.cycle.field_values import describe_value

    return describe_value(value)  # type: ignore[arg-type]


def explain_lines(document: dict[str, Any], verbose: bool = False) -> list[str]:
    """The document for a person; the policy's parameters with `verbose`."""
    status, job, query = document["status"], document["job"], document["query"]
    if document.get("view") == "published":
        return _published_lines(document, verbose)
    if status == "unknown" and document.get("note"):  # the store was not read: a finished job looks unknown
        return [f"job {query}: not in the queue; the engine's records of finished jobs are in its state store, "
                "which you cannot read"]
    if status == "unknown":
        return [f"job {query}: not in the queue and not in the engine's state store (unknown, or finished "
                "before the engine saw it)"]
    if status == "finished":
        lines = [f"job {query}: finished (no longer in the queue); the engine's record of it:"]
    elif status == "outside-scope":
        lines = [f"job {job['job']}: user {job['user']}, account {job['account']}, partition "
                 f"{job['partition']}, {job['state']}: outside the engine's scope ([scope] in the "
                 "configuration): the engine neither ranks nor writes it"] + _start_lines(document)
    else:
        lines = _job_lines(job) + _prior_lines(document) + _start_lines(document) + _standing_lines(document)
        if verbose:
            lines.append(_parameters_line(document))
        lines += _write_lines(document)
    return lines + _record_lines(document)


def _start_lines(document: dict[str, Any]) -> list[str]:
    """A pending job's expected start, or why there is none (docs/engine.md, "Expected start")."""
    from dike_slurm.cli.expected_start import start_lines

    job = document["job"]
    return start_lines(job, document.get("expected_starts")) if job["state"] == "PENDING" else []


def _prior_lines(document: dict[str, Any]) -> list[str]:
    """The service prior as this cycle uses it, for every job alike (none when the policy reads none)."""
    prior = document.get("service_prior")
    return [f"  {prior['text']}"] if prior else []


def _job_lines(job: dict[str, Any]) -> list[str]:
    """An active job: who and what it is, its service and billing, why it waits, its level."""
    lines = [
        f"job {job['job']}: user {job['user']}, account {job['account']}, partition {job['partition']}, "
        f"{job['state']}, {job['gpus']} GPU(s) on {job['nodes']} node(s)",
        f"  attained service: {job['attained_gpu_hours']:.2f} GPU-hours over {job['run_count']} run(s)"
        + (f", {job['forgiven_gpu_hours']:.2f} forgiven by a promotion" if job["forgiven_gpu_hours"] else ""),
        _billing_line(job["billing"]),
    ]
    if job["slurm_reason"]:
        lines.append(_slurm_reason_line(job))
    elif job["state"] == "PENDING":
        # an update (the engine's writes too) resets squeue's REASON to None until the next pass
        lines.append("  Slurm gives no reason now: its scheduler has not looked at the job since it was queued "
                     "or last updated")
    if not job["managed"]:
        lines.append(f"  not managed: {job['note']}")
    if job["expected_from"] is not None:
        lines.append(f"  expected service: {job['expected_from']['text']} (the service prior: finished jobs "
                     "in the look-back window, shrunk toward coarser groups)")
    lines.append(f"  level {job['level']}: {job['reason']}")
    return lines


def _standing_lines(document: dict[str, Any]) -> list[str]:
    """Where a pending job stands in its partition and what would change it (none for a running job)."""
    if "standing" not in document:
        return []
    where = document["standing"]
    place = f"{where['pending']} pending in partition {where['partition']} in the engine's order"
    return [
        f"  where it stands: first of {place}: no job ahead of it" if not where["ahead"] else
        f"  where it stands: {where['place']} of {place}; {where['ahead']} ahead of it: "
        f"{where['ahead_at_a_better_level']} at a better level (they have used less), "
        f"{where['ahead_at_its_level']} at its level, ranked higher by expected service, fair share and wait",
        "  what would change it:", *(f"    - {item}" for item in document["would_change"]),
    ]


def _write_lines(document: dict[str, Any]) -> list[str]:
    """What the engine holds and plans for an active job: its priority, constraint, next writes."""
    job = document["job"]
    planned = job["priority_planned"]
    if not job["managed"]:  # exempt: the note above says why
        return [f"  {job['priority_field']}: now {job['priority_now']}; the engine writes nothing to this job"]
    if job["beyond_head_window"]:
        lines = [
            f"  beyond the head window: the engine orders the first {job['head_window']} pending jobs of each "
            "partition in the policy's order (what Slurm's scheduler looks at, SchedulerParameters "
            "bf_max_job_test, with a margin: engine.head_window);",
            f"  this job stands further down, so Slurm's own factors order it ({job['priority_field']} back to "
            "what it was before the engine). That changes nothing Slurm does now: its passes reach this "
            "far only once the jobs ahead start, and the engine orders it as soon as it comes within the window.",
        ]
    else:
        lines = [f"  {job['priority_field']}: now {job['priority_now']}, planned {_planned_text(job)}"]
    lines.append(f"  constraint now: {job['placement_now']}; wanted: {job['placement_planned'] or 'none'}")
    if job["left_to_user"]:
        lines.append(f"  left to the user: {job['left_to_user']}")
    if job["left_to_site"]:
        lines.append(f"  left to the site: {job['left_to_site']}")
    for change, reason in zip(job["next_writes"], job["write_reasons"]):
        lines.append(f"  next cycle writes: {change} ({reason})")
    if job["managed"] and not job["next_writes"] and not job["beyond_head_window"] and planned is not None:
        lines.append(f"  next cycle writes nothing: Slurm's value is within engine.priority_tolerance "
                     f"({job['tolerance']:.0%} of the span) of the planned one, close enough to keep the order")
    return lines


def _planned_text(job: dict[str, Any]) -> str:
    """The value the engine plans for the job's priority field, or why none."""
    if job["priority_planned"] is not None:
        return str(job["priority_planned"])
    if job["left_to_site"]:
        return "nothing (left to the site, below)"
    if job["unused_by_slurm"]:
        return (f"nothing: Slurm reads a started job's {job['priority_field']} only once it is pending again, and "
                "the engine may not requeue this one (it did not opt in to preemption, or the policy does not "
                f"preempt), so neither its {job['priority_field']} nor its AdminComment is written")
    return "nothing (a running job the engine may requeue keeps its value until its level changes)"


def _record_lines(document: dict[str, Any]) -> list[str]:
    """The fields the engine owns on the job and its audit trail."""
    lines = [f"  engine owns {owned['field']}: wrote {owned['written']}, original {owned['original']}"
             for owned in document["owned"]]
    if document["audit"]:
        lines.append("audit (newest last):")
        for entry in document["audit"]:
            if entry["action"] == "preemption":  # an outcome, not a write: landed, wasted or gone, and why
                lines += [f"  {entry['time']} preemption for it {entry['change']}: {entry['message']}",
                          f"      {entry['reason']}"]
                continue
            if entry["action"] == "left-alone":  # not a write: a value found someone else's, kept
                lines.append(f"  {entry['time']} left alone: {entry['change']}: {entry['message']}")
                continue
            outcome = "ok" if entry["ok"] else f"FAILED: {entry['message']}"
            lines += [f"  {entry['time']} {entry['action']}: {entry['change']} [{outcome}]",
                      f"      command: {entry['command']}", f"      undo:    {entry['undo']}"]
    return lines


def _slurm_reason_line(job: dict[str, Any]) -> str:
    return f"  Slurm keeps it waiting: {job['slurm_reason']} (squeue's REASON)"


def _parameters_line(document: dict[str, Any]) -> str:
    params = ", ".join(f"{k}={v}" for k, v in document["policy_parameters"].items() if k not in ("comm_rules",))
    return f"  policy {document['policy']}: {params}"


def _published_lines(document: dict[str, Any], verbose: bool) -> list[str]:
    """explain_lines for the published view: what Slurm shows the user and the engine published."""
    job, query = document["job"], document["query"]
    if document["status"] == "unknown":
        return [f"job {query}: not in the queue as Slurm shows it to you. With PrivateData=jobs Slurm shows "
                "each user only their own jobs, so a job of another user's and a finished job look alike here; "
                "the engine's records of finished jobs are for the site's admins"]
    lines = [f"job {job['job']}: user {job['user']}, account {job['account']}, partition {job['partition']}, "
             f"{job['state']}, {job['gpus']} GPU(s) on {job['nodes']} node(s)"]
    if document["status"] == "outside-scope":
        return lines + ["  outside the engine's scope ([scope] in the configuration): the engine neither ranks "
                        "nor writes it"]
    if job["slurm_reason"]:
        lines.append(_slurm_reason_line(job))
    lines += _start_lines(document)
    if job["level"] is None:
        lines.append("  level: none published yet (the engine writes it into the job's AdminComment with its "
                     "first priority write, within a cycle or two)")
    else:
        lines.append(f"  level {job['level']}, attained service {job['attained_gpu_hours']:.1f} GPU-hours, as the "
                     "engine published them in the job's AdminComment at its last write")
    lines.append(f"  {job['priority_field']}: {job['priority_now']} (what Slurm holds: the engine's value once it "
                 "wrote one)")
    lines.append("  where it stands: not shown. Slurm hides other users' jobs from you (PrivateData=jobs), so "
                 "neither its place among them nor what would move it can be worked out here; an admin's "
                 "`dike-slurm explain` shows both")
    if verbose:
        lines.append(_parameters_line(document))
    return lines
