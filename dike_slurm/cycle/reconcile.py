"""Reconcile: what the policy wants against what Slurm holds, as the writes of one cycle.

No I/O, and nothing outside the cycle is changed but the `DiffMemory` handed to `diff`: its job
contexts are updated and kept for the next cycle (the result is the same without one). Only
values that differ from what Slurm already holds (or, where Slurm does not show a value, from
what the engine remembers writing) become writes; values within the tolerance are kept unless
that would put pending jobs out of the policy's order; a job that is not pending gets a priority
write only when the engine may requeue it (`preempts` and the job opted in: Slurm reads a running
job's priority only once it is pending again); pending jobs beyond the head window
(dike_slurm/domain/head_window.py) only get back what the engine wrote; fields a user took over,
and a SiteFactor someone else set (`site_changes`), are left alone; then the guardrails
(mass-rewrite breaker, writes per cycle).
"""
from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NamedTuple

from dike_slurm.domain.admin_comment import admin_comment_text, comment_level, is_engine_comment
from dike_slurm.slurm.backends.base import ClusterState
from dike_slurm.domain.fields import (
    FieldValue,
    JobField,
    JobUpdate,
    PLACEMENT_FIELDS,
    placement_fields,
    PLACEMENT_ORDER,
    placement_value,
)
from dike_slurm.config import Config
from dike_slurm.cycle.plan import Guard, GuardNote, JobPlan, PlannedWrite
from dike_slurm.domain.decisions import ClearPlacement, Decisions, SetPlacement, SetPriority
from dike_slurm.cycle.field_values import describe_value, is_unset, values_match
from dike_slurm.domain.model import Exemptions, Job, JobState, Placement, Snapshot
from dike_slurm.frozen import frozen_record
from dike_slurm.domain.head_window import policy_window
from dike_slurm.cycle.priority_scale import score_ceiling, wanted_value
from dike_slurm.store.state import JobMemory, OwnedField

STRATEGY_FIELD = {
    "site_factor": JobField.SITE_FACTOR,
    "priority": JobField.PRIORITY,
    "nice": JobField.NICE,
}
NOTHING_OWNED: Mapping[JobField, OwnedField] = MappingProxyType({})  # a job whose fields the engine owns none of


@dataclass(slots=True)
class _JobContext:
    """One job while a cycle is diffed (mutable: the order pass may decide it needs a write).

    A `DiffMemory` keeps it for the next cycle: when the same Job comes back with equal owned
    fields, memory and SiteFactor, and the admin's exempt tag still in (or out of) its AdminComment, the job's side (value_now, exempt, hands_off) is not worked out
    again, and when the reuse key of its PlanInputs is also the one its plan was made from and that
    plan had no writes, the plan is the same but for the decision's reason.
    """

    job: Job
    decision: SetPriority | None
    owned: Mapping[JobField, OwnedField]
    remembered: JobMemory | None
    value_now: int | None
    wanted: int | None
    exempt: str  # why the engine never writes the job (Exemptions.kind), "" when it may
    hands_off: Collection[JobField]
    hands_off_reason: str
    needed: bool
    site_factor: int | None = None  # what Slurm showed (cluster.site_factors) when worked out
    admin_tagged: bool = False  # the admin's exempt tag in its AdminComment when worked out
    lost: bool = False  # the engine's SiteFactor and AdminComment both gone from Slurm (`lost_write`)
    outside: bool = False  # pending beyond the head window (the decision's side: set every cycle)
    unused: bool = False  # not pending, and the engine may not requeue it: Slurm reads none of its priority
    basis: tuple = ()  # the reuse key of the PlanInputs `plan` was made from
    plan: JobPlan | None = None


