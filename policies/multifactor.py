"""Slurm's own priority/multifactor: the baseline a site already runs.

The policy decides nothing: the engine writes no SiteFactor, and Slurm orders the queue by the
site's own weights. The replay computes that order with `dike_slurm.domain.slurm_priority` from the
replay's slurm.conf (PriorityWeight*, partitions) and QOS priorities, so `multifactor` in a
replay is Slurm itself with SiteFactor 0: one model of Slurm's priority, not two.
"""

from __future__ import annotations

import random

from dike_slurm.domain.decisions import Decisions
from dike_slurm.domain.model import Snapshot
from dike_slurm.policies.base import Policy, PolicyParams


class MultifactorParams(PolicyParams):
    """No parameters: the weights are the site's own (slurm.conf PriorityWeight*)."""


class MultifactorPolicy(Policy):
    name = "multifactor"
    description = "Slurm's own priority/multifactor (the site's weights from slurm.conf); writes nothing."
    Params = MultifactorParams

    def reads_completed_service(self, params: PolicyParams) -> bool:
        return False

    def replay_may_postpone(self, params: PolicyParams) -> bool:
        return True  # it decides nothing

    def decide(self, snapshot: Snapshot, params: PolicyParams, rng: random.Random) -> Decisions:
        return Decisions()
