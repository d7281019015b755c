"""Revert: put every field the engine still owns on active jobs back to its original value."""

from __future__ import annotations

import time
from dataclasses import dataclass

from dike_slurm.backends.base import Backend, FieldValue, JobField, JobUpdate, WriteOutcome
from dike_slurm.model import JobState
from dike_slurm.reconcile import PlannedWrite, describe_value
from dike_slurm.state import AuditEntry, StateStore


@dataclass(frozen=True)
class RevertPlan:
    """The writes that put every field the engine owns back to its original value."""

    writes: tuple[PlannedWrite, ...]
    released: tuple[tuple[int, JobField, str], ...]  # (job, field, why) let go without a write


def revert_plan(backend: Backend, store: StateStore) -> RevertPlan:
    """Put back every value the engine owns on jobs still active; let go of the others."""
    cluster = backend.read_cluster()
    jobs = {j.job_id: j for j in cluster.jobs}
    writes: list[PlannedWrite] = []
    released: list[tuple[int, JobField, str]] = []
    for job_id, fields in sorted(store.owned().items()):
        job = jobs.get(job_id)
        if job is None:
            released.extend((job_id, f, "job no longer active") for f in fields)
            continue
        values: dict[JobField, FieldValue] = {}
        for key, mine in fields.items():
            if key.is_placement and job.state is not JobState.PENDING:
                released.append((job_id, key, "job is no longer pending: its constraint is spent"))
                continue
            values[key] = mine.original
        if values:
            update = JobUpdate.of(job_id, values)
            writes.append(PlannedWrite(
                job_id, update, update, tuple(values.items()), tuple(values), "revert", len(writes),
            ))
    return RevertPlan(tuple(writes), tuple(released))


def revert(plan: RevertPlan, backend: Backend, store: StateStore) -> list[tuple[PlannedWrite, WriteOutcome]]:
    """Apply a revert plan; every job's fields are released once restored (or gone)."""
    now = time.time()
    cycle = store.next_cycle()
    outcomes = []
    for write in plan.writes:
        outcome = backend.apply(write.update)
        change = "; ".join(f"{k.value} -> {describe_value(v)}" for k, v in write.update.values)
        with store.transaction():
            store.audit(AuditEntry(
                now, cycle, write.job_id, "revert", change, outcome.command, "none", outcome.ok,
                outcome.message, "revert",
            ))
            if outcome.ok or outcome.job_gone:
                store.release(write.job_id, write.update.fields)
        outcomes.append((write, outcome))
    with store.transaction():
        for job_id, key, _ in plan.released:
            store.release(job_id, [key])
    return outcomes