class PlanInputs(NamedTuple):
    """What `_plan_one` makes a job's plan of besides the job's side (its _JobContext) and its rank.

    The fields before `reason` are the reuse key (`reuse_key`): a plan without writes comes out
    without writes again from an equal key, so a running engine's diff reuses it but for the
    reason. The decisions' reasons come last: they only go into a write. The key is this record's
    own prefix, so an input `_plan_one` reads cannot be left out of it.
    """

    wanted: int | None  # the strategy field's value for the decision (None: no decision)
    level: int | None
    promoted: bool
    needed: bool  # the order walk's verdict: the strategy field is rewritten
    admin_comment: str  # what Slurm shows
    placement: Placement | None  # what a SetPlacement asks
    write_comment: bool  # engine.admin_comment
    outside: bool  # pending beyond the head window
    unused: bool  # not pending, and the engine may not requeue it: no priority write
    reason: str  # the priority decision's reason
    placement_decision: SetPlacement | ClearPlacement | None  # with its own reason

    def reuse_key(self) -> tuple:
        return self[:_REUSE_KEY_FIELDS]


_REUSE_KEY_FIELDS = PlanInputs._fields.index("reason")


class DiffMemory:
    """What a running engine's diff keeps between cycles: each job's context and plan.

    `diff` with a memory returns what it returns without one (tests/unit/test_cycle_equivalence.py,
    test_engine_simulated.py); it skips the work for a job whose inputs equal last cycle's: the
    same Job object (the read and Engine._enrich hand back last cycle's for an unchanged job),
    equal owned fields, memory and SiteFactor, the admin's exempt tag in its AdminComment or not alike,
    under the same settings.
    """

    __slots__ = ("carried", "contexts", "settings")

    def __init__(self) -> None:
        self.contexts: dict[int, _JobContext] = {}
        self.settings: tuple = ()
        self.carried = 0  # jobs whose side the last diff took from the cycle before


def is_exempt(job: Job, config: Config, admin_comment: str = "") -> bool:
    """Whether the engine never writes the job (`[scope]`'s exemptions)."""
    return bool(config.scope.exemptions.kind(job, admin_comment))


def strategy_now(
    key: JobField, job: Job, cluster: ClusterState, owned: Mapping[JobField, OwnedField]
) -> tuple[int | None, FieldValue]:
    """(value Slurm holds now, value before the engine's first change) for the strategy field `key`."""
    mine = owned.get(key)
    if key is JobField.SITE_FACTOR:
        now_value = cluster.site_factors.get(job.job_id)
        if now_value is None:
            now_value = int(mine.written) if mine is not None else 0  # type: ignore[arg-type]
        return now_value, mine.original if mine is not None else now_value
    if key is JobField.PRIORITY:
        return job.priority, mine.original if mine is not None else None
    return job.nice, mine.original if mine is not None else job.nice


@dataclass(frozen=True, kw_only=True)
class DiffInputs:
    """What one cycle's diff reads.

    `declared_ceiling` is the policy's own score bound (`Policy.score_ceiling`), None if unbounded.
    `span`: the largest value written (the engine's `priority_span()`: `engine.priority_span` under
    `engine.priority_mode` against the site's weights); None: `engine.priority_span`. The tolerance
    is a fraction of it. `reserve`: the top values kept for `decisions.protected` (the engine's
    `slurm_priority.protection_reserve` of the site's model). `window`: the pending jobs per partition
    the engine orders (head_window.head_window, the policy's first ones); a pending job beyond it gets
    no write but its strategy field put back to its original; 0: every job is ordered. `preempts`: the
    engine may requeue running jobs (RequeueLimits.preempts); a job not pending gets a priority write
    only when it is running, opted in (`Job.requeueable`) and the engine preempts.
    """

    snapshot: Snapshot
    decisions: Decisions
    cluster: ClusterState
    memory: Mapping[int, JobMemory]
    owned: Mapping[int, Mapping[JobField, OwnedField]]
    config: Config
    declared_ceiling: float | None
    span: int | None = None
    reserve: int = 0
    window: int = 0
    preempts: bool = True


