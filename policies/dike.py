"""Dike: discrete mixed-priority feedback queues plus communication-aware placement.

Our interpretation of Jiang et al., ICASSP 2025 (see docs/policies.md): levels from attained
GPU service (information-agnostic), a fairness/wait mix inside a level, starvation promotion,
consolidation of communication-heavy jobs, steering of light jobs, optional preemption.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Literal

from pydantic import Field, model_validator

from dike_slurm.domain.decisions import PriorInForce, SetPlacement, SetPriority
from dike_slurm.domain.model import AscendingValues, Job, JobState, Placement, Snapshot
from dike_slurm.policies.base import PolicyParams
from dike_slurm.policies.common import (
    ClusterView,
    CommRule,
    Consolidator,
    is_comm_heavy,
    owners_of,
    quantile,
    share_fractions,
    split_active,
    usage_fractions,
)
from dike_slurm.policies.levels import levels_with_promotion, promotion_time
from dike_slurm.policies.node_hold import plan_node_hold, with_node_hold
from dike_slurm.policies.preemption import PreemptionLimits, PreemptionPlan, PreemptionRule
from dike_slurm.policies.stages import Holding, Ordering, Placing, PlacementDecision, Ranking, StagedPolicy, Victims
from dike_slurm.domain.service_prior import Prediction, ServicePrior

# Within-level scores live in [0, WITHIN_SPAN) so that levels always dominate.
WITHIN_SPAN = 0.999


class DikeParams(PolicyParams):
    """Every Dike knob; docs/configuration.md explains each."""

    levels: int = Field(3, ge=2, le=8, description="number of feedback queues K")
    thresholds_gpuh: list[float] | None = Field(
        None, description="K-1 ascending demotion thresholds in GPU-hours; unset: derived from history"
    )
    auto_quantiles: list[float] | None = Field(
        None, description="quantiles of finished jobs' GPU service for derived thresholds; unset: 1-2^-(i+1)"
    )
    min_history_jobs: int = Field(
        50, ge=1,
        description="finished jobs needed before deriving thresholds, and (of those that really ran) before the service "
                    "prior moves any job",
    )
    fallback_thresholds_gpuh: list[float] | None = Field(
        None, description="thresholds while history is short; unset: 8^i GPU-hours (1, 8, 64, ...)"
    )
    fairness_weight: float = Field(0.2, ge=0, description="weight of the owner's fair-share factor 2^(-usage/share)")
    wait_weight: float = Field(0.2, ge=0, description="weight of the time waiting")
    wait_scale_s: float = Field(3600.0, gt=0, description="wait at which the wait term reaches 1/2")
    fairness_by: Literal["user", "account"] = "user"
    promote_knob: float | None = Field(
        8.0, gt=0, description="promote to level 0 when wait >= knob x last run time; unset: never"
    )
    max_wait_s: float | None = Field(2 * 86400.0, gt=0, description="promote after this wait regardless")
    comm_gpus: int = Field(8, ge=1, description="jobs asking at least this many GPUs are communication-heavy")
    comm_rules: list[CommRule] = Field(default_factory=list)
    consolidate: bool = True
    placement_mode: Literal["switches", "leaf_feature"] = "switches"
    leaf_feature_prefix: str = Field("leaf_", description="leaf_feature mode: node feature = prefix + leaf switch name")
    max_consolidation_wait_s: int = Field(1800, ge=0, description="relax the single-leaf constraint after this wait")
    steer_light_jobs: bool = True
    preemption: bool = Field(True, description="requeue running jobs of a worse level so that a blocked job fits")
    min_runtime_s: float = Field(1800.0, ge=0, description="never preempt a run younger than this (seconds since its start)")
    min_runtime_share: float = Field(
        0.5, ge=0, le=1,
        description=(
            "with the service prior: a run expected (from its prediction) to take less than min_runtime_s / share "
            "may be cut after this share of its expected run, never before min_runtime_floor_s; 0: min_runtime_s "
            "for every run"
        ),
    )
    min_runtime_floor_s: float = Field(
        60.0, ge=0, description="with min_runtime_share: the shortest run ever cut, however short its prediction"
    )
    preemption_gain: float = Field(
        0.0, ge=0,
        description=(
            "with the service prior: a running job is requeued only for a job expected to run at least this many "
            "times shorter (expected run times, from both jobs' predictions; a job without one is not held back); "
            "0: the level decides alone. Never, whatever this is, for its own user's job of the same name and size"
        ),
    )
    preemption_backoff: float = Field(
        3.0, ge=1, description="a job preempted k times must run min_runtime_s x backoff^k before it is preempted again"
    )
    checkpoint_interval_s: float = Field(
        1800.0, ge=0, description="the site's checkpoint interval, to estimate the work a requeue loses; 0: unknown"
    )
    max_requeues_per_cycle: int = Field(4, ge=0)
    protect_freed_nodes: bool = Field(
        True,
        description=(
            "the nodes a preemption frees go to the job they were freed for: it is written above every other job of "
            "its tier and keeps its pin until it starts; only the highest tier's first blocked jobs are preempted for"
        ),
    )
    service_prior: bool = Field(
        True,
        description=(
            "rank a job by its expected GPU service, the median of the site's finished jobs of the same user, job "
            "name and GPU count (or a coarser group), until it has attained more; false: information-agnostic, "
            "attained service only (the paper)"
        ),
    )
    prior_shrink_jobs: float = Field(
        10.0, ge=0, description="a group of n finished jobs weighs n / (n + this) against the coarser groups above it"
    )
    prior_sets_level: bool = Field(
        False, description="a job that has not attained its expected service sits at that service's level"
    )
    prior_power_full: float = Field(
        0.0, ge=0, le=1,
        description=(
            "trust the prior's run times fully from this power on (the prior's measured power, "
            "dike_slurm/domain/service_prior.py); below it, in proportion, each expected run time shrunk toward the "
            "median of every finished job, the job's GPUs kept; 0: always fully"
        ),
    )
    prior_min_power: float = Field(
        0.0, ge=-1, le=1,
        description=(
            "the prior moves no job while its measured power is at most this (0: while its history predicts "
            "nothing); negative: whatever its power"
        ),
    )
    prior_weight: float = Field(
        2.0, ge=0, description="weight, beside fairness and wait, of how short the expected service is inside a level"
    )
    hold_nodes: Literal["never", "promoted", "blocked"] = Field(
        "never",
        description=(
            "keep lower-ranked jobs off (ExcNodeList) the nodes likeliest to free soonest for a blocked heavy job "
            "that preemption cannot help: the first such job (blocked), only one starvation promotion lifted "
            "(promoted), or never"
        ),
    )

    @model_validator(mode="after")
    def _check_lists(self) -> DikeParams:
        for name in ("thresholds_gpuh", "auto_quantiles", "fallback_thresholds_gpuh"):
            values = getattr(self, name)
            if values is None:
                continue
            if len(values) != self.levels - 1:
                raise ValueError(f"{name} needs levels-1 = {self.levels - 1} values, got {len(values)}")
            if any(b <= a for a, b in zip(values, values[1:])):
                raise ValueError(f"{name} must be strictly ascending, got {values}")
            if any(v <= 0 for v in values):
                raise ValueError(f"{name} must be positive, got {values}")
        if self.auto_quantiles is not None and any(q >= 1 for q in self.auto_quantiles):
            raise ValueError(f"auto_quantiles must be below 1, got {self.auto_quantiles}")
        return self

    def quantiles(self) -> list[float]:
        return self.auto_quantiles or [1 - 2.0 ** -(i + 1) for i in range(self.levels - 1)]

    def fallback_gpu_s(self) -> list[float]:
        gpuh = self.fallback_thresholds_gpuh or [8.0**i for i in range(self.levels - 1)]
        return [h * 3600.0 for h in gpuh]


def thresholds_gpu_s(snapshot: Snapshot, params: DikeParams) -> tuple[list[float], str]:
    """The demotion thresholds in GPU-seconds and where they came from."""
    if params.thresholds_gpuh is not None:
        return [h * 3600.0 for h in params.thresholds_gpuh], "configured"
    history = snapshot.completed_service_gpu_s
    if len(history) < params.min_history_jobs:
        return params.fallback_gpu_s(), f"fallback ({len(history)} finished jobs < {params.min_history_jobs})"
    derived = [quantile(history, q) for q in params.quantiles()]
    # Keep them strictly ascending and positive even on degenerate histories.
    fixed: list[float] = []
    for value in derived:
        floor = fixed[-1] * 1.01 if fixed else 60.0
        fixed.append(max(value, floor))
    return fixed, f"derived from {len(history)} finished jobs"


class MixedPriorityQueues(Ordering[DikeParams]):
    """K levels of attained (or, with the service prior, expected) GPU service, starvation
    promotion, and inside a level a mix of the owner's fair share, the wait and how short the
    expected service is."""

    def rank(self, snapshot: Snapshot, params: DikeParams) -> Ranking:
        thresholds, origin = thresholds_gpu_s(snapshot, params)
        threshold_text = f"{', '.join(f'{t / 3600:.3g}' for t in thresholds)} gpuh ({origin})"
        pending, running = split_active(snapshot)
        active = pending + running
        owners = owners_of(active, params.fairness_by)
        use = _prior_use(snapshot, params, thresholds)
        inputs = _RankInputs(
            now=snapshot.time, thresholds=thresholds, params=params, use=use,
            by_owner=_owner_terms(snapshot, params, owners, threshold_text),
            weight_total=params.fairness_weight + params.wait_weight + use.weight,
        )
        priorities, expected_of = _rank_jobs(active, owners, inputs)
        return Ranking(priorities, pending, running, expected_of, prior=use.in_force)


def _owner_terms(snapshot: Snapshot, params: DikeParams, owners: list[str], threshold_text: str
                 ) -> dict[str, tuple[float, str]]:
    """What depends only on the owner (its weighted fair-share term, the reason's tail), worked out
    once per owner, not once per job."""
    usage = usage_fractions(snapshot.user_usage_gpu_s, owners)
    shares = share_fractions(snapshot.user_shares, owners)
    by_owner: dict[str, tuple[float, str]] = {}
    for owner in usage:
        # Slurm's classic fair-share factor 2^(-usage/share): 1 for an owner with no recent
        # usage, 1/2 at exactly its share, falling fast beyond it.
        fairness = 2.0 ** (-usage[owner] / shares[owner]) if shares[owner] > 0 else 0.0
        by_owner[owner] = (params.fairness_weight * fairness, f"; thresholds {threshold_text}; fair={fairness:.2f} wait=")
    return by_owner


@dataclass(frozen=True)
class _PriorUse:
    """The service prior as this cycle uses it (prior None: it moves nothing)."""

    prior: ServicePrior | None
    trust: float  # how far its run times are trusted (prior_power_full)
    weight: float  # its weight in the mix (0: none, e.g. no finished job's service to compare with)
    history: AscendingValues  # the finished jobs' service, ascending
    bounds: list[float]  # each level's span of that history, as quantiles (prior_sets_level)
    in_force: PriorInForce | None  # what explain and status show


def _prior_use(snapshot: Snapshot, params: DikeParams, thresholds: list[float]) -> _PriorUse:
    learned = snapshot.service_prior if params.service_prior else None
    prior = learned
    if prior is not None and (prior.jobs < params.min_history_jobs or prior.power <= params.prior_min_power):
        # too little evidence: a handful of finished jobs (one cancelled after a minute, on a
        # new cluster) would be every other job's expected service; or a history that predicts nothing
        prior = None
    history = snapshot.completed_service_gpu_s
    weight = params.prior_weight if prior is not None and len(history) else 0.0
    full = params.prior_power_full
    trust = 1.0 if prior is None or full <= 0 or prior.power >= full else prior.power / full
    # each level's span of the finished jobs' service, as quantiles: with prior_sets_level, how
    # short a job is, is measured inside its own level
    bounds = [0.0, *(history.count_at_most(t) / len(history) for t in thresholds), 1.0] if weight else []
    in_force = None if learned is None else PriorInForce(learned.power, trust if prior is not None else 0.0, weight,
                                                        learned.jobs, learned.not_run)
    return _PriorUse(prior, trust, weight, history, bounds, in_force)


@dataclass(frozen=True)
class _RankInputs:
    """What ranking every active job reads."""

    now: float
    thresholds: list[float]
    params: DikeParams
    use: _PriorUse
    by_owner: dict[str, tuple[float, str]]
    weight_total: float


def _rank_jobs(active: tuple[Job, ...], owners: list[str], inputs: _RankInputs
               ) -> tuple[tuple[SetPriority, ...], dict[int, Prediction]]:
    """Each active job's level, score and reason, and the prior's prediction for it. The loop runs
    for every active job every cycle: what it reads is taken into locals first."""
    now, thresholds, params, by_owner, weight_total = (
        inputs.now, inputs.thresholds, inputs.params, inputs.by_owner, inputs.weight_total)
    prior, trust, prior_weight, history, bounds = (
        inputs.use.prior, inputs.use.trust, inputs.use.weight, inputs.use.history, inputs.use.bounds)
    size = len(history)
    wait_weight, wait_scale, top_level = params.wait_weight, params.wait_scale_s, params.levels - 1
    promote_knob, max_wait_s = params.promote_knob, params.max_wait_s
    shrink_jobs, sets_level = params.prior_shrink_jobs, params.prior_sets_level
    # A running job has waited 0 s: its wait term, score tail and reason tail are the owner's.
    running_wait = 0.0 / (0.0 + wait_scale)
    # the prediction by (user, name, GPUs)
    predictions: dict[tuple[str, str, int], Prediction | None] = {}
    expected_of: dict[int, Prediction] = {}
    priorities: list[SetPriority] = []
    append = priorities.append
    pending_state = JobState.PENDING
    for job, owner in zip(active, owners):
        # levels_with_promotion, inlined for the common case (exactly the same arithmetic)
        service = job.attained_gpu_s - job.attained_at_promotion_gpu_s
        if not service > 0.0:
            service = 0.0
        expected, shown = service, None  # shown: the prediction the reason names
        if prior is not None:
            shape = (job.user, job.name, job.gpus)
            if shape in predictions:
                prediction = predictions[shape]
            else:
                prediction = predictions[shape] = prior.predict(job.user, job.name, job.gpus, shrink_jobs, trust)
            if prediction is not None:
                expected_of[job.job_id] = prediction
                if prediction.gpu_s > service:
                    expected, shown = prediction.gpu_s, prediction
        level = bisect_right(thresholds, expected if sets_level else service)
        promoted = False
        if job.state is pending_state:
            since = job.pending_since
            waited = now - (since if since is not None else job.submit_time)
            if not waited > 0.0:
                waited = 0.0
            if level > 0:
                level, promoted, reason = levels_with_promotion(
                    job, now, thresholds, promote_knob, max_wait_s, expected if sets_level else 0.0)
            else:
                reason = service  # stated when the reason is read (_reason)
            wait = waited / (waited + wait_scale)
        else:
            reason, wait = service, running_wait
        weighted_fairness, tail = by_owner[owner]
        mixed = weighted_fairness + wait_weight * wait
        if prior_weight:
            # where the expected service falls among the finished jobs' (of its level, when the
            # prior sets the level; 1: the shortest)
            low, high = (bounds[level], bounds[level + 1]) if sets_level else (0.0, 1.0)
            if high > low:
                shortness = (high - history.count_at_most(expected) / size) / (high - low)
                mixed += prior_weight * (0.0 if shortness < 0.0 else 1.0 if shortness > 1.0 else shortness)
            else:
                mixed += prior_weight * 0.5
        mix = mixed / weight_total if weight_total else 0.0
        if mix < 0.0:  # min(max(mix, 0.0), 1.0), NaN kept as it was
            mix = 0.0
        elif mix > 1.0:
            mix = 1.0
        score = (top_level - level) + WITHIN_SPAN * mix
        append(SetPriority(job.job_id, level, score, partial(_reason, level, reason, shown, tail, wait), promoted))
    return tuple(priorities), expected_of


def _reason(level: int, attained: str | float, shown: Prediction | None, tail: str, wait: float) -> str:
    """A job's reason, made when it is read (SetPriority): `level=1 attained=0.00gpuh expected=...
    (...); thresholds ...; fair=0.50 wait=0.12`. `attained`: its text, or the service to state."""
    if not isinstance(attained, str):
        attained = f"attained={attained / 3600:.2f}gpuh"
    expected = f" {shown.reason}" if shown is not None else ""
    return f"level={level} {attained}{expected}{tail}{wait:.2f}"


class CommunicationAware(Placing[DikeParams]):
    """Communication-heavy jobs consolidated under as few leaves as hold them; light one-node jobs
    steered to fragmented nodes so that idle leaves stay whole."""

    def place(self, snapshot: Snapshot, params: DikeParams, ranking: Ranking) -> list[PlacementDecision]:
        if not (params.consolidate or params.steer_light_jobs):
            return []
        pending = ranking.pending
        view = ClusterView(snapshot, params.steer_light_jobs)
        excluded = view.excluded
        consolidator = Consolidator(
            view.capacity, view.free_by_leaf, params.max_consolidation_wait_s, params.placement_mode,
            params.leaf_feature_prefix,
        )
        steer = Placement(exclude_nodes=excluded)
        steer_reason = "light job: steered to fragmented nodes to keep idle leaves whole"
        heavy_reasons: dict[tuple[int, int], str] = {}
        comm_gpus, comm_rules, now = params.comm_gpus, params.comm_rules, snapshot.time
        out = []
        for job in pending:
            if is_comm_heavy(job, comm_gpus, comm_rules):
                if params.consolidate:
                    shape = (job.gpus, job.num_nodes)
                    reason = heavy_reasons.get(shape)
                    if reason is None:
                        reason = heavy_reasons[shape] = (
                            f"communication-heavy ({job.gpus} GPUs on {job.num_nodes} node(s)): consolidate"
                        )
                    decision = consolidator.decide(job, now, reason)
                    if decision is not None:
                        out.append(decision)
            elif excluded and job.num_nodes == 1 and view.fits_fragmented(job):
                out.append(SetPlacement(job.job_id, steer, steer_reason))
        return out


def one_leaf_rule(params: DikeParams):
    """Which jobs must fit under one leaf to count as fitting: the heavy ones, when consolidating."""
    comm_gpus, comm_rules = params.comm_gpus, params.comm_rules
    if not params.consolidate:
        return lambda job: False
    return lambda job: is_comm_heavy(job, comm_gpus, comm_rules)


class WorseLevels(Victims[DikeParams]):
    """Running jobs of a worse level, cut only after they ran long enough (anti-thrash with a
    backoff per earlier preemption), cheapest loss since the last checkpoint first."""

    def min_run_s(self, params: DikeParams) -> float | None:
        if not params.preemption:
            return None
        if params.min_runtime_share > 0 and params.service_prior:
            return min(params.min_runtime_s, params.min_runtime_floor_s)  # may_preempt's shortest `needed`
        return params.min_runtime_s

    def gains(self, params: DikeParams, expected: Mapping[int, Prediction]) -> Callable[[Job, Job], bool]:
        gain = params.preemption_gain

        def gains(blocked: Job, victim: Job) -> bool:
            if (blocked.user, blocked.name, blocked.gpus) == (victim.user, victim.name, victim.gpus):
                return False  # the same kind of job: nothing to expect from the swap but the loss
            if gain <= 0:
                return True
            mine, theirs = expected.get(blocked.job_id), expected.get(victim.job_id)
            if mine is None or theirs is None or blocked.gpus <= 0 or victim.gpus <= 0:
                return True
            return mine.gpu_s / blocked.gpus * gain < theirs.gpu_s / victim.gpus

        return gains

    def rule(self, snapshot: Snapshot, params: DikeParams, ranking: Ranking) -> PreemptionRule | None:
        if self.min_run_s(params) is None:
            return None
        expected_of = ranking.expected
        level_of_job = ranking.measure
        now, min_run, backoff = snapshot.time, params.min_runtime_s, params.preemption_backoff
        interval, share, floor = params.checkpoint_interval_s, params.min_runtime_share, params.min_runtime_floor_s

        def may_preempt(victim: Job) -> bool:
            # Anti-thrash: a run is never cut before min_runtime_s, and every earlier preemption
            # of the same job multiplies the run it needs first by `backoff`, so no job is cut more
            # than about log_backoff(run time / min_runtime_s) times, and long jobs are never immune.
            if not victim.requeueable:
                return False
            ran = now - victim.start_time if victim.start_time is not None else 0.0
            needed = min_run
            expected = expected_of.get(victim.job_id) if share > 0 else None
            if expected is not None and victim.gpus > 0:
                # a run expected to be short is cut after a share of it, so that a site whose
                # typical job is shorter than min_runtime_s still preempts
                needed = min(needed, max(floor, share * expected.gpu_s / victim.gpus))
            return ran >= needed * backoff**victim.preemptions

        def loss(victim: Job) -> float:
            ran = now - victim.start_time if victim.start_time is not None else 0.0
            return victim.gpus * (ran % interval if interval > 0 else ran)

        return PreemptionRule(
            gains=self.gains(params, expected_of),
            may_preempt=may_preempt,
            loss=loss,
            one_leaf=one_leaf_rule(params),
            limits=PreemptionLimits(max_requeues=params.max_requeues_per_cycle),
            reason=lambda blocked, victim: (
                f"level {level_of_job[victim.job_id]} job preempted for level-{level_of_job[blocked.job_id]} "
                f"job {blocked.job_id}"
            ),
            protect=params.protect_freed_nodes,
        )


class HoldNodes(Holding[DikeParams]):
    """`hold_nodes`: nodes kept for the first blocked heavy job preemption cannot help (node_hold.py)."""

    def hold(self, snapshot: Snapshot, params: DikeParams, ranking: Ranking, plan: PreemptionPlan,
             placements: list[PlacementDecision]) -> list[PlacementDecision]:
        if params.hold_nodes == "never":
            return placements
        comm_gpus, comm_rules = params.comm_gpus, params.comm_rules
        promoted = {p.job_id for p in ranking.priorities if p.promoted}
        hold = plan_node_hold(
            snapshot, ranking.walk, ranking.running, plan, heavy=lambda job: is_comm_heavy(job, comm_gpus, comm_rules),
            eligible=(lambda job: job.job_id in promoted) if params.hold_nodes == "promoted" else (lambda job: True),
            preemptible=(lambda job: job.requeueable) if params.preemption else (lambda job: False),
            one_leaf=one_leaf_rule(params), max_scan=PreemptionLimits.max_scan,
        )
        return placements if hold is None else with_node_hold(placements, hold)


class DikePolicy(StagedPolicy[DikeParams]):
    name = "dike"
    description = "Dike: K feedback queues from attained GPU-hours, fairness/wait mix, comm-aware placement."
    Params = DikeParams
    ordering = MixedPriorityQueues()
    placing = CommunicationAware()
    victims = WorseLevels()
    holding = HoldNodes()

    def switch_wait_s(self, params: DikeParams) -> int | None:
        return params.max_consolidation_wait_s

    def leaf_feature_prefix(self, params: DikeParams) -> str:
        return params.leaf_feature_prefix

    def promotion_at(self, job: Job, params: DikeParams) -> float | None:
        return promotion_time(job, params.promote_knob, params.max_wait_s)

    def reads_completed_service(self, params: DikeParams) -> bool:
        # derived thresholds: quantiles of finished jobs' service; the prior: where a job's expected service falls
        return params.thresholds_gpuh is None or params.service_prior

    def reads_service_prior(self, params: DikeParams) -> bool:
        return params.service_prior

    def usage_owner(self, params: DikeParams) -> str:
        return params.fairness_by

    def score_ceiling(self, params: DikeParams) -> float | None:
        return float(params.levels)  # level l scores in [levels-1-l, levels-l)
