"""Shortest remaining time first with the trace's true durations: an upper bound, replay only."""

from __future__ import annotations

import random

from pydantic import Field

from dike_slurm.decisions import Decisions, SetPriority
from dike_slurm.errors import PolicyError
from dike_slurm.model import JobState, Snapshot
from dike_slurm.policies.base import Policy, PolicyParams
from dike_slurm.policies.preemption import PreemptionLimits, plan_preemptions


class SrtfOracleParams(PolicyParams):
    """The oracle knows every job's run time; preemptive: it also preempts for shorter jobs."""

    preemptive: bool = Field(False, description="requeue running jobs with more remaining GPU-time than a blocked job")
    max_requeues_per_cycle: int = Field(32, ge=0, description="an upper bound: not held to the engine's rate limit")


class SrtfOraclePolicy(Policy):
    name = "srtf_oracle"
    description = "Shortest remaining GPU-time first using true durations (replay-only upper bound)."
    Params = SrtfOracleParams
    live = False

    def reads_completed_service(self, params: PolicyParams) -> bool:
        return False

    def requeue_min_run_s(self, params: PolicyParams) -> float | None:
        assert isinstance(params, SrtfOracleParams)
        return 0.0 if params.preemptive else None

    def decide(self, snapshot: Snapshot, params: PolicyParams, rng: random.Random) -> Decisions:
        active = snapshot.pending + snapshot.running
        missing = [j.display_id for j in active if j.true_duration_s is None]
        if missing:
            raise PolicyError(
                f"srtf_oracle needs true durations (replay only); job {missing[0]} has none"
            )
        remaining = []
        for job in active:
            done = (snapshot.time - job.start_time) if job.state is JobState.RUNNING and job.start_time else 0.0
            left = max(0.0, (job.true_duration_s or 0.0) - done) * max(job.gpus, 1)
            remaining.append((left, job.submit_time, job.job_id))
        remaining.sort()
        count = len(remaining)
        priorities = tuple(
            SetPriority(job_id, 0, float(count - rank), f"remaining={left / 3600:.2f}gpuh")
            for rank, (left, _, job_id) in enumerate(remaining)
        )
        assert isinstance(params, SrtfOracleParams)
        if not params.preemptive:
            return Decisions(priorities=priorities)
        rank_of = {job_id: rank for rank, (_, _, job_id) in enumerate(remaining)}
        left_of = {job_id: left for left, _, job_id in remaining}
        pending = sorted((j for j in active if j.state is JobState.PENDING), key=lambda j: rank_of[j.job_id])
        running = [j for j in active if j.state is JobState.RUNNING]
        now = snapshot.time
        plan = plan_preemptions(
            snapshot,
            pending,
            running,
            outranks=lambda blocked, victim: left_of[blocked.job_id] < left_of[victim.job_id],
            may_preempt=lambda victim: victim.requeueable,
            loss=lambda victim: victim.gpus * (now - (victim.start_time or now)),
            one_leaf=lambda job: job.num_nodes > 1,
            limits=PreemptionLimits(max_requeues=params.max_requeues_per_cycle, max_blocked=32),
            reason=lambda blocked, victim: f"more remaining GPU-time than job {blocked.job_id}",
            protect=True,  # the upper bound wastes no preemption
        )
        return Decisions(priorities, plan.pins, plan.requeues, plan.protected)