def diff(inputs: DiffInputs, kept: DiffMemory | None = None) -> tuple[list[JobPlan], list[str]]:
    """Each in-scope job's plan (with its writes, before the guardrails) and notes on the decisions.

    `kept`: the engine's memory of its last diff, read and replaced (the result is the same).
    """
    snapshot, config = inputs.snapshot, inputs.config
    key = STRATEGY_FIELD[config.engine.priority_strategy]
    known = {j.job_id: j for j in snapshot.jobs}
    if len(known) != len(snapshot.jobs):  # the backends' reads list each job once
        raise ValueError(f"the snapshot lists job(s) {_repeated(j.job_id for j in snapshot.jobs)} more than once")
    notes = [f"decision for unknown job {d.job_id} ignored" for d in inputs.decisions if d.job_id not in known]
    ranked = inputs.decisions.ranked()
    last: dict[int, _JobContext] = {}
    if kept is not None:
        settings = (key, config.scope.exemptions)
        if kept.settings != settings:
            kept.settings, kept.contexts = settings, {}
        last = kept.contexts
    contexts, carried = _contexts(inputs, key, ranked, known, last)
    keep_policy_order(policy_chain(contexts, ranked, key), key)
    plans = _plans(inputs, contexts, key, {p.job_id: i for i, p in enumerate(ranked)})
    notes.extend(f"job {c.job.display_id}: {c.hands_off_reason}" for c in contexts.values() if _newly_left(c))
    if kept is not None:
        kept.contexts, kept.carried = contexts, carried
    return plans, notes


def _contexts(inputs: DiffInputs, key: JobField, ranked: list[SetPriority], known: Mapping[int, Job],
              last: Mapping[int, _JobContext]) -> tuple[dict[int, _JobContext], int]:
    """Each job's context, with the value wanted and whether it is rewritten on its own account
    (before the order walk); how many took their job's side from `last`."""
    engine, decisions, cluster = inputs.config.engine, inputs.decisions, inputs.cluster
    span = engine.priority_span if inputs.span is None else inputs.span
    tolerance = engine.priority_tolerance * span
    ceiling = score_ceiling(decisions, inputs.declared_ceiling)
    negate = engine.priority_strategy == "nice"  # a negative nice adds to the priority, as SiteFactor does
    exemptions = inputs.config.scope.exemptions
    protected = frozenset(decisions.protected)
    priorities = {p.job_id: p for p in decisions.priorities}
    window = inputs.window
    preempts, pending, running = inputs.preempts, JobState.PENDING, JobState.RUNNING
    inside = policy_window(ranked, priorities, known, inputs.snapshot.time, window) if window else None
    owned_all, memory, site_factors, admin_comments = inputs.owned, inputs.memory, cluster.site_factors, cluster.admin_comments
    admin_tag = exemptions.admin_tag
    contexts: dict[int, _JobContext] = {}
    carried = 0
    for job in inputs.snapshot.jobs:
        job_id = job.job_id
        decision = priorities.get(job_id)
        owned = owned_all.get(job_id, NOTHING_OWNED)
        remembered = memory.get(job_id)
        site_factor = site_factors.get(job_id)
        admin_comment = admin_comments.get(job_id, "")
        context = last.get(job_id)
        if (context is not None and context.job is job and context.site_factor == site_factor
                and context.admin_tagged == (admin_tag in admin_comment)
                and context.lost == lost_write(site_factor, owned, admin_comment)
                and (context.owned is owned or context.owned == owned)
                and (context.remembered is remembered or context.remembered == remembered)):
            # the job's side is last cycle's: Slurm's value, exempt, hands off (the Job carries
            # the comment, Nice, Priority and placement that user_changes compares)
            context.decision, context.owned, context.remembered = decision, owned, remembered
            carried += 1
        else:
            context = _job_side(job, decision, owned, remembered, site_factor, key, cluster, exemptions, admin_comment)
        wanted = None
        if decision is not None:
            wanted = wanted_value(decision, protected, ceiling, span, inputs.reserve)
            if negate:
                wanted = -wanted
        context.wanted = wanted
        state = job.state
        context.outside = inside is not None and state is pending and job_id not in inside
        context.unused = state is not pending and not (preempts and state is running and job.requeueable)
        context.needed = not context.exempt and not context.outside and not context.unused and priority_needed(
            key, job, decision, wanted, context.value_now, tolerance, owned, remembered, context.hands_off)
        contexts[job_id] = context
    return contexts, carried


