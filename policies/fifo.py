"""First come, first served: what a Slurm site with priority/basic gets."""

from __future__ import annotations

import random

from dike_slurm.decisions import Decisions, SetPriority
from dike_slurm.model import Snapshot
from dike_slurm.policies.base import Policy, PolicyParams


class FifoParams(PolicyParams):
    """FIFO has no parameters."""


class FifoPolicy(Policy):
    name = "fifo"
    description = "Submit order (Slurm's priority/basic)."
    Params = FifoParams

    def decide(self, snapshot: Snapshot, params: PolicyParams, rng: random.Random) -> Decisions:
        active = sorted(snapshot.pending + snapshot.running, key=lambda j: (j.submit_time, j.job_id))
        count = len(active)
        # Score = reversed rank: the earliest submission gets the highest score.
        return Decisions(
            priorities=tuple(
                SetPriority(job.job_id, 0, float(count - rank), "submit order")
                for rank, job in enumerate(active)
            )
        )
