"""Revert: put every field the engine still owns on active jobs back to its original value."""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass

from dike_slurm.cycle.apply import Journal, change_text
from dike_slurm.slurm.backends.base import Backend, ClusterState, WriteOutcome
from dike_slurm.domain.fields import FieldValue, JobField, JobUpdate, placement_value
from dike_slurm.domain.model import Job, JobState
from dike_slurm.cycle.plan import PlannedWrite
from dike_slurm.cycle.field_values import describe_value, values_match
from dike_slurm.store.state import StateStore


@dataclass(frozen=True)
class RevertPlan:
    """The writes that put every field the engine owns back to its original value."""

    writes: tuple[PlannedWrite, ...]
    released: tuple[tuple[int, JobField, str], ...]  # (job, field, why) let go without a write
    # (job, field, why) still the engine's but not writable now: a constraint on a running job,
    # which Slurm keeps and applies again if the job is requeued (revert again then)
    kept: tuple[tuple[int, JobField, str], ...] = ()


def revert_plan(backend: Backend, store: StateStore, job_ids: Collection[int] | None = None) -> RevertPlan:
    """Put back every value the engine owns on jobs still active (of `job_ids` only, when given);
    let go of the others."""
    cluster = backend.read_cluster()
    jobs = {j.job_id: j for j in cluster.jobs}
    writes: list[PlannedWrite] = []
    released: list[tuple[int, JobField, str]] = []
    kept: list[tuple[int, JobField, str]] = []
    for job_id, fields in sorted(store.owned().items()):
        if job_ids is not None and job_id not in job_ids:
            continue
        job = jobs.get(job_id)
        if job is None:
            released.extend((job_id, f, "job no longer active") for f in fields)
            continue
        values: dict[JobField, FieldValue] = {}
        for key, mine in fields.items():
            if key.is_placement and job.state is not JobState.PENDING:
                if values_match(key, placement_value(job.placement, key), mine.original):
                    released.append((job_id, key, "job is no longer pending; Slurm holds the original"))
                else:
                    # Slurm keeps a running job's constraints and applies them again after a requeue,
                    # and cannot clear them while it runs (an update of its node list would shrink it)
                    kept.append((job_id, key, f"{key.value} {describe_value(placement_value(job.placement, key))} "
                                              f"stays on the {job.state.value.lower()} job: Slurm cannot clear it "
                                              "until the job is pending again (requeued); revert again then"))
                continue
            values[key] = mine.original
        if values:
            update = JobUpdate.of(job_id, values)
            before = {key: job_value(job, key, cluster, fields[key].written) for key in values}
            writes.append(PlannedWrite(
                job_id, update, update, tuple(values.items()), tuple(values), "revert", len(writes),
                tuple(before.items()),
            ))
    return RevertPlan(tuple(writes), tuple(released), tuple(kept))


def job_value(job: Job, key: JobField, cluster: ClusterState, written: FieldValue) -> FieldValue:
    """What Slurm holds for one field of the job; SiteFactor where Slurm shows it, else what the engine wrote."""
    if key is JobField.SITE_FACTOR:
        return cluster.site_factors.get(job.job_id, written)
    if key is JobField.ADMIN_COMMENT:
        return cluster.admin_comments.get(job.job_id, written)
    if key is JobField.PRIORITY:
        return job.priority
    if key is JobField.NICE:
        return job.nice
    return placement_value(job.placement, key)


def revert(plan: RevertPlan, backend: Backend, store: StateStore) -> list[tuple[PlannedWrite, WriteOutcome]]:
    """Apply a revert plan, each write audited ahead (its row committed as unconfirmed before Slurm
    is called); every job's fields are released once restored (or gone)."""
    now = time.time()
    journal = Journal(store, store.next_cycle(), now, owners={})
    outcomes = []
    for write in plan.writes:
        with store.transaction():
            entry_id = journal.ahead(write.job_id, "revert", change_text(write), backend.describe(write.update),
                                     "none", "revert")
        outcome = backend.apply(write.update)
        with store.transaction():
            journal.finish(entry_id, outcome)
            if outcome.ok or outcome.job_gone:
                store.release(write.job_id, write.update.fields)
        outcomes.append((write, outcome))
    with store.transaction():
        for job_id, key, _ in plan.released:
            store.release(job_id, [key])
    return outcomes
