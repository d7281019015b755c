"""First come, first served: what a Slurm site with priority/basic gets."""

from __future__ import annotations

from itertools import repeat

from dike_slurm.domain.decisions import SetPriority
from dike_slurm.domain.model import Snapshot
from dike_slurm.policies.base import PolicyParams
from dike_slurm.policies.common import JOB_ID, split_active, submit_order
from dike_slurm.policies.stages import Ordering, Ranking, StagedPolicy


class FifoParams(PolicyParams):
    """FIFO has no parameters."""


class SubmitOrder(Ordering[FifoParams]):
    """The earliest submission first: the score is the reversed rank."""

    def rank(self, snapshot: Snapshot, params: FifoParams) -> Ranking:
        pending, running = split_active(snapshot)
        active = submit_order(pending + running)
        count = len(active)
        return Ranking(
            tuple(map(SetPriority, map(JOB_ID, active), repeat(0), map(float, range(count, 0, -1)),
                      repeat("submit order"))),
            pending, running,
        )


class FifoPolicy(StagedPolicy[FifoParams]):
    name = "fifo"
    description = "Submit order (Slurm's priority/basic)."
    Params = FifoParams
    ordering = SubmitOrder()

    def reads_completed_service(self, params: FifoParams) -> bool:
        return False

    def replay_may_postpone(self, params: FifoParams) -> bool:
        return True  # submit order: deciding later orders the same jobs the same way

    def replays_as_priority_basic(self, params: FifoParams) -> bool:
        return True
