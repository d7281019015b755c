"""The shape of Slurm's priority/multifactor plugin: age + fair-share + job size."""

from __future__ import annotations

import random

from pydantic import Field

from dike_slurm.decisions import Decisions, SetPriority
from dike_slurm.model import Snapshot
from dike_slurm.policies.base import Policy, PolicyParams
from dike_slurm.policies.common import owners_of, share_fractions, split_active, usage_fractions


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

    def reads_completed_service(self, params: PolicyParams) -> bool:
        return False

    def score_ceiling(self, params: PolicyParams) -> float | None:
        assert isinstance(params, MultifactorParams)
        total = params.weight_age + params.weight_fairshare + params.weight_job_size
        return total if total > 0 else None

    def decide(self, snapshot: Snapshot, params: PolicyParams, rng: random.Random) -> Decisions:
        assert isinstance(params, MultifactorParams)
        pending, running = split_active(snapshot)
        active = pending + running
        owners = owners_of(active, params.fairness_by)
        usage = usage_fractions(snapshot.user_usage_gpu_s, owners)
        shares = share_fractions(snapshot.user_shares, owners)
        total_gpus = max(snapshot.total_gpus, 1)
        now, max_age = snapshot.time, params.max_age_s
        weight_age, weight_fairshare, weight_job_size = params.weight_age, params.weight_fairshare, params.weight_job_size
        # The fair-share term depends only on the owner and the size term only on the GPU count:
        # each is worked out (with its text) once, not once per job.
        by_owner: dict[str, tuple[float, str]] = {}
        for owner in usage:
            # Classic Slurm fair-share factor: 2^(-usage/share).
            fairshare = 2.0 ** (-usage[owner] / shares[owner]) if shares[owner] > 0 else 0.0
            by_owner[owner] = (weight_fairshare * fairshare, f" fairshare={fairshare:.2f} size=")
        by_gpus: dict[int, tuple[float, str]] = {}
        decisions = []
        append = decisions.append
        for job, owner in zip(active, owners):
            age = min(max(0.0, now - (job.eligible_time or job.submit_time)) / max_age, 1.0)
            fairshare_term, middle = by_owner[owner]
            size_term = by_gpus.get(job.gpus)
            if size_term is None:
                size = min(job.gpus / total_gpus, 1.0)
                if params.favor_small:
                    size = 1.0 - size
                size_term = by_gpus[job.gpus] = (weight_job_size * size, f"{size:.2f}")
            score = weight_age * age + fairshare_term + size_term[0]
            append(SetPriority(job.job_id, 0, score, f"age={age:.2f}{middle}{size_term[1]}"))
        return Decisions(priorities=tuple(decisions))
