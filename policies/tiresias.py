"""Tiresias (Gu et al., NSDI 2019): discretized two-dimensional least-attained-service."""

from __future__ import annotations

import random

from pydantic import Field, model_validator

from dike_slurm.decisions import Decisions, SetPriority
from dike_slurm.model import Snapshot
from dike_slurm.policies.base import Policy, PolicyParams
from dike_slurm.policies.common import consolidation, leaf_free_gpus, leaf_gpu_capacity
from dike_slurm.policies.dike import levels_with_promotion


class TiresiasParams(PolicyParams):
    """Tiresias' published defaults: two queues split at 3600 GPU-seconds, FIFO inside."""

    thresholds_gpu_s: list[float] = Field(default_factory=lambda: [3600.0], description="ascending queue thresholds")
    promote_knob: float | None = Field(None, gt=0, description="promote when wait >= knob x last run; unset: off")
    consolidate_gpus: int = Field(8, ge=1, description="jobs of at least this many GPUs are consolidated")
    consolidation_wait_s: int = Field(300, ge=0, description="Switches=N@wait (Slurm's default max_switch_wait)")

    @model_validator(mode="after")
    def _ascending(self) -> TiresiasParams:
        values = self.thresholds_gpu_s
        if not values or any(v <= 0 for v in values) or any(b <= a for a, b in zip(values, values[1:])):
            raise ValueError(f"thresholds_gpu_s must be positive and strictly ascending, got {values}")
        return self


class TiresiasPolicy(Policy):
    name = "tiresias"
    description = "Tiresias 2D-LAS: 2 queues at 3600 GPU-s, FIFO inside, consolidate large jobs."
    Params = TiresiasParams

    def score_ceiling(self, params: PolicyParams) -> float | None:
        assert isinstance(params, TiresiasParams)
        return float(len(params.thresholds_gpu_s) + 1)

    def decide(self, snapshot: Snapshot, params: PolicyParams, rng: random.Random) -> Decisions:
        assert isinstance(params, TiresiasParams)
        levels = len(params.thresholds_gpu_s) + 1
        active = sorted(snapshot.pending + snapshot.running, key=lambda j: (j.submit_time, j.job_id))
        count = len(active)
        priorities = []
        for rank, job in enumerate(active):
            level, promoted, reason = levels_with_promotion(
                job, snapshot.time, params.thresholds_gpu_s, params.promote_knob, None
            )
            # FIFO inside a level: earlier submissions get a larger share of the level's span.
            within = 0.999 * (count - rank) / (count + 1)
            priorities.append(SetPriority(job.job_id, level, (levels - 1 - level) + within, f"level={level} {reason}", promoted))
        capacity = leaf_gpu_capacity(snapshot)
        free_by_leaf = leaf_free_gpus(snapshot)
        placements = []
        for job in snapshot.pending:
            if job.gpus >= params.consolidate_gpus:
                decision = consolidation(
                    job, snapshot.time, capacity, free_by_leaf, params.consolidation_wait_s,
                    "switches", "", f"large job ({job.gpus} GPUs): consolidate",
                )
                if decision is not None:
                    placements.append(decision)
        return Decisions(tuple(priorities), tuple(placements))
