"""The live cycle: read the cluster -> policy.decide -> diff -> guardrails -> apply -> audit.

Only values that differ from what Slurm already holds (or, where Slurm does not show a value,
from what the engine remembers writing) are written, so a quiet cluster gets no writes.
`plan()` only reads; `apply()` writes through the backend and records every change, with the
value it replaced and the command that undoes it, in the state store.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from dike_slurm.backends.base import (
    PLACEMENT_FIELDS,
    PLACEMENT_ORDER,
    Backend,
    ClusterState,
    FieldValue,
    JobField,
    JobUpdate,
    SwitchRequest,
    WriteOutcome,
    placement_fields,
    placement_value,
)
from dike_slurm.config import Config
from dike_slurm.decisions import ClearPlacement, Decisions, Requeue, SetPlacement, SetPriority
from dike_slurm.errors import PolicyError, SlurmError
from dike_slurm.gcpause import paused_gc
from dike_slurm.model import Job, JobState, Placement, Snapshot
from dike_slurm.policies.base import Policy
from dike_slurm.registry import default_registry
from dike_slurm.requeue_guard import guard_requeues, requeue_groups, requeue_limits
from dike_slurm.state import AuditEntry, CycleSummary, JobMemory, OwnedField, StateStore
from dike_slurm.usage import (
    JobService,
    Run,
    completed_service,
    current_runs,
    decayed_usage,
    job_service,
    merge_runs,
    runs_from_records,
)

log = logging.getLogger("dike_slurm.engine")

SACCT_OVERLAP_S = 900.0  # each cycle re-reads accounting from this long before the last read
FORGET_AFTER_S = 86400.0  # jobs not active for this long are dropped from the state (not the audit)
_COMMENT_LEVEL = re.compile(r"^dike:level=(\d+)\b")

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

    def job(self, job_id: int) -> JobPlan | None:
        return next((p for p in self.jobs if p.job.job_id == job_id), None)


@dataclass(frozen=True)
class CycleReport:
    """What a cycle did (nothing but the plan when not applied)."""

    plan: CyclePlan
    applied: bool
    outcomes: tuple[tuple[PlannedWrite, WriteOutcome], ...]
    requeued: tuple[tuple[Requeue, WriteOutcome], ...]
    errors: int
    seconds: float
    slurm_calls: int
    write_calls: int
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RevertPlan:
    """The writes that put every field the engine owns back to its original value."""

    writes: tuple[PlannedWrite, ...]
    released: tuple[tuple[int, JobField, str], ...]  # (job, field, why) let go without a write


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


def in_scope(job: Job, config: Config) -> bool:
    """Partition (every listed one), account and QOS all in the configured scope."""
    scope = config.scope
    partitions = [p for p in job.partition.split(",") if p]
    if scope.partitions and (not partitions or not set(partitions) <= set(scope.partitions)):
        return False
    if scope.accounts and job.account not in scope.accounts:
        return False
    return not (scope.qos and job.qos not in scope.qos)


def is_exempt(job: Job, config: Config) -> bool:
    return config.scope.exempt_tag in (job.comment or "")


def opted_in_to_preemption(job: Job, config: Config) -> bool:
    """The site's opt-in rule for live preemption: the job's comment tag, its partition or its QOS."""
    engine = config.engine
    return (
        engine.preemptible_tag in (job.comment or "")
        or bool(set(job.partition.split(",")) & set(engine.preemptible_partitions))
        or job.qos in engine.preemptible_qos
    )


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


def admin_comment_text(level: int, attained_gpu_s: float, promoted: bool) -> str:
    """The AdminComment the engine writes, built from its own numbers only."""
    text = f"dike:level={level} attained={attained_gpu_s / 3600:.1f}gpuh"
    return text + " promoted" if promoted else text


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


class Engine:
    """One cluster, one policy, one state store."""

    def __init__(
        self,
        config: Config,
        backend: Backend,
        store: StateStore,
        *,
        policy: Policy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.backend = backend
        self.store = store
        self.policy = policy or default_registry().create(config.engine.policy)
        if not self.policy.live:
            raise PolicyError(
                f"policy {self.policy.name!r} is replay-only (it needs true job durations) and cannot run live"
            )
        self.params = config.policy_params(self.policy.name)
        self.strategy = config.engine.priority_strategy
        self.strategy_field = STRATEGY_FIELD[self.strategy]
        self.clock = clock

    # ---------------------------------------------------------------- plan (reads only)

    def plan(self) -> CyclePlan:
        """Read the cluster and accounting, decide, and diff; writes nothing anywhere."""
        with paused_gc():
            return self._plan()

    def _plan(self) -> CyclePlan:
        calls_before = self.backend.calls
        cluster = self.backend.read_cluster()
        now = cluster.time
        memory = self.store.jobs()
        owned = self.store.owned()
        new_runs, skipped, accounting_note = self._read_accounting(now)
        active_in_scope = [j for j in cluster.jobs if in_scope(j, self.config)]
        runs = merge_runs(self.store.runs(), new_runs, current_runs(active_in_scope))
        service = job_service(runs, now)
        fairness_by = self.policy.usage_owner(self.params)
        usage = decayed_usage(runs, now, self.config.accounting.usage_half_life_h * 3600.0, fairness_by)
        jobs = tuple(self._enrich(j, service, memory, owned, cluster) for j in active_in_scope)
        snapshot = Snapshot(
            time=now,
            jobs=jobs,
            nodes=self._nodes_in_scope(cluster),
            topology=cluster.topology,
            user_usage_gpu_s=usage,
            user_shares=dict(self.config.accounting.user_shares),
            completed_service_gpu_s=(
                completed_service(runs, now) if self.policy.reads_completed_service(self.params) else ()
            ),
        )
        decisions = self.policy.decide(snapshot, self.params, random.Random(self.config.engine.seed))
        decisions, requeue_notes = guard_requeues(
            decisions,
            {j.job_id: j for j in jobs if j.state is JobState.RUNNING and not is_exempt(j, self.config)},
            now,
            requeue_limits(self.policy, self.params, self.config.engine.max_requeues_per_cycle),
        )
        plans, notes = self._diff(snapshot, decisions, cluster, memory, owned)
        writes, held_back, guard_notes = self._guardrails(plans, owned)
        if accounting_note:
            notes.insert(0, accounting_note)
        notes.extend(requeue_notes)
        requeues = decisions.requeues
        return CyclePlan(
            time=now,
            policy=self.policy.name,
            strategy=self.strategy,
            jobs=tuple(plans),
            writes=writes,
            held_back=held_back,
            requeues=requeues[: max(0, self.config.engine.max_changes_per_cycle - len(writes))],
            notes=tuple(notes + guard_notes),
            out_of_scope=len(cluster.jobs) - len(active_in_scope),
            new_runs=tuple(new_runs),
            accounting_skipped=dict(skipped),
            read_calls=self.backend.calls - calls_before,
            accounting_ok=accounting_note is None,
            breaker=next((n for n in guard_notes if n.startswith("circuit breaker")), ""),
        )

    def _read_accounting(self, now: float):
        lookback_start = now - self.config.accounting.lookback_days * 86400.0
        last = self.store.last_sync()
        start = lookback_start if last is None else max(lookback_start, last - SACCT_OVERLAP_S)
        try:
            result = self.backend.accounting(start, now)
        except SlurmError as exc:
            # slurmdbd (or its database) is down: keep what the state store knows, do not reset
            # anyone to level 0, and do not advance the sync point (the window is read later).
            log.warning("accounting unavailable: %s", exc)
            return [], {}, (
                f"accounting unavailable ({exc}); levels from the state store's "
                f"{len(self.store.runs())} remembered run(s) and the queue; sync point not advanced"
            )
        finished = [r for r in runs_from_records(result.records) if r.end is not None]
        return finished, result.skipped, None

    def _nodes_in_scope(self, cluster: ClusterState):
        wanted = set(self.config.scope.partitions)
        if not wanted:
            return cluster.nodes
        return tuple(n for n in cluster.nodes if wanted & set(n.partitions))

    def _enrich(
        self,
        job: Job,
        service: Mapping[int, JobService],
        memory: Mapping[int, JobMemory],
        owned: Mapping[int, Mapping[JobField, OwnedField]],
        cluster: ClusterState,
    ) -> Job:
        """The job with what the queue does not say: service over all runs, promotions, site factor."""
        got = service.get(job.job_id, JobService())
        remembered = memory.get(job.job_id)
        pending_since = job.submit_time
        if job.state is JobState.PENDING and got.last_end is not None:
            pending_since = max(job.submit_time, got.last_end)
        site_factor = cluster.site_factors.get(job.job_id)
        if site_factor is None and JobField.SITE_FACTOR in owned.get(job.job_id, {}):
            site_factor = owned[job.job_id][JobField.SITE_FACTOR].written  # type: ignore[assignment]
        return job.with_changes(
            attained_gpu_s=got.attained_gpu_s,
            attained_at_promotion_gpu_s=min(
                remembered.attained_at_promotion_gpu_s if remembered else 0.0, got.attained_gpu_s
            ),
            run_count=got.run_count,
            last_run_s=got.last_run_s,
            preemptions=remembered.requeues if remembered else 0,
            pending_since=pending_since,
            requeueable=job.requeueable and opted_in_to_preemption(job, self.config),
            site_factor=site_factor,
        )

    def _strategy_now(
        self, job: Job, cluster: ClusterState, owned: Mapping[JobField, OwnedField]
    ) -> tuple[int | None, FieldValue]:
        """(value Slurm holds now, value before the engine's first change) for the strategy field."""
        key = self.strategy_field
        mine = owned.get(key)
        if key is JobField.SITE_FACTOR:
            now_value = cluster.site_factors.get(job.job_id)
            if now_value is None:
                now_value = int(mine.written) if mine is not None else 0  # type: ignore[arg-type]
            return now_value, mine.original if mine is not None else now_value
        if key is JobField.PRIORITY:
            return job.priority, mine.original if mine is not None else None
        return job.nice, mine.original if mine is not None else job.nice

    def _diff(
        self,
        snapshot: Snapshot,
        decisions: Decisions,
        cluster: ClusterState,
        memory: Mapping[int, JobMemory],
        owned_all: Mapping[int, Mapping[JobField, OwnedField]],
    ) -> tuple[list[JobPlan], list[str]]:
        engine = self.config.engine
        span = engine.priority_span
        tolerance = engine.priority_tolerance * span
        ceiling = score_ceiling(decisions, self.policy.score_ceiling(self.params))
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
            value_now, _ = self._strategy_now(job, cluster, owned)
            wanted = None
            if decision is not None:
                wanted = priority_value(decision.score, ceiling, span)
                if self.strategy == "nice":
                    wanted = -wanted  # a negative nice adds to the priority, as SiteFactor does
            exempt = is_exempt(job, self.config)
            hands_off = set(remembered.hands_off) if remembered else set()
            hands_off_reason = remembered.hands_off_reason if remembered else ""
            changed = None if exempt else self._user_changes(job, owned, hands_off)
            if changed:
                hands_off |= changed[0]
                hands_off_reason = changed[1]
            needed = (
                not exempt
                and self._priority_needed(job, decision, wanted, value_now, tolerance, owned, remembered, hands_off)
            )
            contexts.append(_JobContext(job, decision, owned, remembered, value_now, wanted, exempt, hands_off,
                                        hands_off_reason, needed))
        self._keep_policy_order(contexts)
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
                plans.append(JobPlan(managed=False, note=f"exempt ({self.config.scope.exempt_tag} in comment)",
                                     writes=(), **common))
                continue
            writes = []
            priority_write = self._priority_write(context, cluster, rank)
            if priority_write is not None:
                writes.append(priority_write)
            placement_write = self._placement_write(
                job, placement_decision, context.owned, context.hands_off, rank.get(job.job_id, len(rank))
            )
            if placement_write is not None:
                writes.append(placement_write)
            plans.append(
                JobPlan(managed=True, note=context.hands_off_reason, writes=tuple(writes),
                        hands_off=tuple(sorted(context.hands_off, key=lambda f: f.value)) if context.hands_off else (),
                        hands_off_reason=context.hands_off_reason, **common)
            )
        return plans, notes

    def _user_changes(
        self, job: Job, owned: Mapping[JobField, OwnedField], already: set[JobField]
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

    def _priority_needed(
        self,
        job: Job,
        decision: SetPriority | None,
        wanted: int | None,
        value_now: int | None,
        tolerance: float,
        owned: Mapping[JobField, OwnedField],
        remembered: JobMemory | None,
        hands_off: set[JobField],
    ) -> bool:
        """Whether the strategy field must be rewritten on its own account (drift or level change)."""
        if decision is None or wanted is None or self.strategy_field in hands_off:
            return False
        key = self.strategy_field
        written_level = remembered.written_level if remembered and key in owned else None
        if job.state is JobState.PENDING:
            drift = abs(wanted - value_now) if value_now is not None else math.inf
            return drift > tolerance or (key in owned and written_level != decision.level)
        # running: its priority only matters if it is requeued; follow level changes only
        return (written_level if written_level is not None else 0) != decision.level

    def _keep_policy_order(self, contexts: list[_JobContext]) -> None:
        """Rewrite more values where the tolerance would leave pending jobs out of the policy's order.

        Slurm runs pending jobs by value; values within the tolerance are left alone, which must
        never swap two jobs the policy ranks differently. Walk the managed pending jobs in the
        policy's order and, wherever a job's value is not above the next one's, rewrite the one of
        the pair further from its wanted value, until the values follow the order.
        """
        sign = -1 if self.strategy == "nice" else 1  # a lower Nice runs first
        chain = sorted(
            (c for c in contexts
             if c.job.state is JobState.PENDING and c.decision is not None and c.wanted is not None
             and not c.exempt and self.strategy_field not in c.hands_off),
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

    def _priority_write(
        self, context: _JobContext, cluster: ClusterState, rank: Mapping[int, int]
    ) -> PlannedWrite | None:
        """The strategy field (when needed) and the AdminComment of one job, in one update."""
        job, decision, owned = context.job, context.decision, context.owned
        if decision is None or context.wanted is None or self.strategy_field in context.hands_off:
            return None
        key = self.strategy_field
        values: dict[JobField, FieldValue] = {}
        originals: dict[JobField, FieldValue] = {}
        if context.needed and context.value_now != context.wanted:
            values[key] = context.wanted
            originals[key] = self._strategy_now(job, cluster, owned)[1]
        comment_now = cluster.admin_comments.get(job.job_id, "")
        ours = comment_now == "" or comment_now.startswith("dike:")
        if self.config.engine.admin_comment and ours:
            level_match = _COMMENT_LEVEL.match(comment_now)
            comment_level = int(level_match.group(1)) if level_match else None
            if values or comment_level != decision.level:
                text = admin_comment_text(decision.level, job.counted_gpu_s, decision.promoted)
                if text != comment_now:
                    values[JobField.ADMIN_COMMENT] = text
                    mine = owned.get(JobField.ADMIN_COMMENT)
                    originals[JobField.ADMIN_COMMENT] = mine.original if mine is not None else comment_now
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
        )

    def _placement_write(
        self,
        job: Job,
        decision: SetPlacement | ClearPlacement | None,
        owned: Mapping[JobField, OwnedField],
        hands_off: set[JobField],
        rank: int,
    ) -> PlannedWrite | None:
        if job.state is not JobState.PENDING:
            return None
        wanted = placement_fields(decision.placement) if isinstance(decision, SetPlacement) else {}
        if not wanted and not any(key in owned for key in PLACEMENT_ORDER):
            return None  # nothing wanted, nothing of ours to put back
        values: dict[JobField, FieldValue] = {}
        originals: dict[JobField, FieldValue] = {}
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
            elif mine is not None:  # the policy no longer wants it: put the original back
                if not values_match(key, current, mine.original):
                    values[key] = mine.original
                    originals[key] = mine.original
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
        )

    def _guardrails(
        self, plans: list[JobPlan], owned: Mapping[int, Mapping[JobField, OwnedField]]
    ) -> tuple[tuple[PlannedWrite, ...], tuple[PlannedWrite, ...], list[str]]:
        """Circuit breaker on mass rewrites, then at most max_changes_per_cycle calls, first jobs first."""
        engine = self.config.engine
        candidates = sorted(
            (w for p in plans for w in p.writes), key=lambda w: (w.rank, w.job_id, w.kind)
        )
        notes = []
        previously_written = [p for p in plans if p.managed and self.strategy_field in owned.get(p.job.job_id, {})]
        rewritten = [
            p for p in previously_written if any(self.strategy_field in w.update.fields for w in p.writes)
        ]
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

    # ---------------------------------------------------------------- apply (writes)

    def apply(self, plan: CyclePlan, started: float | None = None) -> CycleReport:
        """Write the plan, audit every write, remember levels, runs and promotions."""
        started = self.clock() if started is None else started
        engine = self.config.engine
        calls_before = self.backend.calls
        cycle = self.store.next_cycle()
        outcomes: list[tuple[PlannedWrite, WriteOutcome]] = []
        requeued: list[tuple[Requeue, WriteOutcome]] = []
        notes: list[str] = []
        errors = 0
        succeeded: set[tuple[int, JobField]] = set()
        stopped = ""
        tripped = self.store.breaker()
        if tripped is None and plan.breaker:
            tripped = self._trip(plan.breaker)
        if tripped is not None:
            stopped = (f"circuit breaker tripped ({tripped}): nothing is written until an operator runs "
                       f"`dike-slurm breaker reset`")
            notes.append(stopped)
            self._audit_skipped(plan, cycle, plan.writes, stopped)
        for index, write in enumerate(() if stopped else plan.writes):
            if errors >= engine.breaker_max_errors:
                stopped = f"circuit breaker: {errors} failed writes; nothing more is written until an operator resets it"
                self._trip(f"{errors} failed writes in cycle {cycle}")
            elif self.clock() - started > engine.cycle_deadline_s:
                stopped = f"cycle deadline {engine.cycle_deadline_s:g}s passed; the rest waits for the next cycle"
            if stopped:
                notes.append(stopped)
                self._audit_skipped(plan, cycle, plan.writes[index:], stopped)
                break
            outcome = self._write(write, plan.time, cycle)
            outcomes.append((write, outcome))
            if outcome.ok:
                succeeded.update((write.job_id, f) for f in write.update.fields)
            elif not outcome.job_gone:
                errors += 1
        running_jobs = {p.job.job_id: p.job for p in plan.jobs}
        for group in requeue_groups(plan.requeues):
            if stopped or errors >= engine.breaker_max_errors or self.clock() - started > engine.cycle_deadline_s:
                with self.store.transaction():
                    for requeue in group:
                        self.store.audit(AuditEntry(
                            plan.time, cycle, requeue.job_id, "skipped", "requeue not attempted", "(not run)",
                            "none", False, stopped or "error limit or cycle deadline reached", requeue.reason,
                        ))
                continue
            if engine.preempt_signal is not None:
                waiting = self._grace(group, running_jobs, plan.time, cycle)
                errors += sum(1 for o in waiting.values() if o is not None and not o.ok and not o.job_gone)
                if waiting:
                    notes.append(
                        f"job(s) {', '.join(map(str, waiting))} signalled {engine.preempt_signal}: requeued once "
                        f"{engine.preempt_grace_s:g}s have passed"
                    )
                    continue
            for requeue in group:
                outcome = self._requeue(requeue, plan.time, cycle)
                requeued.append((requeue, outcome))
                if not outcome.ok and not outcome.job_gone:
                    errors += 1
        self._remember(plan, succeeded, {r.job_id for r, o in requeued if o.ok})
        seconds = self.clock() - started
        write_calls = self.backend.calls - calls_before
        report = CycleReport(
            plan, True, tuple(outcomes), tuple(requeued), errors, seconds,
            plan.read_calls + write_calls, write_calls, tuple(notes),
        )
        with self.store.transaction():
            self.store.record_cycle(self._summary(report))
        return report

    def _requeue(self, requeue: Requeue, now: float, cycle: int) -> WriteOutcome:
        """`scontrol requeue`, with its audit row written ahead (as `_write` does for updates)."""
        with self.store.transaction():
            entry_id = self.store.audit(AuditEntry(
                now, cycle, requeue.job_id, "requeue", "requeued", f"requeue {requeue.job_id}",
                "none: a requeue cannot be undone", False, "unconfirmed: the engine stopped before Slurm answered",
                requeue.reason,
            ))
        outcome = self.backend.requeue(requeue.job_id)
        with self.store.transaction():
            self.store.finish_audit(entry_id, outcome.ok, outcome.message, outcome.command)
        log.info("job %s: requeued (%s)%s", requeue.job_id, requeue.reason,
                 "" if outcome.ok else f" FAILED: {outcome.message}")
        return outcome

    def _grace(
        self, group: list[Requeue], jobs: Mapping[int, Job], now: float, cycle: int
    ) -> dict[int, WriteOutcome | None]:
        """Signal the victims not signalled in their current run; the ones still inside their grace
        period (None: signalled earlier). Empty: every victim's grace has passed, requeue them."""
        engine = self.config.engine
        signal = engine.preempt_signal
        assert signal is not None
        waiting: dict[int, WriteOutcome | None] = {}
        for requeue in group:
            job = jobs.get(requeue.job_id)
            since = job.start_time if job is not None and job.start_time is not None else 0.0
            sent = self.store.last_done(requeue.job_id, "signal", since)
            if sent is not None:
                if now - sent < engine.preempt_grace_s:
                    waiting[requeue.job_id] = None
                continue
            with self.store.transaction():
                entry_id = self.store.audit(AuditEntry(
                    now, cycle, requeue.job_id, "signal", f"signal {signal} before requeue", f"signal {requeue.job_id}",
                    "none: a signal cannot be undone", False, "unconfirmed: the engine stopped before Slurm answered",
                    requeue.reason,
                ))
            outcome = self.backend.signal(requeue.job_id, signal)
            with self.store.transaction():
                self.store.finish_audit(entry_id, outcome.ok, outcome.message, outcome.command)
            waiting[requeue.job_id] = outcome
        return waiting

    def _trip(self, reason: str) -> str:
        with self.store.transaction():
            self.store.trip_breaker(reason)
        log.error("circuit breaker tripped: %s", reason)
        return reason

    def _audit_skipped(self, plan: CyclePlan, cycle: int, writes, why: str) -> None:
        """Writes the cycle planned but did not attempt: in the audit as such (ok = 0, action skipped)."""
        with self.store.transaction():
            for write in writes:
                self.store.audit(AuditEntry(
                    plan.time, cycle, write.job_id, "skipped", _change_text(write), "(not run)",
                    "none", False, why, write.reason,
                ))

    def _write(self, write: PlannedWrite, now: float, cycle: int) -> WriteOutcome:
        originals = dict(write.originals)
        change = _change_text(write)
        undo = self.backend.describe(write.undo) if write.undo.values else "none"
        # Write-ahead: the audit row exists (as unconfirmed) before Slurm is called, so a crash
        # between the call and its record still leaves the attempt in the audit.
        with self.store.transaction():
            entry_id = self.store.audit(AuditEntry(
                now, cycle, write.job_id, "update", change,
                self.backend.describe(write.update) if write.update.values else "(none)", undo,
                False, "unconfirmed: the engine stopped before Slurm answered", write.reason,
            ))
        if write.update.values:
            outcome = self.backend.apply(write.update)
        else:
            outcome = WriteOutcome(True, "(none: Slurm already holds the original)")
        with self.store.transaction():
            self.store.finish_audit(entry_id, outcome.ok, outcome.message, outcome.command)
            if outcome.ok:
                for key, value in write.update.values:
                    if key not in write.restores:
                        self.store.record_write(write.job_id, key, originals[key], value, now)
                self.store.release(write.job_id, write.restores)
            elif outcome.job_gone and write.kind == "placement":
                self.store.release(write.job_id, [f for f in write.update.fields if f.is_placement])
        log.info(
            "job %s: %s (%s)%s", write.job_id, change, write.reason,
            "" if outcome.ok else f" FAILED: {outcome.message}",
        )
        return outcome

    def _remember(self, plan: CyclePlan, succeeded: set[tuple[int, JobField]], requeued: set[int]) -> None:
        memory = self.store.jobs()
        memories = []
        for job_plan in plan.jobs:
            if not job_plan.managed:
                continue
            job = job_plan.job
            old = memory.get(job.job_id) or JobMemory(job.job_id, plan.time)
            written_level = old.written_level
            if (job.job_id, self.strategy_field) in succeeded:
                written_level = job_plan.level
            at_promotion = old.attained_at_promotion_gpu_s
            promotions = old.promotions
            if job_plan.promoted:
                at_promotion = job.attained_gpu_s
                promotions += 1
            memories.append(replace(
                old,
                last_seen=plan.time,
                level=job_plan.level,
                written_level=written_level,
                attained_gpu_s=job.attained_gpu_s,
                attained_at_promotion_gpu_s=at_promotion,
                promotions=promotions,
                requeues=old.requeues + (1 if job.job_id in requeued else 0),
                hands_off=job_plan.hands_off,
                hands_off_reason=job_plan.hands_off_reason,
                reason=job_plan.reason,
            ))
        lookback_start = plan.time - self.config.accounting.lookback_days * 86400.0
        with self.store.transaction():
            self.store.remember(memories)
            for job_plan in plan.jobs:  # a user took these over: the engine no longer owns them
                if job_plan.hands_off:
                    self.store.release(job_plan.job.job_id, job_plan.hands_off)
            self.store.add_runs(plan.new_runs)
            if plan.accounting_ok:
                self.store.set_last_sync(plan.time)
            self.store.prune_runs(lookback_start, [p.job.job_id for p in plan.jobs])
            self.store.forget_jobs(plan.time - FORGET_AFTER_S)

    def _summary(self, report: CycleReport) -> CycleSummary:
        plan = report.plan
        return CycleSummary(
            started=plan.time,
            seconds=report.seconds,
            policy=plan.policy,
            applied=report.applied,
            jobs=len(plan.jobs),
            managed=sum(1 for p in plan.jobs if p.managed),
            writes=sum(1 for _, o in report.outcomes if o.ok),
            errors=report.errors,
            slurm_calls=report.slurm_calls,
            note="; ".join(plan.notes + report.notes),
        )

    def cycle(self, *, apply: bool) -> CycleReport:
        """One whole cycle; without `apply` only the plan (nothing is written anywhere)."""
        started = self.clock()
        self.backend.limit_reads(self.config.engine.cycle_deadline_s)  # slow reads count against it too
        try:
            plan = self.plan()
        finally:
            self.backend.limit_reads(None)
        if apply:
            return self.apply(plan, started)
        return CycleReport(plan, False, (), (), 0, self.clock() - started, plan.read_calls, 0)

    # ---------------------------------------------------------------- revert

    def revert_plan(self) -> RevertPlan:
        """Put back every value the engine owns on jobs still active; let go of the others."""
        cluster = self.backend.read_cluster()
        jobs = {j.job_id: j for j in cluster.jobs}
        writes: list[PlannedWrite] = []
        released: list[tuple[int, JobField, str]] = []
        for job_id, fields in sorted(self.store.owned().items()):
            job = jobs.get(job_id)
            if job is None:
                released.extend((job_id, f, "job no longer active") for f in fields)
                continue
            values: dict[JobField, FieldValue] = {}
            for key, mine in fields.items():
                if key.is_placement and job.state is not JobState.PENDING:
                    released.append((job_id, key, "job is no longer pending: its constraint is spent"))
                    continue
                values[key] = mine.original
            if values:
                update = JobUpdate.of(job_id, values)
                writes.append(PlannedWrite(
                    job_id, update, update, tuple(values.items()), tuple(values), "revert", len(writes),
                ))
        return RevertPlan(tuple(writes), tuple(released))

    def revert(self, plan: RevertPlan) -> list[tuple[PlannedWrite, WriteOutcome]]:
        """Apply a revert plan; every job's fields are released once restored (or gone)."""
        now = time.time()
        cycle = self.store.next_cycle()
        outcomes = []
        for write in plan.writes:
            outcome = self.backend.apply(write.update)
            change = "; ".join(f"{k.value} -> {describe_value(v)}" for k, v in write.update.values)
            with self.store.transaction():
                self.store.audit(AuditEntry(
                    now, cycle, write.job_id, "revert", change, outcome.command, "none", outcome.ok,
                    outcome.message, "revert",
                ))
                if outcome.ok or outcome.job_gone:
                    self.store.release(write.job_id, write.update.fields)
            outcomes.append((write, outcome))
        with self.store.transaction():
            for job_id, key, _ in plan.released:
                self.store.release(job_id, [key])
        return outcomes


def _change_text(write: PlannedWrite) -> str:
    originals = dict(write.originals)
    return "; ".join(
        f"{key.value} {describe_value(originals.get(key))} -> {describe_value(value)}"
        for key, value in write.update.values
    ) or "released " + ", ".join(f.value for f in write.restores)


def write_metrics(report: CycleReport, path: Path) -> None:
    """Rewrite a Prometheus textfile (node_exporter's textfile collector) with this cycle's figures."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile  # only when metrics are written

    registry = CollectorRegistry()
    Gauge("dike_slurm_cycle_seconds", "wall time of the last cycle", registry=registry).set(report.seconds)
    Gauge("dike_slurm_cycle_timestamp_seconds", "when the last cycle read the cluster", registry=registry).set(
        report.plan.time
    )
    Gauge("dike_slurm_slurm_calls", "Slurm calls in the last cycle", registry=registry).set(report.slurm_calls)
    Gauge("dike_slurm_changes_written", "job updates written in the last cycle", registry=registry).set(
        sum(1 for _, outcome in report.outcomes if outcome.ok)
    )
    Gauge("dike_slurm_errors", "failed writes in the last cycle", registry=registry).set(report.errors)
    Gauge("dike_slurm_applied", "1 if the last cycle wrote (--apply), 0 for a dry run", registry=registry).set(
        int(report.applied)
    )
    jobs = Gauge("dike_slurm_jobs", "managed active jobs per queue level", ["level"], registry=registry)
    for level in sorted({p.level for p in report.plan.jobs if p.managed and p.level is not None}):
        jobs.labels(level=str(level)).set(
            sum(1 for p in report.plan.jobs if p.managed and p.level == level)
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry)