def _job_side(job: Job, decision: SetPriority | None, owned: Mapping[JobField, OwnedField],
              remembered: JobMemory | None, site_factor: int | None, key: JobField, cluster: ClusterState,
              exemptions: Exemptions, admin_comment: str) -> _JobContext:
    """A job's context worked out anew: Slurm's value of the strategy field, exempt, hands off."""
    value_now, _ = strategy_now(key, job, cluster, owned)
    exempt = exemptions.kind(job, admin_comment)
    hands_off: Collection[JobField] = remembered.hands_off if remembered else ()
    hands_off_reason = remembered.hands_off_reason if remembered else ""
    lost = lost_write(site_factor, owned, admin_comment)
    if not exempt:
        for changed in (user_changes(job, owned, hands_off), site_changes(key, site_factor, owned, hands_off, lost)):
            if changed:
                hands_off = {*hands_off, *changed[0]}
                hands_off_reason = changed[1]
    return _JobContext(job, decision, owned, remembered, value_now, None, exempt, hands_off, hands_off_reason,
                       False, site_factor, exemptions.admin_tag in admin_comment, lost)


def _plans(inputs: DiffInputs, contexts: Mapping[int, _JobContext], key: JobField,
           rank: Mapping[int, int]) -> list[JobPlan]:
    """Each job's plan once the order walk is done; a context's last plan again when it had no
    writes and its inputs' reuse key is the same (with the decision's reason of this cycle)."""
    config, cluster = inputs.config, inputs.cluster
    unranked = len(rank)
    exemptions = config.scope.exemptions
    write_comment = config.engine.admin_comment
    placements = {p.job_id: p for p in inputs.decisions.placements}
    admin_comments = cluster.admin_comments
    plans = []
    for job_id, context in contexts.items():
        decision = context.decision
        if decision is None:
            level, reason, promoted = None, "the policy gave no priority", False
        else:
            level, reason, promoted = decision.level, decision.reason, bool(decision.promoted)
        placement_decision = placements.get(job_id)
        plan_inputs = PlanInputs(
            wanted=context.wanted, level=level, promoted=promoted, needed=context.needed,
            admin_comment=admin_comments.get(job_id, ""),
            placement=placement_decision.placement if isinstance(placement_decision, SetPlacement) else None,
            write_comment=write_comment, outside=context.outside, unused=context.unused, reason=reason,
            placement_decision=placement_decision,
        )
        basis = plan_inputs.reuse_key()
        plan = context.plan
        if plan is None or plan.writes or context.basis != basis:
            plan = _plan_one(context, plan_inputs, key, cluster, rank, unranked, exemptions)
            context.basis = basis
        elif plan.reason != reason:
            plan = _job_plan(
                job=plan.job, managed=plan.managed, note=plan.note, level=level, reason=reason, promoted=promoted,
                value_now=plan.value_now, value_wanted=plan.value_wanted, placement_wanted=plan.placement_wanted,
                writes=(), hands_off=plan.hands_off, hands_off_reason=plan.hands_off_reason,
                outside_window=plan.outside_window, exempt=plan.exempt, priority_unused=plan.priority_unused,
            )
        context.plan = plan
        plans.append(plan)
    return plans


def _repeated(job_ids: Iterable[int]) -> str:
    seen: set[int] = set()
    repeated = []
    for job_id in job_ids:
        if job_id in seen:
            repeated.append(str(job_id))
        seen.add(job_id)
    return ", ".join(repeated)


