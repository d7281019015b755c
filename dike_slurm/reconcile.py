"""Reconcile: what the policy wants against what Slurm holds, as the writes of one cycle.

Pure functions, no I/O: only values that differ from what Slurm already holds (or, where Slurm
does not show a value, from what the engine remembers writing) become writes; values within the
tolerance are kept unless that would put pending jobs out of the policy's order; fields a user
took over are left alone; then the guardrails (mass-rewrite breaker, writes per cycle).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from dike_slurm.admin_comment import admin_comment_text, comment_level, is_engine_comment
from dike_slurm.backends.base import (
    PLACEMENT_FIELDS,
    PLACEMENT_ORDER,
    ClusterState,
    FieldValue,
    JobField,
    JobUpdate,
    SwitchRequest,
    placement_fields,
    placement_value,
)
from dike_slurm.config import Config
from dike_slurm.decisions import ClearPlacement, Decisions, Requeue, SetPlacement, SetPriority
from dike_slurm.model import Job, JobState, Placement, Snapshot
from dike_slurm.state import JobMemory, OwnedField
from dike_slurm.usage import Run

STRATEGY_FIELD = {
    "site_factor": JobField.SITE_FACTOR,
    "priority": JobField.PRIORITY,
    "nice": JobField.NICE,
}


@dataclass(frozen=True)
class PlannedWrite:
    """One call that changes some fields of one job, with the update that undoes it."""

    job_id: int
    update: JobUpdate
    undo: JobUpdate
    originals: tuple[tuple[JobField, FieldValue], ...]  # value before the engine first changed each field
    restores: tuple[JobField, ...]  # fields put back to their original: the engine lets go of them
    reason: str
    rank: int  # position of the job in the policy order; guardrails keep the first ones
    before: tuple[tuple[JobField, FieldValue], ...] = ()  # what Slurm held for each field just before this write

    @functools.cached_property  # a sort key of the guardrails, over every write of the cycle
    def kind(self) -> str:
        return "placement" if any(f.is_placement for f in self.update.fields) else "priority"


@dataclass(frozen=True)
class JobPlan:
    """What the engine decided for one in-scope job, and why."""

    job: Job
    managed: bool
    note: str  # why the job is not managed, or what the engine leaves alone
    level: int | None
    reason: str
    promoted: bool
    value_now: int | None  # the strategy field (SiteFactor, Priority or Nice) as Slurm has it
    value_wanted: int | None
    placement_wanted: Placement | None  # None: the policy asks for no constraint
    writes: tuple[PlannedWrite, ...]
    hands_off: tuple[JobField, ...] = ()
    hands_off_reason: str = ""


@dataclass(frozen=True)
class CyclePlan:
    """Everything one cycle would do; `writes` and `requeues` passed the guardrails."""

    time: float
    policy: str
    strategy: str
    jobs: tuple[JobPlan, ...]
    writes: tuple[PlannedWrite, ...]
    held_back: tuple[PlannedWrite, ...]
    requeues: tuple[Requeue, ...]
    notes: tuple[str, ...]
    out_of_scope: int
    new_runs: tuple[Run, ...] = ()
    accounting_skipped: Mapping[str, int] = field(default_factory=dict)
    read_calls: int = 0
    accounting_ok: bool = True  # False: sacct failed; levels come from the state store alone
    breaker: str = ""  # why the mass-rewrite breaker tripped in this plan ("" when it did not)
    outside: tuple[Job, ...] = ()  # the active jobs outside the scope (`queue` and `explain` name them)

    def job(self, job_id: int) -> JobPlan | None:
        return next((p for p in self.jobs if p.job.job_id == job_id), None)


@dataclass(slots=True)
class _JobContext:
    """One job while a cycle is diffed (mutable: the order pass may decide it needs a write)."""

    job: Job
    decision: SetPriority | None
    owned: Mapping[JobField, OwnedField]
    remembered: JobMemory | None
    value_now: int | None
    wanted: int | None
    exempt: bool
    hands_off: set[JobField]
    hands_off_reason: str
    needed: bool


def is_exempt(job: Job, config: Config) -> bool:
    return config.scope.exempt_tag in (job.comment or "")


def score_ceiling(decisions: Decisions, declared: float | None) -> float:
    """What scores are mapped against: the policy's own bound, else a power of two above them all.

    Scores are mapped onto [1, span] against this ceiling. A fixed bound (Dike: the number of
    levels) keeps every job's value still while other jobs come and go; for unbounded scores a
    power of two changes only when the largest score crosses one.
    """
    if declared is not None and declared > 0:
        return float(declared)
    top = max((p.score for p in decisions.priorities), default=1.0)
    return float(2 ** max(0, math.ceil(math.log2(max(top, 1.0)))))


def priority_value(score: float, ceiling: float, span: int) -> int:
    """A policy score as an integer in [1, span]; higher runs first."""
    clamped = min(max(score, 0.0), ceiling)
    return 1 + round((span - 1) * clamped / ceiling)


def values_match(key: JobField, current: FieldValue, wanted: FieldValue) -> bool:
    """Whether Slurm holds the wanted value (Slurm caps a Switches wait at max_switch_wait)."""
    if key is JobField.SWITCHES:
        assert isinstance(current, SwitchRequest) and isinstance(wanted, SwitchRequest)
        if current.count != wanted.count:
            return False
        if not wanted.count or wanted.wait_s is None or current.wait_s is None:
            return True
        return current.wait_s <= wanted.wait_s
    if key in (JobField.EXCLUDED_NODES, JobField.REQUIRED_NODES):
        return set(current or ()) == set(wanted or ())  # type: ignore[arg-type]
    return current == wanted


def is_unset(key: JobField, value: FieldValue) -> bool:
    """A placement field the job does not use (no user request to preserve)."""
    if key is JobField.SWITCHES:
        return isinstance(value, SwitchRequest) and value.count == 0
    return not value


def describe_value(value: FieldValue) -> str:
    if isinstance(value, SwitchRequest):
        return f"{value.count}@{value.wait_s}s" if value.count and value.wait_s is not None else str(value.count)
    if isinstance(value, tuple):
        return ",".join(value) or "''"
    if value is None:
        return "(Slurm's own)"
    return repr(value) if isinstance(value, str) else str(value)


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


def diff(
    snapshot: Snapshot,
    decisions: Decisions,
    cluster: ClusterState,
    memory: Mapping[int, JobMemory],
    owned_all: Mapping[int, Mapping[JobField, OwnedField]],
    config: Config,
    declared_ceiling: float | None,
) -> tuple[list[JobPlan], list[str]]:
    """Each in-scope job's plan (with its writes, before the guardrails) and notes on the decisions.

    `declared_ceiling` is the policy's own score bound (`Policy.score_ceiling`), None if unbounded.
    """
    engine = config.engine
    key = STRATEGY_FIELD[engine.priority_strategy]
    span = engine.priority_span
    tolerance = engine.priority_tolerance * span
    ceiling = score_ceiling(decisions, declared_ceiling)
    known = {j.job_id for j in snapshot.jobs}
    notes = [f"decision for unknown job {d.job_id} ignored" for d in decisions if d.job_id not in known]
    rank = {job_id: i for i, job_id in enumerate(decisions.order())}
    priorities = {p.job_id: p for p in decisions.priorities}
    placements = {p.job_id: p for p in decisions.placements}
    contexts = []
    for job in snapshot.jobs:
        decision = priorities.get(job.job_id)
        owned = owned_all.get(job.job_id, {})
        remembered = memory.get(job.job_id)
        value_now, _ = strategy_now(key, job, cluster, owned)
        wanted = None
        if decision is not None:
            wanted = priority_value(decision.score, ceiling, span)
            if engine.priority_strategy == "nice":
                wanted = -wanted  # a negative nice adds to the priority, as SiteFactor does
        exempt = is_exempt(job, config)
        hands_off = set(remembered.hands_off) if remembered else set()
        hands_off_reason = remembered.hands_off_reason if remembered else ""
        changed = None if exempt else user_changes(job, owned, hands_off)
        if changed:
            hands_off |= changed[0]
            hands_off_reason = changed[1]
        needed = (
            not exempt
            and priority_needed(key, job, decision, wanted, value_now, tolerance, owned, remembered, hands_off)
        )
        contexts.append(_JobContext(job, decision, owned, remembered, value_now, wanted, exempt, hands_off,
                                    hands_off_reason, needed))
    keep_policy_order(contexts, key)
    plans = []
    for context in contexts:
        job, decision = context.job, context.decision
        placement_decision = placements.get(job.job_id)
        common = dict(
            job=job,
            level=decision.level if decision else None,
            reason=decision.reason if decision else "the policy gave no priority",
            promoted=bool(decision and decision.promoted),
            value_now=context.value_now,
            value_wanted=context.wanted,
            placement_wanted=(
                placement_decision.placement if isinstance(placement_decision, SetPlacement) else None
            ),
        )
        if context.exempt:
            plans.append(JobPlan(managed=False, note=f"exempt ({config.scope.exempt_tag} in comment)",
                                 writes=(), **common))
            continue
        writes = []
        written = priority_write(context, key, cluster, rank, engine.admin_comment)
        if written is not None:
            writes.append(written)
        written = placement_write(
            job, placement_decision, context.owned, context.hands_off, rank.get(job.job_id, len(rank))
        )
        if written is not None:
            writes.append(written)
        plans.append(
            JobPlan(managed=True, note=context.hands_off_reason, writes=tuple(writes),
                    hands_off=tuple(sorted(context.hands_off, key=lambda f: f.value)) if context.hands_off else (),
                    hands_off_reason=context.hands_off_reason, **common)
        )
    return plans, notes


def user_changes(
    job: Job, owned: Mapping[JobField, OwnedField], already: set[JobField]
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
    hands_off: set[JobField],
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


def keep_policy_order(contexts: list[_JobContext], key: JobField) -> None:
    """Rewrite more values where the tolerance would leave pending jobs out of the policy's order.

    Slurm runs pending jobs by value; values within the tolerance are left alone, which must
    never swap two jobs the policy ranks differently. Walk the managed pending jobs in the
    policy's order and, wherever a job's value is not above the next one's, rewrite the one of
    the pair further from its wanted value, until the values follow the order.
    """
    sign = -1 if key is JobField.NICE else 1  # a lower Nice runs first
    chain = sorted(
        (c for c in contexts
         if c.job.state is JobState.PENDING and c.decision is not None and c.wanted is not None
         and not c.exempt and key not in c.hands_off),
        key=lambda c: (-c.decision.score, c.job.job_id),  # type: ignore[union-attr]
    )

    def effective(context: _JobContext) -> int:
        value = context.wanted if context.needed else (context.value_now or 0)
        return sign * int(value)  # type: ignore[arg-type]

    # One walk: a rewrite changes one job's value, so only its two pairs need another look;
    # step back one pair and go on. Each job is rewritten at most once: O(n) steps in all.
    index = 0
    while index < len(chain) - 1:
        first, second = chain[index], chain[index + 1]
        assert first.decision is not None and second.decision is not None
        in_order = first.decision.score <= second.decision.score or effective(first) > effective(second)
        candidates = [] if in_order else [c for c in (first, second) if not c.needed]
        if not candidates:  # in order, or both at their wanted values (rounding made them equal)
            index += 1
            continue
        pick = max(candidates, key=lambda c: abs(int(c.wanted) - int(c.value_now or 0)))  # type: ignore[arg-type]
        pick.needed = True
        index = max(index - 1, 0)


def priority_write(
    context: _JobContext, key: JobField, cluster: ClusterState, rank: Mapping[int, int], write_comment: bool
) -> PlannedWrite | None:
    """The strategy field `key` (when needed) and the AdminComment of one job, in one update."""
    job, decision, owned = context.job, context.decision, context.owned
    if decision is None or context.wanted is None or key in context.hands_off:
        return None
    values: dict[JobField, FieldValue] = {}
    originals: dict[JobField, FieldValue] = {}
    before: dict[JobField, FieldValue] = {}
    if context.needed and context.value_now != context.wanted:
        values[key] = context.wanted
        before[key], originals[key] = strategy_now(key, job, cluster, owned)
    comment_now = cluster.admin_comments.get(job.job_id, "")
    if write_comment and is_engine_comment(comment_now):
        if values or comment_level(comment_now) != decision.level:
            text = admin_comment_text(decision.level, job.counted_gpu_s, decision.promoted)
            if text != comment_now:
                values[JobField.ADMIN_COMMENT] = text
                mine = owned.get(JobField.ADMIN_COMMENT)
                originals[JobField.ADMIN_COMMENT] = mine.original if mine is not None else comment_now
                before[JobField.ADMIN_COMMENT] = comment_now
    if not values:
        return None
    return PlannedWrite(
        job.job_id,
        JobUpdate.of(job.job_id, values),
        JobUpdate.of(job.job_id, originals),
        tuple(originals.items()),
        (),
        decision.reason,
        rank.get(job.job_id, len(rank)),
        tuple(before.items()),
    )


def placement_write(
    job: Job,
    decision: SetPlacement | ClearPlacement | None,
    owned: Mapping[JobField, OwnedField],
    hands_off: set[JobField],
    rank: int,
) -> PlannedWrite | None:
    """The constraint fields of a pending job: the policy's, or back to the original it replaced."""
    if job.state is not JobState.PENDING:
        return None
    wanted = placement_fields(decision.placement) if isinstance(decision, SetPlacement) else {}
    if not wanted and not any(key in owned for key in PLACEMENT_ORDER):
        return None  # nothing wanted, nothing of ours to put back
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
    return PlannedWrite(
        job.job_id,
        JobUpdate.of(job.job_id, values),
        JobUpdate.of(job.job_id, originals),
        tuple(originals.items()),
        tuple(restores),
        reason,
        rank,
        tuple(before.items()),
    )


