"""The typed stages a policy is composed of, and the policy that runs them.

A decision is made in stages, each a pure function of the snapshot and the policy's parameters
`P` (Blox keeps admission, ordering and placement apart; the Kubernetes scheduler framework has
typed extension points):

1. **ordering** (`Ordering[P]`): a `SetPriority` for every active job, as a `Ranking`;
2. **placement** (`Placing[P]`): the constraints on pending jobs;
3. **preemption**: the one stage every preemptive policy shares (`preemption.preempt`): its
   victims as the policy's `Victims[P]` rule says, and the pins of the jobs they make room for,
   which replace those jobs' placements;
4. **holding** (`Holding[P]`): nodes kept for a blocked job, after the preemption's pins.

`StagedPolicy[P]` runs them in that order; a stage a policy does not have is None.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Generic

from dike_slurm.domain.decisions import ClearPlacement, Decisions, PriorInForce, SetPlacement, SetPriority
from dike_slurm.domain.model import Job, Snapshot
from dike_slurm.policies.base import P, Policy
from dike_slurm.policies.preemption import PreemptionPlan, PreemptionRule, preempt, with_pins
from dike_slurm.domain.service_prior import Prediction

PlacementDecision = SetPlacement | ClearPlacement


@dataclass(frozen=True)
class Ranking:
    """The ordering stage's outcome: a priority for every active job, the pending and running
    jobs it ranked, and what the later stages read of it.

    A blocked job outranks a running one when its `measure` is lower: by default its level (a job
    of a better queue), else what the ordering gives (the SRTF oracle: remaining GPU-seconds)."""

    priorities: tuple[SetPriority, ...]
    pending: tuple[Job, ...]
    running: tuple[Job, ...]
    expected: Mapping[int, Prediction] = field(default_factory=dict)  # the service prior's predictions, by job
    measures: Mapping[int, float] | None = None  # None: the levels
    prior: PriorInForce | None = None  # the service prior in force, for explain and status

    @cached_property
    def measure(self) -> Mapping[int, float]:
        """What a job outranks another by (lower first), by job id."""
        if self.measures is not None:
            return self.measures
        return {p.job_id: p.level for p in self.priorities}

    @cached_property
    def walk(self) -> list[Job]:
        """The pending jobs in the order the policy would run them: score descending, then
        submission, then id (the order preemption and holding try them in)."""
        score_of = {p.job_id: p.score for p in self.priorities}
        return sorted(self.pending, key=lambda j: (-score_of[j.job_id], j.submit_time, j.job_id))


class Ordering(ABC, Generic[P]):
    """Ranks the active jobs."""

    @abstractmethod
    def rank(self, snapshot: Snapshot, params: P) -> Ranking:
        """A SetPriority per active job (higher scores first, levels in the integer part)."""


class Placing(ABC, Generic[P]):
    """Constraints on where pending jobs run."""

    @abstractmethod
    def place(self, snapshot: Snapshot, params: P, ranking: Ranking) -> list[PlacementDecision]:
        """A placement decision per pending job that gets one."""


class Victims(ABC, Generic[P]):
    """The policy's part of preemption: which running jobs may be cut, at what loss, with what
    limits; the preemption stage itself (`preemption.preempt`) is shared."""

    @abstractmethod
    def min_run_s(self, params: P) -> float | None:
        """None: these parameters preempt nothing; otherwise the shortest run (seconds since the
        job's last start) `rule` may cut (the policy's `requeue_min_run_s`)."""

    @abstractmethod
    def rule(self, snapshot: Snapshot, params: P, ranking: Ranking) -> PreemptionRule | None:
        """The rule for this cycle; None when `min_run_s` is None."""

    def gains(self, params: P, expected: Mapping[int, Prediction]) -> Callable[[Job, Job], bool] | None:
        """`PreemptionRule.gains` for these parameters and the prior's expected service by job (None:
        any job a blocked job outranks may be cut)."""
        return None


class Holding(ABC, Generic[P]):
    """Nodes kept free for a blocked job, after the preemption stage."""

    @abstractmethod
    def hold(self, snapshot: Snapshot, params: P, ranking: Ranking, plan: PreemptionPlan,
             placements: list[PlacementDecision]) -> list[PlacementDecision]:
        """The placements with the hold's exclusions added (unchanged when nothing is held)."""


class StagedPolicy(Policy[P]):
    """A policy composed of stages: ordering, then placement, preemption and holding where it has them."""

    ordering: Ordering[P]
    placing: Placing[P] | None = None
    victims: Victims[P] | None = None
    holding: Holding[P] | None = None

    def decide(self, snapshot: Snapshot, params: P, rng: random.Random) -> Decisions:
        ranking = self.ordering.rank(snapshot, params)
        placements = self.placing.place(snapshot, params, ranking) if self.placing is not None else []
        rule = self.victims.rule(snapshot, params, ranking) if self.victims is not None else None
        plan = preempt(snapshot, ranking.walk, ranking.running, ranking.measure, rule) if rule is not None \
            else PreemptionPlan()
        placements = with_pins(placements, plan)
        if self.holding is not None:
            placements = self.holding.hold(snapshot, params, ranking, plan, placements)
        return Decisions(ranking.priorities, tuple(placements), plan.requeues, plan.protected, ranking.expected,
                         ranking.prior)

    def requeue_min_run_s(self, params: P) -> float | None:
        return self.victims.min_run_s(params) if self.victims is not None else None

    def preemption_gains(self, params: P, expected: Mapping[int, Prediction]) -> Callable[[Job, Job], bool] | None:
        return self.victims.gains(params, expected) if self.victims is not None else None
