"""First come, first served: what a Slurm site with priority/basic gets."""

from __future__ import annotations

import random
from itertools import repeat
from operator import attrgetter

from dike_slurm.decisions import Decisions, SetPriority
from dike_slurm.model import JobState, Snapshot
from dike_slurm.policies.base import Policy, PolicyParams

ACTIVE = (JobState.PENDING, JobState.RUNNING)
JOB_ID = attrgetter("job_id")
SUBMIT_TIME = attrgetter("submit_time")


def submit_order(jobs) -> list:
    """The jobs sorted by (submit_time, job_id): two stable sorts on one key each, which is the
    same order as one sort on the pair (job ids are unique) and about 3x faster than building a
    tuple per job."""
    ordered = sorted(jobs, key=JOB_ID)
    ordered.sort(key=SUBMIT_TIME)
    return ordered


class FifoParams(PolicyParams):
    """FIFO has no parameters."""


class FifoPolicy(Policy):
    name = "fifo"
    description = "Submit order (Slurm's priority/basic)."
    Params = FifoParams

    def reads_completed_service(self, params: PolicyParams) -> bool:
        return False

    def replays_as_priority_basic(self, params: PolicyParams) -> bool:
        return True

    def decide(self, snapshot: Snapshot, params: PolicyParams, rng: random.Random) -> Decisions:
        active = submit_order([j for j in snapshot.jobs if j.state in ACTIVE])
        count = len(active)
        # Score = reversed rank: the earliest submission gets the highest score.
        return Decisions(
            priorities=tuple(
                map(SetPriority, map(JOB_ID, active), repeat(0), map(float, range(count, 0, -1)), repeat("submit order"))
            )
        )
