"""Tiresias (Gu et al., NSDI 2019): discretized two-dimensional least-attained-service."""

from __future__ import annotations

from bisect import bisect_right

from pydantic import Field, model_validator

from dike_slurm.domain.decisions import SetPriority
from dike_slurm.domain.model import Job, JobState, Snapshot
from dike_slurm.policies.base import PolicyParams
from dike_slurm.policies.common import Consolidator, leaf_capacity_and_free, split_active, submit_order
from dike_slurm.policies.levels import levels_with_promotion, promotion_time
from dike_slurm.policies.preemption import PreemptionLimits, PreemptionRule
from dike_slurm.policies.stages import Ordering, Placing, PlacementDecision, Ranking, StagedPolicy, Victims


class TiresiasParams(PolicyParams):
    """Tiresias' published defaults: two queues split at 3600 GPU-seconds, FIFO inside."""

    thresholds_gpu_s: list[float] = Field(default_factory=lambda: [3600.0], description="ascending queue thresholds")
    promote_knob: float | None = Field(None, gt=0, description="promote when wait >= knob x last run; unset: off")
    consolidate_gpus: int = Field(8, ge=1, description="jobs of at least this many GPUs are consolidated")
    consolidation_wait_s: int = Field(300, ge=0, description="Switches=N@wait (Slurm's default max_switch_wait)")
    preemptive: bool = Field(True, description="a job of a better queue preempts running jobs of worse queues (2D-LAS)")
    min_runtime_s: float = Field(0.0, ge=0, description="never preempt a run younger than this (Tiresias has no such rule)")
    max_requeues_per_cycle: int = Field(4, ge=0)
    protect_freed_nodes: bool = Field(
        False,
        description=(
            "the nodes a preemption frees go to the job they were freed for (as for dike); off: 2D-LAS lets any "
            "better-queue job take them, which served it better on the sample (11,569 s against 12,315 s avg JCT)"
        ),
    )

    @model_validator(mode="after")
    def _ascending(self) -> TiresiasParams:
        values = self.thresholds_gpu_s
        if not values or any(v <= 0 for v in values) or any(b <= a for a, b in zip(values, values[1:])):
            raise ValueError(f"thresholds_gpu_s must be positive and strictly ascending, got {values}")
        return self


class LeastAttainedService(Ordering[TiresiasParams]):
    """Discretized 2D-LAS: the queue of a job's attained GPU service, FIFO inside a queue."""

    def rank(self, snapshot: Snapshot, params: TiresiasParams) -> Ranking:
        levels = len(params.thresholds_gpu_s) + 1
        pending, running = split_active(snapshot)
        active = submit_order(pending + running)
        count = len(active)
        now = snapshot.time
        thresholds = list(params.thresholds_gpu_s)
        promote_knob = params.promote_knob
        priorities = []
        append = priorities.append
        pending_state = JobState.PENDING
        never_served = f"level={bisect_right(thresholds, 0.0)} attained={0.0 / 3600:.2f}gpuh"
        for rank, job in enumerate(active):
            # levels_with_promotion, inlined for the common case (exactly the same arithmetic)
            service = job.attained_gpu_s - job.attained_at_promotion_gpu_s
            if not service > 0.0:
                service = 0.0
            level = bisect_right(thresholds, service)
            promoted = False
            if level > 0 and job.state is pending_state:
                level, promoted, reason = levels_with_promotion(job, now, thresholds, promote_knob, None)
                reason = f"level={level} {reason}"
            elif service == 0.0:  # +0.0 only (see above): most pending jobs never ran
                reason = never_served
            else:
                reason = f"level={level} attained={service / 3600:.2f}gpuh"
            # FIFO inside a level: earlier submissions get a larger share of the level's span.
            within = 0.999 * (count - rank) / (count + 1)
            append(SetPriority(job.job_id, level, (levels - 1 - level) + within, reason, promoted))
        return Ranking(tuple(priorities), pending, running)


class ConsolidateLarge(Placing[TiresiasParams]):
    """Jobs of at least `consolidate_gpus` GPUs under as few leaf switches as can hold them."""

    def place(self, snapshot: Snapshot, params: TiresiasParams, ranking: Ranking) -> list[PlacementDecision]:
        placements: list[PlacementDecision] = []
        large = [job for job in ranking.pending if job.gpus >= params.consolidate_gpus]
        if large:
            capacity, free_by_leaf = leaf_capacity_and_free(snapshot)
            consolidator = Consolidator(capacity, free_by_leaf, params.consolidation_wait_s, "switches", "")
            reasons: dict[int, str] = {}
            for job in large:
                reason = reasons.get(job.gpus)
                if reason is None:
                    reason = reasons[job.gpus] = f"large job ({job.gpus} GPUs): consolidate"
                decision = consolidator.decide(job, snapshot.time, reason)
                if decision is not None:
                    placements.append(decision)
        return placements


class WorseQueues(Victims[TiresiasParams]):
    """2D-LAS preemption: a blocked job preempts running jobs of a worse queue (FIFO inside a
    queue: never a job of its own queue), the youngest runs first (they lose the least)."""

    def min_run_s(self, params: TiresiasParams) -> float | None:
        return params.min_runtime_s if params.preemptive else None

    def rule(self, snapshot: Snapshot, params: TiresiasParams, ranking: Ranking) -> PreemptionRule | None:
        min_run = self.min_run_s(params)
        if min_run is None:
            return None
        now, large = snapshot.time, params.consolidate_gpus
        level_of_job = ranking.measure
        return PreemptionRule(
            may_preempt=lambda v: v.requeueable and v.start_time is not None and now - v.start_time >= min_run,
            loss=lambda v: v.gpus * (now - (v.start_time or now)),
            one_leaf=lambda job: job.gpus >= large,
            limits=PreemptionLimits(max_requeues=params.max_requeues_per_cycle),
            reason=lambda blocked, victim: (
                f"queue {level_of_job[victim.job_id]} job preempted for queue-{level_of_job[blocked.job_id]} job {blocked.job_id}"
            ),
            protect=params.protect_freed_nodes,
        )


class TiresiasPolicy(StagedPolicy[TiresiasParams]):
    name = "tiresias"
    description = "Tiresias 2D-LAS: 2 queues at 3600 GPU-s, FIFO inside, preemptive, consolidate large jobs."
    Params = TiresiasParams
    ordering = LeastAttainedService()
    placing = ConsolidateLarge()
    victims = WorseQueues()

    def reads_completed_service(self, params: TiresiasParams) -> bool:
        return False

    def promotion_at(self, job: Job, params: TiresiasParams) -> float | None:
        return promotion_time(job, params.promote_knob, None)

    def score_ceiling(self, params: TiresiasParams) -> float | None:
        return float(len(params.thresholds_gpu_s) + 1)

    def switch_wait_s(self, params: TiresiasParams) -> int | None:
        return params.consolidation_wait_s
