"""The replay's queue order as Slurm makes it, and the values the live engine would write into it.

`SlurmOrder` gives each pending job Slurm's priority (dike_slurm/domain/slurm_priority.py: the site's
weighted factors plus what the engine wrote) and the order Slurm tries jobs in: partition
PriorityTier, priority, submit time, job id. Fair share comes from each association's usage,
decayed with the site's PriorityDecayHalfLife, recalculated with the order at every policy cycle.

`engine_writes` turns a policy's decisions into the values the live engine writes with the same
configuration: mapped onto [1, span - reserve] against the policy's ceiling (a protected job: span), left alone within the
tolerance unless the level changed, and rewritten where the tolerance would break the policy's
order (priority_scale.priority_value, score_ceiling and reconcile.keep_policy_order: the engine's own functions);
a running job gets a write only when the engine may requeue it (it opted in and the policy preempts:
reconcile.diff's rule), since Slurm reads its value only once it is pending again;
beyond the head window a value is handed back (dike_slurm/domain/head_window.py). `within_budget` keeps
the writes the engine's guardrails and write budget let through in one cycle; `cycle_writes` is
the whole of one cycle: the priority writes and the constraints (placements) the engine would write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import NamedTuple

from dike_slurm.domain.fields import JobField
from dike_slurm.domain.decisions import ClearPlacement, Decisions, SetPlacement, SetPriority
from dike_slurm.domain.head_window import policy_window
from dike_slurm.domain.model import NO_PLACEMENT, Job, JobState, Placement
from dike_slurm.cycle.priority_scale import score_ceiling, wanted_value
from dike_slurm.cycle.reconcile import STRATEGY_FIELD, keep_policy_order
from dike_slurm.domain.slurm_priority import PriorityInputs, PriorityWeights, SlurmPriorityModel, fairshare_factors
from dike_slurm.sim.kernel.job import PENDING, RUNNING, SimJob
from dike_slurm.sim.kernel.records import SimSettings
from dike_slurm.sim.kernel.usage import DecayedUsage

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
        # the weighted factors of each request (partition, QOS, nodes, CPUs, GPUs), which never change
        self.request_terms: dict[tuple[str, str, int, int, int], tuple[float, ...]] = {}
        self.uses_fairshare = weights.multifactor and weights.fairshare > 0

    def join(self, job: SimJob, now: float) -> None:
        """A job arrives: its association is known to the fair-share tree from now on."""
        if self.uses_fairshare:
            self.usage.change_rate(job.association, now, 0)  # type: ignore[arg-type]

    def change_rate(self, job: SimJob, now: float, delta_gpus: int) -> None:
        if self.uses_fairshare:
            self.usage.change_rate(job.association, now, delta_gpus)  # type: ignore[arg-type]

    def change_past_rate(self, association: tuple[str, str], at: float, delta_gpus: float) -> None:
        """A past run of the association (a warm start's, sim/kernel/warm.py) starts or stops at `at`."""
        if self.uses_fairshare:
            self.usage.change_rate(association, at, delta_gpus)  # type: ignore[arg-type]

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
        request = (trace.partition, trace.qos, trace.num_nodes, trace.cpus, trace.gpus)
        terms = self.request_terms.get(request)
        if terms is None:
            terms = self.request_terms[request] = model.request_terms(*request)
        value = model.sum_with(terms, job.eligible_at, self.fairshare.get(job.association, 1.0), now)
        strategy = self.strategy
        if strategy == "site_factor":
            value += job.written
        elif strategy == "nice":
            value -= job.written
        return model.bounded(value)

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


class SimWrite(NamedTuple):
    """One write the live engine would make this cycle, in the order its guardrails and write
    budget take them (rank, job id, kind); `counted`: False for handing back a value Slurm already
    holds (no call to Slurm, never held back)."""

    rank: int
    job_id: int
    kind: str  # "placement" or "priority", as PlannedWrite.kind
    counted: bool
    land: Callable[[], None]


def within_budget(writes: list[SimWrite], limit: int | None) -> list[SimWrite]:
    """The writes that land this cycle: the first `limit` counted ones in the engine's order (None:
    all), and every uncounted one."""
    writes.sort(key=lambda w: (w.rank, w.job_id, w.kind))
    if limit is None:
        return writes
    kept, counted = [], 0
    for write in writes:
        if write.counted:
            if counted >= limit:
                continue
            counted += 1
        kept.append(write)
    return kept


def engine_writes(decisions: Decisions, jobs: Mapping[int, SimJob], declared_ceiling: float | None,
                  settings: SimSettings, views: Mapping[int, Job], inside: frozenset[int] | None,
                  ranked: list[SetPriority], rank: Mapping[int, int], preempts: bool) -> list[SimWrite]:
    """The priority writes the live engine would make for decisions taken on `views` (reconcile.diff
    with the same settings; user changes aside), not yet landed: a job is pending or running as the
    engine saw it. `inside`: the head window (None: none); a pending job beyond it has its value
    handed back. `ranked` and `rank`: Decisions.ranked() and each job's place in it. `preempts`: the
    engine may requeue running jobs (RequeueLimits.preempts); a running job it may not requeue gets
    no write."""
    key = STRATEGY_FIELD[settings.priority_strategy]
    span = settings.priority_span
    tolerance = settings.priority_tolerance * span
    ceiling = score_ceiling(decisions, declared_ceiling)
    negate = key is JobField.NICE
    protected, reserve = frozenset(decisions.protected), settings.priority_reserve
    writes: dict[int, tuple[_Write, SimJob]] = {}
    released: list[SimWrite] = []
    unranked = len(rank)
    pending: dict[int, bool] = {}
    for decision in decisions.priorities:
        job, view = jobs.get(decision.job_id), views.get(decision.job_id)
        if job is None:
            continue
        seen_pending = pending[decision.job_id] = (
            view.state is JobState.PENDING if view is not None else job.state == PENDING)
        if not seen_pending and not (preempts and _requeueable(job, view, settings)):
            writes.pop(decision.job_id, None)  # Slurm reads none of its values until it is pending again
            continue
        if inside is not None and seen_pending and decision.job_id not in inside:
            if job.owned:
                released.append(SimWrite(rank.get(decision.job_id, unranked), decision.job_id, "priority",
                                         job.written != 0, partial(_release, job)))
            writes.pop(decision.job_id, None)  # a later decision for the same job replaces an earlier one
            continue
        wanted = wanted_value(decision, protected, ceiling, span, reserve)
        if negate:
            wanted = -wanted
        value_now = job.written
        written_level = job.written_level if job.owned else None
        if seen_pending:
            needed = abs(wanted - value_now) > tolerance or (job.owned and written_level != decision.level)
        else:  # running: its value only matters once requeued; follow level changes only
            needed = (written_level if written_level is not None else 0) != decision.level
        writes[decision.job_id] = (_Write(decision, value_now, wanted, needed), job)
    chain = []
    for decision in ranked:
        entry = writes.get(decision.job_id)
        if entry is not None and entry[0].decision is decision and pending[decision.job_id]:
            chain.append(entry[0])
    keep_policy_order(chain, key)  # type: ignore[arg-type]
    comments = settings.admin_comment
    landing = []
    for job_id, (write, job) in writes.items():
        level = write.decision.level
        comment = comments and job.comment_level != level  # the AdminComment follows the level
        if write.needed or comment:
            # a call to Slurm when the value moves or the comment does (reconcile.priority_write)
            counted = (write.needed and write.wanted != write.value_now) or comment
            landing.append(SimWrite(rank.get(job_id, unranked), job_id, "priority", counted,
                                    partial(_land, write, job, comments)))
    return released + landing


def _requeueable(job: SimJob, view: Job | None, settings: SimSettings) -> bool:
    """Running, and opted in to preemption, as the engine saw the job (its view)."""
    if view is not None:
        return view.state is JobState.RUNNING and view.requeueable
    return job.state == RUNNING and settings.requeueable and job.preemptible


def _land(write: _Write, job: SimJob, comments: bool) -> None:
    if write.needed:
        job.written, job.written_level, job.owned = write.wanted, write.decision.level, True
    if comments:
        job.comment_level = write.decision.level


def _release(job: SimJob) -> None:
    """The engine hands the value back: SiteFactor/Nice 0 (the trace's jobs carry none of their
    own), Priority back to Slurm's factors."""
    job.written, job.written_level, job.owned = 0, None, False


def cycle_writes(decisions: Decisions, jobs: Mapping[int, SimJob], engine_placed: set[int],
                 declared_ceiling: float | None, settings: SimSettings, views: Mapping[int, Job],
                 decided_at: float, preempts: bool) -> tuple[list[SimWrite], set[int], int, int]:
    """The writes the live engine would land for decisions made on the views of `decided_at`
    (inside the head window, within the guardrails' cap and the write budget, first jobs first):
    the priority writes, the jobs whose constraint it would not write this cycle, and how many
    counted writes land and are held back. `preempts`: as engine_writes'."""
    ranked = decisions.ranked()
    rank = {decision.job_id: index for index, decision in enumerate(ranked)}
    latest = {decision.job_id: decision for decision in decisions.priorities}
    inside = policy_window(ranked, latest, views, decided_at, settings.head_window)
    writes = engine_writes(decisions, jobs, declared_ceiling, settings, views, inside, ranked, rank, preempts)
    unranked, held = len(rank), set()
    for job_id, placement in wanted_placements(decisions, engine_placed).items():
        job = jobs.get(job_id)
        if job is None or job.state != PENDING:
            continue
        if inside is not None and job_id not in inside:
            held.add(job_id)  # beyond the window: its constraint waits until it comes near the head
        elif placement != job.placement:
            writes.append(SimWrite(rank.get(job_id, unranked), job_id, "placement", True, _no_op))
    kept = within_budget(writes, settings.writes_per_cycle)
    landed = sum(1 for w in kept if w.counted)
    held_back = sum(1 for w in writes if w.counted) - landed
    held |= {w.job_id for w in writes if w.kind == "placement"} - {w.job_id for w in kept if w.kind == "placement"}
    return [w for w in kept if w.kind == "priority"], held, landed, held_back


def wanted_placements(decisions: Decisions, engine_placed: set[int]) -> dict[int, Placement]:
    """The constraint each job should carry after the cycle: the policy's, none where it asks to
    clear one, none for a job the engine constrained (`engine_placed`) that the cycle does not name
    again."""
    wanted = policy_placements(decisions)
    for job_id in engine_placed:
        wanted.setdefault(job_id, NO_PLACEMENT)
    return wanted


def policy_placements(decisions: Decisions) -> dict[int, Placement]:
    """The constraint the cycle's decisions ask of each job they name (none to clear one)."""
    wanted: dict[int, Placement] = {}
    for decision in decisions.placements:
        if isinstance(decision, SetPlacement):
            wanted[decision.job_id] = decision.placement
        elif isinstance(decision, ClearPlacement):
            wanted[decision.job_id] = NO_PLACEMENT
    return wanted


def _no_op() -> None:
    """A constraint write lands in the simulator's placements (after the queue order, as it always did)."""
