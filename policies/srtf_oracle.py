"""Shortest remaining time first with the trace's true durations: an upper bound, replay only."""

from __future__ import annotations

import random

from dike_slurm.decisions import Decisions, SetPriority
from dike_slurm.errors import PolicyError
from dike_slurm.model import JobState, Snapshot
from dike_slurm.policies.base import Policy, PolicyParams


class SrtfOracleParams(PolicyParams):
    """No parameters: the oracle knows every job's run time."""


class SrtfOraclePolicy(Policy):
    name = "srtf_oracle"
    description = "Shortest remaining GPU-time first using true durations (replay-only upper bound)."
    Params = SrtfOracleParams
    live = False

    def reads_completed_service(self, params: PolicyParams) -> bool:
        return False

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
        return Decisions(
            priorities=tuple(
                SetPriority(job_id, 0, float(count - rank), f"remaining={left / 3600:.2f}gpuh")
                for rank, (left, _, job_id) in enumerate(remaining)
            )
        )