def _plan_one(context: _JobContext, inputs: PlanInputs, key: JobField, cluster: ClusterState,
              rank: Mapping[int, int], unranked: int, exemptions: Exemptions) -> JobPlan:
    """One job's plan once the order walk has settled whether its strategy field is rewritten: of
    the job's side (`context`), `inputs` and the rank, nothing else."""
    job = context.job
    level, reason, promoted, outside = inputs.level, inputs.reason, inputs.promoted, inputs.outside
    if context.exempt:
        return _job_plan(job=job, managed=False, note=exemptions.note(context.exempt, job), level=level,
                         reason=reason, promoted=promoted, value_now=context.value_now, value_wanted=inputs.wanted,
                         placement_wanted=inputs.placement, writes=(), hands_off=(), hands_off_reason="",
                         outside_window=outside, exempt=context.exempt)
    writes: tuple[PlannedWrite, ...] = ()
    if outside:  # no write but the strategy field handed back; constraints wait for the window
        written = window_release(context, key, cluster, rank.get(job.job_id, unranked))
    else:
        written = priority_write(context, inputs, key, cluster, rank)
    if written is not None:
        writes = (written,)
    if not outside:
        written = placement_write(job, inputs.placement_decision, context.owned, context.hands_off,
                                  rank.get(job.job_id, unranked))
        if written is not None:
            writes = (*writes, written)
    hands_off = tuple(sorted(context.hands_off, key=lambda f: f.value)) if context.hands_off else ()
    return _job_plan(job=job, managed=True, note=context.hands_off_reason, level=level, reason=reason,
                     promoted=promoted, value_now=context.value_now, value_wanted=inputs.wanted,
                     placement_wanted=inputs.placement, writes=writes, hands_off=hands_off,
                     hands_off_reason=context.hands_off_reason, outside_window=outside,
                     priority_unused=inputs.unused)


# A JobPlan, a PlannedWrite and a JobUpdate filled in one step: their frozen __init__ sets one
# field at a time, and a cycle at 50,000 pending jobs builds 55,000 plans and up to 70,000 writes
# (tests/unit/test_cycle_equivalence.py holds them equal to the constructors').
def _job_plan(*, job: Job, managed: bool, note: str, level: int | None, reason: str, promoted: bool,
              value_now: int | None, value_wanted: int | None, placement_wanted: Placement | None,
              writes: tuple[PlannedWrite, ...], hands_off: tuple[JobField, ...], hands_off_reason: str,
              outside_window: bool, exempt: str = "", priority_unused: bool = False) -> JobPlan:
    return frozen_record(JobPlan, {
        "job": job, "managed": managed, "note": note, "level": level, "reason": reason, "promoted": promoted,
        "value_now": value_now, "value_wanted": value_wanted, "placement_wanted": placement_wanted,
        "writes": writes, "hands_off": hands_off, "hands_off_reason": hands_off_reason,
        "outside_window": outside_window, "exempt": exempt, "priority_unused": priority_unused,
    })


def _job_update(job_id: int, values: tuple[tuple[JobField, FieldValue], ...]) -> JobUpdate:
    """`JobUpdate(job_id, values)`; `values` already in JobField order."""
    return frozen_record(JobUpdate, {"job_id": job_id, "values": values})


def _planned_write(job_id: int, update: JobUpdate, undo: JobUpdate, originals: tuple[tuple[JobField, FieldValue], ...],
                   restores: tuple[JobField, ...], reason: str, rank: int,
                   before: tuple[tuple[JobField, FieldValue], ...], kind: str) -> PlannedWrite:
    """`kind` is stored as the cached `PlannedWrite.kind` would compute it (the caller knows it)."""
    return frozen_record(PlannedWrite, {
        "job_id": job_id, "update": update, "undo": undo, "originals": originals, "restores": restores,
        "reason": reason, "rank": rank, "before": before, "kind": kind,
    })


def _newly_left(context: _JobContext) -> bool:
    """A field this cycle found someone else's: hands off now, and not in the job's memory."""
    if not context.hands_off or context.exempt:
        return False
    before = context.remembered.hands_off if context.remembered is not None else ()
    return any(f not in before for f in context.hands_off)


def lost_write(site_factor: int | None, owned: Mapping[JobField, OwnedField], admin_comment: str) -> bool:
    """Slurm lost the engine's write (a controller killed before it saved its state): the SiteFactor
    the engine wrote is back at its original, and the AdminComment the engine wrote is gone too (or
    it owns none); an admin's change leaves the engine's AdminComment in place."""
    mine = owned.get(JobField.SITE_FACTOR)
    if mine is None or site_factor is None or site_factor != mine.original or site_factor == mine.written:
        return False
    comment = owned.get(JobField.ADMIN_COMMENT)
    return comment is None or admin_comment != comment.written


