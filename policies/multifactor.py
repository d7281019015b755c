"""The shape of Slurm's priority/multifactor plugin: age + fair-share + job size."""

from __future__ import annotations

import random

from pydantic import Field

from dike_slurm.decisions import Decisions, SetPriority
from dike_slurm.model import Snapshot
from dike_slurm.policies.base import Policy, PolicyParams
from dike_slurm.policies.common import owner_of, share_fractions, usage_fractions


class MultifactorParams(PolicyParams):
    """Weights as in slurm.conf (PriorityWeight*), with commonly used values as defaults."""

    weight_age: float = Field(1000.0, ge=0)
    weight_fairshare: float = Field(10000.0, ge=0)
    weight_job_size: float = Field(1000.0, ge=0)
    max_age_s: int = Field(7 * 86400, gt=0, description="PriorityMaxAge: age factor saturates here")
    favor_small: bool = Field(False, description="PriorityFavorSmall")
    fairness_by: str = Field("user", pattern="^(user|account)$")


class MultifactorPolicy(Policy):
    name = "multifactor"
    description = "Slurm-like priority/multifactor: age + fair-share + job size."
    Params = MultifactorParams

    def score_ceiling(self, params: PolicyParams) -> float | None:
        assert isinstance(params, MultifactorParams)
        total = params.weight_age + params.weight_fairshare + params.weight_job_size
        return total if total > 0 else None

    def decide(self, snapshot: Snapshot, params: PolicyParams, rng: random.Random) -> Decisions:
        assert isinstance(params, MultifactorParams)
        active = snapshot.pending + snapshot.running
        owners = [owner_of(j, params.fairness_by) for j in active]
        usage = usage_fractions(snapshot.user_usage_gpu_s, owners)
        shares = share_fractions(snapshot.user_shares, owners)
        total_gpus = max(snapshot.total_gpus, 1)
        decisions = []
        for job, owner in zip(active, owners):
            age = min(max(0.0, snapshot.time - (job.eligible_time or job.submit_time)) / params.max_age_s, 1.0)
            # Classic Slurm fair-share factor: 2^(-usage/share).
            fairshare = 2.0 ** (-usage[owner] / shares[owner]) if shares[owner] > 0 else 0.0
            size = min(job.gpus / total_gpus, 1.0)
            if params.favor_small:
                size = 1.0 - size
            score = params.weight_age * age + params.weight_fairshare * fairshare + params.weight_job_size * size
            decisions.append(
                SetPriority(job.job_id, 0, score, f"age={age:.2f} fairshare={fairshare:.2f} size={size:.2f}")
            )
        return Decisions(priorities=tuple(decisions))
