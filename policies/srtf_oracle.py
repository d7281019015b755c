"""Shortest remaining time first with the trace's true durations: an upper bound, replay only."""

from __future__ import annotations

from pydantic import Field

from dike_slurm.domain.decisions import SetPriority
from dike_slurm.errors import PolicyError
from dike_slurm.domain.model import JobState, Snapshot
from dike_slurm.policies.base import PolicyParams
from dike_slurm.policies.preemption import PreemptionLimits, PreemptionRule
from dike_slurm.policies.stages import Ordering, Ranking, StagedPolicy, Victims


class SrtfOracleParams(PolicyParams):
    """The oracle knows every job's run time; preemptive: it also preempts for shorter jobs."""

    preemptive: bool = Field(False, description="requeue running jobs with more remaining GPU-time than a blocked job")
    max_requeues_per_cycle: int = Field(32, ge=0, description="an upper bound: not held to the engine's rate limit")


class ShortestRemaining(Ordering[SrtfOracleParams]):
    """Remaining GPU-time (true duration minus the time run, times GPUs) ascending; a blocked job
    outranks a running one with more remaining GPU-time."""

    def rank(self, snapshot: Snapshot, params: SrtfOracleParams) -> Ranking:
        pending, running = snapshot.pending, snapshot.running
        active = pending + running
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
        return Ranking(priorities, pending, running, measures={job_id: left for left, _, job_id in remaining})


class LongerRemaining(Victims[SrtfOracleParams]):
    """Any requeueable running job with more remaining GPU-time than the blocked job."""

    def min_run_s(self, params: SrtfOracleParams) -> float | None:
        return 0.0 if params.preemptive else None

    def rule(self, snapshot: Snapshot, params: SrtfOracleParams, ranking: Ranking) -> PreemptionRule | None:
        if self.min_run_s(params) is None:
            return None
        now = snapshot.time
        return PreemptionRule(
            may_preempt=lambda victim: victim.requeueable,
            loss=lambda victim: victim.gpus * (now - (victim.start_time or now)),
            one_leaf=lambda job: job.num_nodes > 1,
            limits=PreemptionLimits(max_requeues=params.max_requeues_per_cycle, max_blocked=32),
            reason=lambda blocked, victim: f"more remaining GPU-time than job {blocked.job_id}",
            protect=True,  # the upper bound wastes no preemption
        )


class SrtfOraclePolicy(StagedPolicy[SrtfOracleParams]):
    name = "srtf_oracle"
    description = "Shortest remaining GPU-time first using true durations (replay-only upper bound)."
    Params = SrtfOracleParams
    live = False
    ordering = ShortestRemaining()
    victims = LongerRemaining()

    def reads_completed_service(self, params: SrtfOracleParams) -> bool:
        return False