def site_changes(
    key: JobField, site_factor: int | None, owned: Mapping[JobField, OwnedField], already: Collection[JobField],
    lost: bool = False,
) -> tuple[set[JobField], str] | None:
    """A SiteFactor someone else set (an admin's `scontrol update`), where Slurm shows it (sprio):
    not the value the engine wrote, or non-zero on a job whose SiteFactor the engine does not own.
    `lost` (lost_write): Slurm lost the engine's write, which the engine then writes again."""
    if key is not JobField.SITE_FACTOR or site_factor is None or key in already or lost:
        return None
    mine = owned.get(key)
    if mine is None:
        if not site_factor:
            return None
        return {key}, (f"SiteFactor {site_factor} was set outside the engine, which never wrote this job's "
                       f"SiteFactor: left to the site (with the job's AdminComment)")
    if site_factor == int(mine.written):  # type: ignore[arg-type]
        return None
    return {key}, (f"SiteFactor changed to {site_factor} after the engine set {mine.written}: left to the site "
                   f"(with the job's AdminComment)")


def user_changes(
    job: Job, owned: Mapping[JobField, OwnedField], already: Collection[JobField]
) -> tuple[set[JobField], str] | None:
    """Fields a user changed after the engine set them: placement (pending jobs) and Nice."""
    if not owned:
        return None
    if job.state is JobState.PENDING:
        for key in PLACEMENT_ORDER:
            mine = owned.get(key)
            if mine is None or key in already:
                continue
            now_value = placement_value(job.placement, key)
            if not values_match(key, now_value, mine.written):
                return set(PLACEMENT_FIELDS), (
                    f"{key.value} changed to {describe_value(now_value)} after the engine set "
                    f"{describe_value(mine.written)}: placement left to the user"
                )
    mine = owned.get(JobField.NICE)
    if mine is not None and JobField.NICE not in already and job.nice != mine.written:
        return {JobField.NICE}, f"Nice changed to {job.nice} after the engine set {mine.written}: Nice left to the user"
    return None


def priority_needed(
    key: JobField,
    job: Job,
    decision: SetPriority | None,
    wanted: int | None,
    value_now: int | None,
    tolerance: float,
    owned: Mapping[JobField, OwnedField],
    remembered: JobMemory | None,
    hands_off: Collection[JobField],
) -> bool:
    """Whether the strategy field `key` must be rewritten on its own account (drift or level change)."""
    if decision is None or wanted is None or key in hands_off:
        return False
    written_level = remembered.written_level if remembered and key in owned else None
    if job.state is JobState.PENDING:
        drift = abs(wanted - value_now) if value_now is not None else math.inf
        return drift > tolerance or (key in owned and written_level != decision.level)
    # running: its priority only matters if it is requeued; follow level changes only
    return (written_level if written_level is not None else 0) != decision.level


def policy_chain(contexts: Mapping[int, _JobContext], ranked: list[SetPriority], key: JobField) -> list[_JobContext]:
    """The managed pending jobs whose value `keep_policy_order` may rewrite, in the policy's order
    (`ranked`: Decisions.ranked(); a decision that is not its job's, such as a second one for the
    same job, is left out)."""
    chain = []
    for decision in ranked:
        context = contexts.get(decision.job_id)
        if (context is not None and context.decision is decision and context.wanted is not None
                and context.job.state is JobState.PENDING and not context.exempt and not context.outside
                and key not in context.hands_off):
            chain.append(context)
    return chain


