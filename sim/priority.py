"""The replay's queue order as Slurm makes it, and the values the live engine would write into it.

`SlurmOrder` gives each pending job Slurm's priority (dike_slurm/slurm_priority.py: the site's
weighted factors plus what the engine wrote) and the order Slurm tries jobs in: partition
PriorityTier, priority, submit time, job id. Fair share comes from each association's usage,
decayed with the site's PriorityDecayHalfLife, recalculated with the order at every policy cycle.

`engine_writes` turns a policy's decisions into the values the live engine writes with the same
configuration: mapped onto [1, span - reserve] against the policy's ceiling (a protected job: span), left alone within the
tolerance unless the level changed, and rewritten where the tolerance would break the policy's
order (reconcile.priority_value, score_ceiling and keep_policy_order: the engine's own functions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from dike_slurm.backends.base import JobField
from dike_slurm.decisions import Decisions
from dike_slurm.reconcile import STRATEGY_FIELD, keep_policy_order, score_ceiling, wanted_value
from dike_slurm.slurm_priority import PriorityInputs, PriorityWeights, SlurmPriorityModel, fairshare_factors
from dike_slurm.sim.job import PENDING, SimJob
from dike_slurm.sim.records import SimSettings
from dike_slurm.sim.usage import DecayedUsage

# A cluster whose weights are unknown: Slurm's defaults (every weight 0), so only what the engine
# wrote orders the queue, then submit time.
NO_WEIGHTS = SlurmPriorityModel(PriorityWeights(), {}, {}, 1, 1, {}, "no weights (Slurm's defaults)")


class SlurmOrder:
    """Slurm's priority and order of the replay's pending jobs."""

    def __init__(self, settings: SimSettings, shares: Mapping[str, float], *, basic: bool = False) -> None:
        """`basic`: Slurm's priority/basic, whatever the site's weights (the fifo baseline)."""
        model = settings.priority_model or NO_WEIGHTS
        if basic:
            model = replace(model, weights=replace(model.weights, multifactor=False))
        self.model = model
        self.strategy = settings.priority_strategy
        weights = self.model.weights
        self.usage = DecayedUsage(weights.decay_half_life_s)  # per (account, user) association
        self.shares = dict(shares)
        self.fairshare: dict = {}
        self.uses_fairshare = weights.multifactor and weights.fairshare > 0

    def join(self, job: SimJob, now: float) -> None:
        """A job arrives: its association is known to the fair-share tree from now on."""
        if self.uses_fairshare:
            self.usage.change_rate(job.association, now, 0)  # type: ignore[arg-type]

    def change_rate(self, job: SimJob, now: float, delta_gpus: int) -> None:
        if self.uses_fairshare:
            self.usage.change_rate(job.association, now, delta_gpus)  # type: ignore[arg-type]

    def recalculate(self, now: float) -> None:
        """Slurm's periodic recalculation: every association's fair-share factor now."""
        if self.uses_fairshare:
            usage = self.usage.snapshot(now)
            self.fairshare = fairshare_factors(usage, self.model.weights.fair_tree, self.shares)  # type: ignore[arg-type]

    def priority(self, job: SimJob, now: float) -> int:
        """The job's priority in Slurm at `now`."""
        model = self.model
        if self.strategy == "priority" and job.owned:
            return job.written  # an explicit Priority= pins it; every factor stops
        if not model.weights.multifactor:
            return 1  # priority/basic: submit order (SiteFactor and Nice have no effect)
        trace = job.trace
        inputs = PriorityInputs(
            partition=trace.partition, qos=trace.qos, nodes=trace.num_nodes, cpus=trace.cpus, gpus=trace.gpus,
            eligible_since=job.eligible_at, fairshare=self.fairshare.get(job.association, 1.0),
            site_factor=job.written if self.strategy == "site_factor" else 0,
            nice=job.written if self.strategy == "nice" else 0,
        )
        return model.priority(inputs, now)

    def key(self, job: SimJob, now: float) -> tuple[int, int, float, int]:
        """Where the job sorts: lower first (tier and priority descending, then submit time, id).
        A requeued job carries its new submit time, as Slurm gives it."""
        return (-self.model.tier(job.trace.partition), -self.priority(job, now), job.pending_since, job.trace.job_id)


class _Write:
    """One job's side of keep_policy_order: its decision, value now, wanted value, and whether
    it is rewritten."""

    __slots__ = ("decision", "needed", "value_now", "wanted")

    def __init__(self, decision, value_now: int, wanted: int, needed: bool) -> None:
        self.decision, self.value_now, self.wanted, self.needed = decision, value_now, wanted, needed


def engine_writes(decisions: Decisions, jobs: Mapping[int, SimJob], declared_ceiling: float | None,
                  settings: SimSettings) -> None:
    """Set each job's `written` value as the live engine would write it for these decisions
    (reconcile.diff with the same settings; user changes and guardrails aside)."""
    key = STRATEGY_FIELD[settings.priority_strategy]
    span = settings.priority_span
    tolerance = settings.priority_tolerance * span
    ceiling = score_ceiling(decisions, declared_ceiling)
    negate = key is JobField.NICE
    protected, reserve = frozenset(decisions.protected), settings.priority_reserve
    writes: dict[int, tuple[_Write, SimJob]] = {}
    for decision in decisions.priorities:
        job = jobs.get(decision.job_id)
        if job is None:
            continue
        wanted = wanted_value(decision, protected, ceiling, span, reserve)
        if negate:
            wanted = -wanted
        value_now = job.written
        written_level = job.written_level if job.owned else None
        if job.state == PENDING:
            needed = abs(wanted - value_now) > tolerance or (job.owned and written_level != decision.level)
        else:  # running: its value only matters once requeued; follow level changes only
            needed = (written_level if written_level is not None else 0) != decision.level
        writes[decision.job_id] = (_Write(decision, value_now, wanted, needed), job)
    chain = []
    for decision in decisions.ranked():
        entry = writes.get(decision.job_id)
        if entry is not None and entry[0].decision is decision and entry[1].state == PENDING:
            chain.append(entry[0])
    keep_policy_order(chain, key)  # type: ignore[arg-type]
    for write, job in writes.values():
        if write.needed:
            job.written, job.written_level, job.owned = write.wanted, write.decision.level, True
