"""The head window: the pending jobs of each partition that Slurm's scheduler will look at.

Slurm looks at a bounded head of each queue (slurm.conf(5), SchedulerParameters): backfill tests
`bf_max_job_test` jobs (500 by default), at most `bf_max_job_part` of one partition (0: no limit),
and event-triggered passes stop at `default_queue_depth` (100); the periodic main pass stops
trying a partition at its first job that cannot start. The order of a job deeper than that
changes nothing until it comes near the head, so the engine orders exactly the first
`margin x depth` jobs of each partition in the policy's order and leaves the rest to Slurm's
own factors (SiteFactor back to what it was). The live engine and the replay use the same
window (reconcile.diff, sim/kernel/priority.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from dike_slurm.domain.decisions import SetPriority
from dike_slurm.domain.model import Job, JobState

# squeue reasons of jobs Slurm's scheduler does not consider yet: they take no place in the head
NOT_CONSIDERED = frozenset({"Dependency", "DependencyNeverSatisfied", "BeginTime", "JobHeldUser", "JobHeldAdmin"})


def window_size(configured: int | None, margin: float, depth: int) -> int:
    """Jobs per partition the engine orders: `engine.head_window` when set (0: every pending job),
    else `margin` times the scheduler's depth."""
    if configured is not None:
        return configured
    return max(1, math.ceil(margin * depth))


def considered(job: Job, now: float) -> bool:
    """A pending job Slurm's scheduler would consider now (not held, waiting on a dependency or a begin time)."""
    if job.state is not JobState.PENDING or job.slurm_reason in NOT_CONSIDERED:
        return False
    return job.eligible_time is None or job.eligible_time <= now


def head_window(ranked: Iterable[tuple[int, str, bool]], size: int) -> frozenset[int] | None:
    """The jobs inside the window: the first `size` of each partition, in the order given.

    `ranked`: (job id, partition list as squeue prints it: "a,b", whether Slurm considers it) of the
    pending jobs, the policy's first job first. A considered job takes a place in each of its
    partitions and is inside when it took one; a job Slurm does not consider yet (held, a
    dependency, a begin time: a requeued job's hold) takes no place, and is inside when a place
    was left where it stands. None when `size` is 0: no window, every job is ordered.
    """
    if size <= 0:
        return None
    taken: dict[str, int] = {}
    inside = []
    for job_id, partitions, counts in ranked:
        within = False
        for partition in partitions.split(","):
            count = taken.get(partition, 0)
            if count < size:
                within = True
                if counts:
                    taken[partition] = count + 1
        if within:
            inside.append(job_id)
    return frozenset(inside)


def policy_window(ranked: Sequence[SetPriority], latest: Mapping[int, SetPriority], jobs: Mapping[int, Job],
                  now: float, size: int) -> frozenset[int] | None:
    """The window over the pending `jobs` in the policy's order (`ranked`: Decisions.ranked(); a
    decision that is not `latest` for its job is passed over). None: no window."""
    if size <= 0:
        return None
    heads = []
    for decision in ranked:
        job = jobs.get(decision.job_id)
        if job is not None and latest[decision.job_id] is decision and job.state is JobState.PENDING:
            heads.append((decision.job_id, job.partition, considered(job, now)))
    return head_window(heads, size)