def keep_policy_order(chain: list[_JobContext], key: JobField) -> None:
    """Rewrite more values where the tolerance would leave pending jobs out of the policy's order.

    Slurm runs pending jobs by value; values within the tolerance are left alone, which must
    never swap two jobs the policy ranks differently. Walk the managed pending jobs in the
    policy's order (`policy_chain`) and, wherever a job's value is not above the next one's,
    rewrite the one of the pair further from its wanted value, until the values follow the order.
    """
    sign = -1 if key is JobField.NICE else 1  # a lower Nice runs first
    # The walk reads plain lists (it looks at each job several times): scores, whether the job
    # is rewritten, its value in Slurm's order after this cycle, and how far its value is off.
    scores = [c.decision.score for c in chain]  # type: ignore[union-attr]
    needed = [c.needed for c in chain]
    wanted = [sign * int(c.wanted) for c in chain]  # type: ignore[arg-type]
    effective = [w if n else sign * int(c.value_now or 0) for c, n, w in zip(chain, needed, wanted)]
    off = [abs(int(c.wanted) - int(c.value_now or 0)) for c in chain]  # type: ignore[arg-type]

    # One walk: a rewrite changes one job's value, so only its two pairs need another look;
    # step back one pair and go on. Each job is rewritten at most once: O(n) steps in all.
    index, last = 0, len(chain) - 1
    while index < last:
        after = index + 1
        if scores[index] <= scores[after] or effective[index] > effective[after]:
            index = after  # in order
            continue
        if needed[index]:
            if needed[after]:  # both at their wanted values (rounding made them equal)
                index = after
                continue
            pick = after
        elif needed[after]:
            pick = index
        else:  # the one further from its wanted value; the first of the pair on a tie
            pick = index if off[index] >= off[after] else after
        needed[pick] = True
        effective[pick] = wanted[pick]
        index = max(index - 1, 0)
    for context, rewrite in zip(chain, needed):
        context.needed = rewrite


def priority_write(
    context: _JobContext, inputs: PlanInputs, key: JobField, cluster: ClusterState, rank: Mapping[int, int]
) -> PlannedWrite | None:
    """The strategy field `key` (when needed) and the AdminComment of one job, in one update."""
    job, owned, wanted = context.job, context.owned, inputs.wanted
    if wanted is None or inputs.level is None or key in context.hands_off or inputs.unused:
        return None
    strategy = inputs.needed and context.value_now != wanted
    comment_now = inputs.admin_comment
    comment = None
    if inputs.write_comment and is_engine_comment(comment_now) and (strategy or comment_level(comment_now) != inputs.level):
        comment = admin_comment_text(inputs.level, job.counted_gpu_s, inputs.promoted)
        if comment == comment_now:
            comment = None
    if not strategy and comment is None:
        return None  # what most jobs of a quiet cycle come to
    # built in JobField order (the strategy field, then AdminComment), as JobUpdate.of sorts them
    values: list[tuple[JobField, FieldValue]] = []
    originals: list[tuple[JobField, FieldValue]] = []
    before: list[tuple[JobField, FieldValue]] = []
    if strategy:
        value_before, original = strategy_now(key, job, cluster, owned)
        values.append((key, wanted))
        originals.append((key, original))
        before.append((key, value_before))
    if comment is not None:
        mine = owned.get(JobField.ADMIN_COMMENT)
        values.append((JobField.ADMIN_COMMENT, comment))
        originals.append((JobField.ADMIN_COMMENT, mine.original if mine is not None else comment_now))
        before.append((JobField.ADMIN_COMMENT, comment_now))
    job_id = job.job_id
    undo = tuple(originals)
    return _planned_write(job_id, _job_update(job_id, tuple(values)), _job_update(job_id, undo), undo, (),
                          inputs.reason, rank.get(job_id, len(rank)), tuple(before), "priority")


def window_release(context: _JobContext, key: JobField, cluster: ClusterState, rank: int) -> PlannedWrite | None:
    """A job beyond the head window: the strategy field the engine wrote goes back to its original
    (SiteFactor 0 unless the site set one), and the engine lets go of it; None when it owns none."""
    if key not in context.owned or key in context.hands_off:
        return None
    job_id = context.job.job_id
    value_before, original = strategy_now(key, context.job, cluster, context.owned)
    undo = ((key, original),)
    values = undo if value_before != original else ()
    return _planned_write(job_id, _job_update(job_id, values), _job_update(job_id, undo), undo, (key,),
                          "beyond the head window: Slurm's own factors order it", rank, ((key, value_before),),
                          "priority")