def guardrails(
    plans: list[JobPlan], owned: Mapping[int, Mapping[JobField, OwnedField]], config: Config
) -> tuple[tuple[PlannedWrite, ...], tuple[PlannedWrite, ...], list[str]]:
    """Circuit breaker on mass rewrites, then at most max_changes_per_cycle calls, first jobs first.

    Returns (writes kept, writes held back for a later cycle, notes).
    """
    engine = config.engine
    key = STRATEGY_FIELD[engine.priority_strategy]
    candidates = sorted(
        (w for p in plans for w in p.writes), key=lambda w: (w.rank, w.job_id, w.kind)
    )
    notes = []
    previously_written = [p for p in plans if p.managed and key in owned.get(p.job.job_id, {})]
    rewritten = [p for p in previously_written if any(key in w.update.fields for w in p.writes)]
    if (
        len(previously_written) >= engine.breaker_min_jobs
        and previously_written
        and len(rewritten) / len(previously_written) > engine.breaker_change_fraction
    ):
        notes.append(
            f"circuit breaker: {len(rewritten)} of {len(previously_written)} jobs the engine already set would "
            f"change (> {engine.breaker_change_fraction:.0%}); nothing written this cycle"
        )
        return (), tuple(candidates), notes
    limit = engine.max_changes_per_cycle
    changing = [w for w in candidates if w.update.values]
    releases_only = [w for w in candidates if not w.update.values]
    kept, held = changing[:limit], changing[limit:]
    if held:
        notes.append(f"max_changes_per_cycle={limit}: {len(held)} write(s) left for the next cycle")
    return tuple(kept + releases_only), tuple(held), notes
