"""The live cycle: read the cluster -> policy.decide -> diff -> guardrails -> apply -> audit.

The engine orchestrates one cluster, one policy and one state store: it reads the cluster and
accounting and builds the snapshot (here), decides, then hands over to `reconcile` (the pure diff
and guardrails), `apply` (the write-ahead-audited writes) and `revert`. `plan()` only reads;
`apply()` writes. The plan and report types are re-exported for callers.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from types import MappingProxyType

from dike_slurm.cycle import reconcile
from dike_slurm.cycle.apply import Applier, CycleReport, unconfirmed_site_factor
from dike_slurm.slurm.backends.base import Backend, ClusterState, WriteOutcome
from dike_slurm.domain.fields import JobField
from dike_slurm.config import Config
from dike_slurm.cycle.memory import CycleMemory, EnrichInputs, Enriched, LearnedPrior
from dike_slurm.errors import PolicyError, SlurmError
from dike_slurm.domain.freed_rooms import LANDED, FreedRoom, follow_rooms
from dike_slurm.cycle.gcpause import paused_gc
from dike_slurm.domain.head_window import window_size
from dike_slurm.domain.decisions import Decisions
from dike_slurm.domain.model import Job, JobState, Snapshot
from dike_slurm.parsing.durations import format_timestamp
from dike_slurm.parsing.slurm_options import DEFAULT_DEPTH
from dike_slurm.policies.base import Policy
from dike_slurm.cycle.plan import CyclePlan, JobPlan, PlannedWrite
from dike_slurm.cycle.reconcile import NOTHING_OWNED, STRATEGY_FIELD, is_exempt
from dike_slurm.registry import default_registry
from dike_slurm.cycle.requeue_guard import RequeueLimits, guard_requeues, requeue_limits
from dike_slurm.cycle.revert import RevertPlan, revert, revert_plan
from dike_slurm.domain.service_prior import Prediction, ServicePrior
from dike_slurm.domain.slurm_priority import SlurmPriorityModel, effective_span, protection_reserve, tier_gap
from dike_slurm.store.state import JobMemory, OwnedField, SiteSpan, StateStore
from dike_slurm.slurm.usage import (
    JobService,
    completed_service,
    Run,
    finished_jobs,
    finished_totals,
    current_runs,
    decayed_usage,
    job_service,
    merge_runs,
    runs_from_records,
)

__all__ = ["CyclePlan", "CycleReport", "Engine", "JobPlan", "PlannedWrite", "RevertPlan", "in_scope",
           "opted_in_to_preemption"]

log = logging.getLogger("dike_slurm.engine")

_NO_SERVICE = JobService()

SACCT_OVERLAP_S = 900.0  # each cycle re-reads accounting from this long before the last read


def in_scope(job: Job, config: Config) -> bool:
    """Partition (every listed one), account and QOS all in the configured scope."""
    scope = config.scope
    if scope.partitions:
        partitions = [p for p in job.partition.split(",") if p]
        if not partitions or not set(partitions) <= set(scope.partitions):
            return False
    if scope.accounts and job.account not in scope.accounts:
        return False
    return not (scope.qos and job.qos not in scope.qos)


def opted_in_to_preemption(job: Job, config: Config) -> bool:
    """The site's opt-in rule for live preemption: the job's comment tag, its partition or its QOS."""
    return config.engine.preemption_opt_in.admits(job.partition, job.qos, job.comment)


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
        # What the engine keeps between cycles (dike_slurm/cycle/memory.py), the backend's reads included.
        self.memory = CycleMemory()
        backend.keep_reads_in(self.memory.reads)
        # The site's own priority: read before the first plan, kept for the engine's life (a
        # reload makes a new engine, which reads it again).
        self.site_priority: SlurmPriorityModel | None = None
        # the GPU types of the nodes the last plan read (what `explain` says a running job is charged)
        self.node_types: Mapping[str, tuple[str, ...]] = {}

    # ---------------------------------------------------------------- the span written

    def priority_span(self, now: float) -> tuple[SiteSpan, SiteSpan | None, str | None]:
        """The values the engine writes: up to `engine.priority_span` under `engine.priority_mode`
        against the site's own weights and QOS tiers (`slurm_priority.effective_span`), the top
        `protection_reserve` of them kept for the jobs a preemption freed nodes for; with what an
        applied cycle keeps of a fresh read, and a note when the read failed.

        The backend is asked once per engine (the first plan), not every cycle, in every mode (mode
        `over` uses the site's weights for the reserve only). When the read fails (slurmdbd down:
        `sacctmgr` cannot answer), the span last read for the same mode and configured span comes
        from the state store, and the next cycle asks again; with none stored, the read's
        SlurmError fails the cycle. The replay sizes its span the same way (sim/kernel/replay.py).
        """
        memory = self.memory
        if memory.span is not None:
            return memory.span, None, None
        engine = self.config.engine
        try:
            model = self.backend.priority_model()
        except SlurmError as exc:
            stored = self.store.site_span()
            if stored is None or (stored.mode, stored.configured) != (engine.priority_mode, engine.priority_span):
                raise
            log.warning("site priority unreadable: %s", exc)
            return stored, None, (
                f"site priority unreadable ({exc}); values 1..{stored.span} as read from {stored.source} "
                f"at {format_timestamp(stored.read_at)} (the state store)"
            )
        span = effective_span(engine.priority_mode, engine.priority_span, model)
        reserve = protection_reserve(model)
        if model is not None:
            gap = tier_gap(model)
            log.info("site priority (%s): %s, the other factors at most %g; engine.priority_mode = %s: "
                     "values 1..%d (engine.priority_span %d), the top %d kept for jobs a preemption frees nodes "
                     "for", model.source,
                     f"QOS tiers {', '.join(f'{t:g}' for t in model.qos_tiers())} (smallest step {gap:g})"
                     if gap is not None else "no QOS tiers", model.weights.others_total,
                     engine.priority_mode, span, engine.priority_span, reserve)
        self.site_priority = model
        memory.span = SiteSpan(engine.priority_mode, engine.priority_span, span,
                               model.source if model is not None else "", now, reserve)
        return memory.span, (memory.span if model is not None else None), None

    def head_window(self) -> int:
        """Pending jobs per partition the engine orders: `engine.head_window`, else its margin over the
        depth Slurm's scheduler looks at (the site's SchedulerParameters; Slurm's defaults while the
        site's settings are unread)."""
        engine = self.config.engine
        depth = self.site_priority.scheduler_depth if self.site_priority is not None else DEFAULT_DEPTH
        return window_size(engine.head_window, engine.head_window_margin, depth)

    # ---------------------------------------------------------------- plan (reads only)

    def plan(self) -> CyclePlan:
        """Read the cluster and accounting, decide, and diff; writes nothing anywhere."""
        with paused_gc():
            return self._plan()

    def _plan(self) -> CyclePlan:
        phase_started = time.perf_counter()  # phase times are measured, whatever clock the engine is given
        calls_before = self.backend.calls
        cluster = self.backend.read_cluster()
        started = self.backend.calls
        now = cluster.time
        # read on the first plan only, after the queue (Slurm's first answer)
        span, site_span, span_note = self.priority_span(now)
        calls_before += self.backend.calls - started  # those reads are the engine's start, not the cycle's
        memory = self.store.jobs()
        owned = self.store.owned()
        new_runs, skipped, accounting_note = self._read_accounting(now)
        read_s = time.perf_counter() - phase_started
        rooms, room_outcomes = follow_rooms(self.store.freed_rooms(), {job.job_id: job for job in cluster.jobs})
        active_in_scope, outside = [], []
        for job in cluster.jobs:
            (active_in_scope if in_scope(job, self.config) else outside).append(job)
        node_types = self.node_types = {node.name: node.gpu_types for node in cluster.nodes if node.gpu_types}
        runs = merge_runs(self.store.runs(), new_runs, current_runs(active_in_scope, self.site_priority, node_types))
        snapshot = self._snapshot(cluster, active_in_scope, runs, memory, owned, rooms)
        limits = requeue_limits(self.policy, self.params, self.config.engine.max_requeues_per_cycle)
        decisions, requeue_notes = self._decide(snapshot, cluster.admin_comments, limits)
        decided = time.perf_counter()
        window = self.head_window()
        inputs = reconcile.DiffInputs(
            snapshot=snapshot, decisions=decisions, cluster=cluster, memory=memory, owned=owned, config=self.config,
            declared_ceiling=self.policy.score_ceiling(self.params), span=span.span, reserve=span.reserve,
            window=window, preempts=limits.preempts,
        )
        plans, notes = reconcile.diff(inputs, self.memory.diff)
        adopted = self._unconfirmed_writes(plans, memory, owned, cluster)
        if adopted:  # the diff again, with those values the engine's
            owned = {**owned, **{f.job_id: {**owned.get(f.job_id, NOTHING_OWNED), f.field: f} for f in adopted}}
            plans, notes = reconcile.diff(replace(inputs, owned=owned), self.memory.diff)
            notes += [f"job {f.job_id}: SiteFactor {f.written} in Slurm is the engine's own write, whose outcome it "
                      "had not learned (audited unconfirmed): the engine owns it" for f in adopted]
        writes, held_back, guards = reconcile.guardrails(plans, owned, self.config)
        prior_judged = self._judge_prior(decisions.expected, cluster.jobs, runs, now)
        phase_seconds = {"read": read_s, "decide": decided - phase_started - read_s,
                         "diff": time.perf_counter() - decided}
        if accounting_note:
            notes.insert(0, accounting_note)
        if span_note:
            notes.insert(0, span_note)
        notes.extend(f"preemption {o.outcome}: {o.why}" for o in room_outcomes if o.outcome != LANDED)
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
            notes=tuple(notes + [g.text for g in guards]),
            out_of_scope=len(outside),
            outside=tuple(outside),
            new_runs=tuple(new_runs),
            accounting_skipped=dict(skipped),
            read_calls=self.backend.calls - calls_before,
            accounting_ok=accounting_note is None,
            guards=tuple(guards),
            site_span=site_span,
            freed_rooms=tuple(rooms),
            room_outcomes=tuple(room_outcomes),
            expected=decisions.expected,
            prior=decisions.prior,
            window=window,
            adopted=adopted,
            phase_seconds=phase_seconds,
            prior_judged=prior_judged,
            nodes=cluster.nodes,
            topology=cluster.topology,
        )

    def _unconfirmed_writes(self, plans: list[JobPlan], memory: Mapping[int, JobMemory],
                            owned: Mapping[int, Mapping[JobField, OwnedField]],
                            cluster: ClusterState) -> tuple[OwnedField, ...]:
        """The SiteFactors the diff just found someone else's that are the engine's own write of which
        it never learned the outcome (its newest update of the job, audited unconfirmed, sent that value)."""
        adopted = []
        for job_plan in plans:
            job_id = job_plan.job.job_id
            remembered = memory.get(job_id)
            if JobField.SITE_FACTOR not in job_plan.hands_off or (
                    remembered is not None and JobField.SITE_FACTOR in remembered.hands_off):
                continue
            sent = unconfirmed_site_factor(self.store.last_update(job_id))
            if sent is None or sent[1] != cluster.site_factors.get(job_id):
                continue
            mine = owned.get(job_id, NOTHING_OWNED).get(JobField.SITE_FACTOR)
            adopted.append(OwnedField(job_id, JobField.SITE_FACTOR, mine.original if mine is not None else sent[0],
                                      sent[1], cluster.time))
        return tuple(adopted)

    def _snapshot(self, cluster: ClusterState, active_in_scope: list[Job], runs: list[Run],
                  memory: Mapping[int, JobMemory], owned: Mapping[int, Mapping[JobField, OwnedField]],
                  rooms: list[FreedRoom]) -> Snapshot:
        """What the policy decides on: the in-scope jobs enriched, their nodes, the users' usage and
        what the policy's hooks ask for."""
        now = cluster.time
        service = job_service(runs, now)
        fairness_by = self.policy.usage_owner(self.params)
        usage = decayed_usage(runs, now, self.config.accounting.usage_half_life_h * 3600.0, fairness_by)
        jobs = self._enrich(active_in_scope, service, memory, owned, cluster, {room.job_id: room for room in rooms})
        return Snapshot(
            time=now,
            jobs=jobs,
            nodes=self._nodes_in_scope(cluster),
            topology=cluster.topology,
            user_usage_gpu_s=usage,
            user_shares=dict(self.config.accounting.user_shares),
            completed_service_gpu_s=(
                completed_service(runs, now) if self.policy.reads_completed_service(self.params) else ()
            ),
            site_priority=self.site_priority,
            service_prior=self._learned_prior(runs, now) if self.policy.reads_service_prior(self.params) else None,
        )

    def _learned_prior(self, runs: list[Run], now: float) -> ServicePrior:
        """The service prior of the finished jobs in `runs`: last cycle's when they are the same jobs in
        the same order (learning is pure; the order decides its sums' last bits)."""
        finished = finished_jobs(runs, now)
        kept = self.memory.prior
        if kept is None or kept.finished != finished:
            kept = self.memory.prior = LearnedPrior(finished, ServicePrior.learn(finished))
        return kept.prior

    def _decide(self, snapshot: Snapshot, admin_comments: Mapping[int, str],
                limits: RequeueLimits) -> tuple[Decisions, list[str]]:
        """The policy's decisions, its requeues through the requeue guard (never of an exempt job); the
        guard's notes."""
        decisions = self.policy.decide(snapshot, self.params, random.Random(self.config.engine.seed))
        return guard_requeues(
            decisions,
            {j.job_id: j for j in snapshot.jobs if j.state is JobState.RUNNING
             and not is_exempt(j, self.config, admin_comments.get(j.job_id, ""))},
            snapshot.time,
            limits,
        )

    def _judge_prior(self, expected: Mapping[int, Prediction], active: Collection[Job], runs: Collection[Run],
                     now: float) -> tuple[tuple[float, float], ...]:
        """(predicted, attained) GPU-seconds of each job that left the queue since the last cycle and
        whose final run is in accounting; the prediction is the prior's last while the job was pending
        (or, for a job never seen pending, the first made). A job whose final run has not landed
        SACCT_OVERLAP_S after it left (cancelled while pending, or accounting down) is dropped unjudged."""
        active_ids = {job.job_id: job for job in active}
        known, left = self.memory.predicted, self.memory.left
        for job_id in known.keys() - active_ids.keys():
            left[job_id] = (known.pop(job_id), now)
        judged = []
        if left:
            totals = finished_totals([run for run in runs if run.job_id in left], now)
            for job_id, (predicted, left_at) in list(left.items()):
                total = totals.get(job_id)
                if total is not None:
                    judged.append((predicted, total[0]))
                if total is not None or now - left_at > SACCT_OVERLAP_S:
                    del left[job_id]
        pending = JobState.PENDING
        for job_id, prediction in expected.items():
            job = active_ids.get(job_id)
            if job is not None and (job.state is pending or job_id not in known):
                known[job_id] = prediction.gpu_s
        return tuple(judged)

    def _read_accounting(self, now: float):
        lookback_start = self.config.accounting.window_start(now)
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
        finished = [r for r in runs_from_records(result.records, self.site_priority) if r.end is not None]
        return finished, result.skipped, None

    def _nodes_in_scope(self, cluster: ClusterState):
        wanted = set(self.config.scope.partitions)
        if not wanted:
            return cluster.nodes
        return tuple(n for n in cluster.nodes if wanted & set(n.partitions))

    def _enrich(
        self,
        jobs: list[Job],
        service: Mapping[int, JobService],
        memory: Mapping[int, JobMemory],
        owned: Mapping[int, Mapping[JobField, OwnedField]],
        cluster: ClusterState,
        rooms: Mapping[int, FreedRoom] = MappingProxyType({}),
    ) -> tuple[Job, ...]:
        """The jobs with what the queue does not say: service over all runs, promotions, site factor.

        A job read as the same Job object as last cycle (the lean read reuses it for an unchanged
        record), with the same service, promotion, requeues and site factor, is last cycle's copy.
        """
        enriched = []
        kept, now_kept = self.memory.enriched, {}
        self.memory.enriched = now_kept
        site_factors = cluster.site_factors
        for job in jobs:
            job_id = job.job_id
            got = service.get(job_id, _NO_SERVICE)
            remembered = memory.get(job_id)
            site_factor = site_factors.get(job_id)
            if site_factor is None:
                mine = owned.get(job_id, NOTHING_OWNED).get(JobField.SITE_FACTOR)
                if mine is not None:
                    site_factor = mine.written  # type: ignore[assignment]
            room = rooms.get(job_id)  # a preemption freed nodes for it, and it has not started yet
            pinned = (room is not None and job.state is JobState.PENDING
                      and set(room.nodes) == set(job.placement.require_nodes))
            inputs = EnrichInputs(got, remembered.attained_at_promotion_gpu_s if remembered else 0.0,
                                  remembered.requeues if remembered else 0, site_factor, pinned)
            last = kept.get(job_id)
            if last is not None and last.read is job and last.inputs == inputs:
                copy = last.copy
            else:
                pending_since = job.submit_time
                if job.state is JobState.PENDING and got.last_end is not None:
                    pending_since = max(job.submit_time, got.last_end)
                copy = job.with_changes(
                    attained_gpu_s=got.attained_gpu_s,
                    attained_at_promotion_gpu_s=min(inputs.attained_at_promotion_gpu_s, got.attained_gpu_s),
                    run_count=got.run_count,
                    last_run_s=got.last_run_s,
                    preemptions=inputs.requeues,
                    pending_since=pending_since,
                    requeueable=job.requeueable and opted_in_to_preemption(job, self.config),
                    site_factor=site_factor,
                    pinned_for_preemption=pinned,
                )
            now_kept[job_id] = Enriched(job, inputs, copy)
            enriched.append(copy)
        return tuple(enriched)

    def apply(self, plan: CyclePlan, started: float | None = None) -> CycleReport:
        """Write the plan, audit every write, remember levels, runs and promotions."""
        return Applier(self.config, self.backend, self.store, self.clock).apply(plan, started)

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
        return CycleReport(plan=plan, applied=False, outcomes=(), requeued=(), errors=0,
                           seconds=self.clock() - started, slurm_calls=plan.read_calls, write_calls=0)

    def revert_plan(self, job_ids: Collection[int] | None = None) -> RevertPlan:
        """Put back every value the engine owns on jobs still active (or on `job_ids`); let go of the others."""
        return revert_plan(self.backend, self.store, job_ids)

    def revert(self, plan: RevertPlan) -> list[tuple[PlannedWrite, WriteOutcome]]:
        """Apply a revert plan; every job's fields are released once restored (or gone)."""
        return revert(plan, self.backend, self.store)