def placement_write(
    job: Job,
    decision: SetPlacement | ClearPlacement | None,
    owned: Mapping[JobField, OwnedField],
    hands_off: Collection[JobField],
    rank: int,
) -> PlannedWrite | None:
    """The constraint fields of a pending job: the policy's, or back to the original it replaced."""
    if job.state is not JobState.PENDING:
        return None
    wanted = placement_fields(decision.placement) if isinstance(decision, SetPlacement) else {}
    if not wanted and not any(key in owned for key in PLACEMENT_ORDER):
        return None  # nothing wanted, nothing of ours to put back
    if wanted and job.placement == decision.placement and all(key in wanted for key in owned if key.is_placement):  # type: ignore[union-attr]
        return None  # Slurm holds what is wanted, and nothing of ours is left to put back
    values: dict[JobField, FieldValue] = {}
    originals: dict[JobField, FieldValue] = {}
    before: dict[JobField, FieldValue] = {}
    restores: list[JobField] = []
    for key in PLACEMENT_ORDER:
        if key in hands_off:
            continue
        current = placement_value(job.placement, key)
        mine = owned.get(key)
        if key in wanted:
            if mine is None and not is_unset(key, current):
                continue  # the user's own request: never overridden
            if values_match(key, current, wanted[key]):
                continue
            values[key] = wanted[key]
            originals[key] = mine.original if mine is not None else current
            before[key] = current
        elif mine is not None:  # the policy no longer wants it: put the original back
            if not values_match(key, current, mine.original):
                values[key] = mine.original
                originals[key] = mine.original
                before[key] = current
            restores.append(key)
    if not values and not restores:
        return None
    reason = decision.reason if decision is not None else "constraint no longer wanted"
    return _planned_write(job.job_id, JobUpdate.of(job.job_id, values), JobUpdate.of(job.job_id, originals),
                          tuple(originals.items()), tuple(restores), reason, rank, tuple(before.items()),
                          "placement" if values else "priority")  # a release alone changes no placement field


def guardrails(
    plans: list[JobPlan], owned: Mapping[int, Mapping[JobField, OwnedField]], config: Config
) -> tuple[tuple[PlannedWrite, ...], tuple[PlannedWrite, ...], list[GuardNote]]:
    """Circuit breaker on mass rewrites, then at most max_changes_per_cycle calls, first jobs first.

    Returns (writes kept, writes held back for a later cycle, what each guardrail that acted did).
    """
    engine = config.engine
    key = STRATEGY_FIELD[engine.priority_strategy]
    candidates = sorted(
        (w for p in plans for w in p.writes), key=lambda w: (w.rank, w.job_id, w.kind)
    )
    notes: list[GuardNote] = []
    previously_written = [p for p in plans if p.managed and key in owned.get(p.job.job_id, NOTHING_OWNED)]
    # a value handed back (a job leaving the head window) undoes the engine: not what the breaker guards against
    rewritten = [p for p in previously_written
                 if p.writes and any(key in w.update.fields and key not in w.restores for w in p.writes)]
    if (
        len(previously_written) >= engine.breaker_min_jobs
        and previously_written
        and len(rewritten) / len(previously_written) > engine.breaker_change_fraction
    ):
        notes.append(GuardNote(
            Guard.BREAKER,
            f"circuit breaker: {len(rewritten)} of {len(previously_written)} jobs the engine already set would "
            f"change (> {engine.breaker_change_fraction:.0%}); nothing written this cycle",
        ))
        return (), tuple(candidates), notes
    limit = engine.max_changes_per_cycle
    changing = [w for w in candidates if w.update.values]
    releases_only = [w for w in candidates if not w.update.values]
    kept, held = changing[:limit], changing[limit:]
    if held:
        notes.append(GuardNote(Guard.MAX_CHANGES,
                               f"max_changes_per_cycle={limit}: {len(held)} write(s) left for the next cycle"))
    return tuple(kept + releases_only), tuple(held), notes
