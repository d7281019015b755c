"""Apply: a cycle plan's writes through the backend, each audited ahead in the state store.

Every write and requeue has its audit row committed as "unconfirmed" before Slurm is called,
then completed with the result (and, for a write, the field the engine now owns), so a crash at
any point leaves the attempt in the audit. The circuit breakers, the cycle deadline and the
preemption grace signal are enforced here; afterwards the cycle's levels, promotions and runs
are remembered.
"""

from __future__ import annotations

import getpass
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum

from dike_slurm.slurm.backends.base import Backend, WriteOutcome, started
from dike_slurm.domain.fields import JobField
from dike_slurm.config import Config
from dike_slurm.domain.decisions import Requeue, service_forgiven
from dike_slurm.domain.freed_rooms import WASTED, FreedRoom, requeues_by_outcome
from dike_slurm.domain.model import Job
from dike_slurm.parsing.durations import format_timestamp
from dike_slurm.cycle.plan import CyclePlan, PlannedWrite
from dike_slurm.cycle.field_values import describe_value
from dike_slurm.cycle.reconcile import STRATEGY_FIELD
from dike_slurm.cycle.requeue_guard import requeue_groups
from dike_slurm.store.state import AuditEntry, CycleSummary, JobMemory, StateStore

log = logging.getLogger("dike_slurm.engine")

# scontrol's words when the engine's user lacks the Slurm rights for a write (docs/deployment.md)
_DENIED = ("Access/permission denied", "Invalid user id")
PRIVILEGE_HINT = ("Slurm refused the write for lack of rights ({message}): grant the engine's user "
                  "AdminLevel=Admin (sacctmgr -i modify user {user} set adminlevel=Admin; Operator is enough "
                  "with engine.admin_comment = false), see docs/deployment.md")
FORGET_AFTER_S = 86400.0  # jobs not active for this long are dropped from the state (not the audit)
# A job whose memory did not change is rewritten only to keep its last_seen within this of the
# truth: a quiet cycle at 50,000 jobs would otherwise rewrite every row (0.6-0.9 s of CPU).
LAST_SEEN_EVERY_S = 3600.0
UNCONFIRMED = "unconfirmed: the engine stopped before Slurm answered"
# Writes go to the backend in batches (one fed scontrol each, backends/scontrol_stdin.py): small
# first, so that a cluster refusing every write costs a few writes, then doubling while no write
# failed; the first batch and any after a failure hold no more writes than the circuit breaker
# still allows to fail. The cycle deadline and the write budget (engine.write_budget_s) are checked
# between batches.
FIRST_BATCH = 4
MAX_BATCH = 512


class Stop(Enum):
    """Why a cycle stopped writing (its text is among the report's notes)."""

    PAUSED = "paused"  # an operator's pause, before the first write
    BREAKER = "breaker"  # the circuit breaker latched, before the first write (by an earlier cycle or this plan)
    FAILED_WRITES = "failed_writes"  # breaker_max_errors writes failed: the breaker trips
    DEADLINE = "deadline"  # the cycle deadline passed: the rest waits for the next cycle
    DENIED = "denied"  # Slurm refused a write for lack of rights


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
    denied: str = ""  # Slurm refused a write for lack of rights: what to grant (the cycle stopped writing)
    preemption_totals: Mapping[str, int] = field(default_factory=dict)  # landed, wasted, gone since the store began
    budget_held: int = 0  # planned writes the write budget left for the next cycle
    signals: int = 0  # grace signals sent to preemption victims (engine.preempt_signal)
    paused: bool = False  # an operator's pause stopped the writes (`dike-slurm pause`)
    breaker_latched: bool = False  # the circuit breaker is latched after this cycle
    write_seconds: float = 0.0  # the writes, requeues and the memory of the cycle
    stopped: Stop | None = None  # why the cycle stopped writing (None: it did not)


def field_changes(write: PlannedWrite) -> list[tuple[JobField, object, object]]:
    """(field, what Slurm held just before the write, the value written) for each field."""
    before = dict(write.originals) | dict(write.before)  # `before` is what Slurm held; plans without it: the original
    return [(key, before.get(key), value) for key, value in write.update.values]


def change_text(write: PlannedWrite) -> str:
    """A write as the audit shows it: each field from the value Slurm held to the new one."""
    return "; ".join(
        f"{key.value} {describe_value(old)} -> {describe_value(new)}" for key, old, new in field_changes(write)
    ) or "released " + ", ".join(f.value for f in write.restores)


def log_fields(write: PlannedWrite) -> dict[str, object]:
    """The structured part of a write's log record (JSON logs carry it): job, then field, old, new."""
    return {"job": write.job_id, "changes": [
        {"field": key.value, "old": describe_value(old), "new": describe_value(new)}
        for key, old, new in field_changes(write)
    ]}


class Applier:
    """Writes plans to one cluster and records them in one state store."""

    def __init__(
        self, config: Config, backend: Backend, store: StateStore, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config
        self.backend = backend
        self.store = store
        self.clock = clock
        self.strategy_field = STRATEGY_FIELD[config.engine.priority_strategy]
        self._owners: dict[int, str] = {}  # job id -> user, of the cycle being applied (the audit's user column)

    def apply(self, plan: CyclePlan, started: float | None = None) -> CycleReport:
        """Write the plan, audit every write, remember levels, runs and promotions."""
        started = self.clock() if started is None else started
        engine = self.config.engine
        calls_before = self.backend.calls
        cycle = self.store.next_cycle()
        self._owners = {p.job.job_id: p.job.user for p in plan.jobs}
        outcomes: list[tuple[PlannedWrite, WriteOutcome]] = []
        requeued: list[tuple[Requeue, WriteOutcome]] = []
        notes: list[str] = []
        errors = 0
        succeeded: set[tuple[int, JobField]] = set()
        stopped = denied = ""
        stop: Stop | None = None
        paused = self.store.paused()
        tripped = self.store.breaker()
        if paused is None and tripped is None and plan.breaker:
            tripped = self._trip(plan.breaker)
        if paused is not None:
            stop = Stop.PAUSED
            stopped = f"paused ({paused}): nothing is written until an operator runs `dike-slurm resume`"
        elif tripped is not None:
            stop = Stop.BREAKER
            stopped = (f"circuit breaker tripped ({tripped}): nothing is written until an operator runs "
                       f"`dike-slurm breaker reset`")
        stopped_before = bool(stopped)
        if stopped:
            notes.append(stopped)
            self._audit_stopped_cycle(plan, cycle, stopped)
        index, size = 0, FIRST_BATCH
        writes = () if stopped else plan.writes
        writing_since = self.clock()
        phase_started = time.perf_counter()
        signals = 0
        budget_held = 0
        while index < len(writes):
            left = engine.cycle_deadline_s - (self.clock() - started)
            spent = self.clock() - writing_since
            if spent >= engine.write_budget_s and errors < engine.breaker_max_errors and left >= 0:
                # the queue's tail waits for the next cycle, which plans it again (not audited one
                # by one: at a big site that would be thousands of rows a cycle)
                budget_held = len(writes) - index
                notes.append(f"write budget {engine.write_budget_s:g}s used ({spent:.1f}s, {index} write(s)): "
                             f"{budget_held} write(s) further down the queue wait for the next cycle")
                break
            if errors >= engine.breaker_max_errors:
                stop = Stop.FAILED_WRITES
                stopped = f"circuit breaker: {errors} failed writes; nothing more is written until an operator resets it"
                self._trip(f"{errors} failed writes in cycle {cycle}")
            elif left < 0:
                stop = Stop.DEADLINE
                stopped = f"cycle deadline {engine.cycle_deadline_s:g}s passed; the rest waits for the next cycle"
            if stopped:
                notes.append(stopped)
                self._audit_skipped(plan, cycle, writes[index:], stopped)
                break
            # the first batch, and every batch after a failure, can fail no more writes than the
            # breaker still allows; batches after clean ones double
            room = size if errors == 0 and index > 0 else engine.breaker_max_errors - errors
            batch = writes[index:index + min(size, room)]
            index += len(batch)
            size = min(2 * len(batch), MAX_BATCH)
            for write, outcome in zip(batch, self._write_batch(batch, plan.time, cycle, left)):
                outcomes.append((write, outcome))
                if outcome.ok:
                    succeeded.update((write.job_id, f) for f in write.update.fields)
                elif not outcome.job_gone:
                    errors += 1
                    if not denied and any(words in outcome.message for words in _DENIED):
                        denied = PRIVILEGE_HINT.format(message=outcome.message.strip(), user=getpass.getuser())
            if denied:  # every other write would fail alike
                stop, stopped = Stop.DENIED, denied
                notes.append(stopped)
                self._audit_skipped(plan, cycle, writes[index:], stopped)
                break
        running_jobs = {p.job.job_id: p.job for p in plan.jobs}
        # a preemption waits for its job's own writes (its pin and protected value, ranked first):
        # without them the freed nodes would go to whatever Slurm starts next
        unwritten = {w.job_id for w in plan.held_back} | {w.job_id for w, o in outcomes if not o.ok}
        unwritten |= {w.job_id for w in plan.writes[len(outcomes):]}
        for group in requeue_groups(plan.requeues):
            beneficiary = group[0].for_job
            why = stopped or (
                "error limit or cycle deadline reached"
                if errors >= engine.breaker_max_errors or self.clock() - started > engine.cycle_deadline_s
                else f"job {beneficiary}'s pin and priority were not written" if beneficiary in unwritten else "")
            if why and stopped_before:  # the cycle's one row says it
                continue
            if why:
                with self.store.transaction():
                    for requeue in group:
                        self.store.audit(AuditEntry(
                            plan.time, cycle, requeue.job_id, "skipped", "requeue not attempted", "(not run)",
                            "none", False, why, requeue.reason, user=self._owners.get(requeue.job_id, ""),
                        ))
                continue
            if engine.preempt_signal is not None:
                waiting = self._grace(group, running_jobs, plan.time, cycle)
                errors += sum(1 for o in waiting.values() if o is not None and not o.ok and not o.job_gone)
                signals += sum(1 for o in waiting.values() if o is not None and o.ok)
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
        self._remember(plan, succeeded, {r.job_id for r, o in requeued if o.ok}, cycle,
                       _rooms(plan, requeued))
        seconds = self.clock() - started
        write_calls = self.backend.calls - calls_before
        report = CycleReport(
            plan, True, tuple(outcomes), tuple(requeued), errors, seconds,
            plan.read_calls + write_calls, write_calls, tuple(notes), denied, self.store.preemption_totals(),
            budget_held, signals, paused is not None, self.store.breaker() is not None,
            time.perf_counter() - phase_started, stop,
        )
        with self.store.transaction():
            self.store.record_cycle(_summary(report))
        return report

    def _requeue(self, requeue: Requeue, now: float, cycle: int) -> WriteOutcome:
        """`scontrol requeue`, with its audit row written ahead (as `_write` does for updates)."""
        with self.store.transaction():
            entry_id = self.store.audit(AuditEntry(
                now, cycle, requeue.job_id, "requeue", "requeued", f"requeue {requeue.job_id}",
                "none: a requeue cannot be undone", False, UNCONFIRMED, requeue.reason,
                user=self._owners.get(requeue.job_id, ""),
            ))
        outcome = self.backend.requeue(requeue.job_id)
        with self.store.transaction():
            self.store.finish_audit(entry_id, outcome.ok, outcome.message, outcome.command)
        log.info("job %s: requeued (%s)%s", requeue.job_id, requeue.reason,
                 "" if outcome.ok else f" FAILED: {outcome.message}",
                 extra={"dike": {"job": requeue.job_id, "action": "requeue", "ok": outcome.ok}})
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
                    "none: a signal cannot be undone", False, UNCONFIRMED, requeue.reason,
                    user=self._owners.get(requeue.job_id, ""),
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

    def _audit_stopped_cycle(self, plan: CyclePlan, cycle: int, why: str) -> None:
        """A cycle paused or with the breaker latched: one row (job 0) for everything it planned,
        not a row per write every cycle."""
        planned = f"{len(plan.writes)} planned write(s) and {len(plan.requeues)} requeue(s) not made"
        jobs = sorted({w.job_id for w in plan.writes} | {r.job_id for r in plan.requeues})
        with self.store.transaction():
            self.store.audit(AuditEntry(plan.time, cycle, 0, "skipped", planned, "(not run)", "none", False, why,
                                        f"jobs {', '.join(map(str, jobs[:20]))}" + (", ..." if len(jobs) > 20 else "")
                                        if jobs else "nothing planned", user=getpass.getuser()))

    def _audit_skipped(self, plan: CyclePlan, cycle: int, writes, why: str) -> None:
        """Writes the cycle planned but did not attempt: in the audit as such (ok = 0, action skipped)."""
        with self.store.transaction():
            for write in writes:
                self.store.audit(AuditEntry(
                    plan.time, cycle, write.job_id, "skipped", change_text(write), "(not run)",
                    "none", False, why, write.reason, user=self._owners.get(write.job_id, ""),
                ))

    def _write_batch(self, writes: Sequence[PlannedWrite], now: float, cycle: int, timeout: float) -> list[WriteOutcome]:
        """Write these through the backend in one call (`apply_many`), each audited ahead."""
        # Write-ahead: the audit rows exist (as unconfirmed) before Slurm is called, so a crash
        # between the call and their record still leaves every attempt in the audit.
        changes = [change_text(write) for write in writes]
        with self.store.transaction():
            entry_ids = [self.store.audit(AuditEntry(
                now, cycle, write.job_id, "update", change,
                self.backend.describe(write.update) if write.update.values else "(none)",
                self.backend.describe(write.undo) if write.undo.values else "none",
                False, UNCONFIRMED, write.reason, user=self._owners.get(write.job_id, ""),
            )) for write, change in zip(writes, changes)]
        sent = iter(self.backend.apply_many([w.update for w in writes if w.update.values], timeout))
        outcomes = [next(sent) if write.update.values else WriteOutcome(True, "(none: Slurm already holds the original)")
                    for write in writes]
        with self.store.transaction():
            for entry_id, write, outcome in zip(entry_ids, writes, outcomes):
                self._record(entry_id, write, outcome, now)
        for write, change, outcome in zip(writes, changes, outcomes):
            log.info(
                "job %s: %s (%s)%s", write.job_id, change, write.reason,
                "" if outcome.ok else f" FAILED: {outcome.message}",
                extra={"dike": log_fields(write) | {"ok": outcome.ok}},
            )
        return outcomes

    def _record(self, entry_id: int, write: PlannedWrite, outcome: WriteOutcome, now: float) -> None:
        """A write's audit row completed, and the fields the engine now owns (inside a transaction)."""
        self.store.finish_audit(entry_id, outcome.ok, outcome.message, outcome.command)
        if outcome.ok:
            originals = dict(write.originals)
            for key, value in write.update.values:
                if key not in write.restores:
                    self.store.record_write(write.job_id, key, originals[key], value, now)
            self.store.release(write.job_id, write.restores)
        elif outcome.job_gone and write.kind == "placement" and not started(outcome):
            # gone for good; a job that started keeps its constraints in Slurm (they apply again
            # after a requeue), so the engine keeps them too and puts them back once it is pending
            self.store.release(write.job_id, [f for f in write.update.fields if f.is_placement])

    def _remember(self, plan: CyclePlan, succeeded: set[tuple[int, JobField]], requeued: set[int], cycle: int,
                  rooms: Mapping[int, FreedRoom]) -> None:
        """Each managed job's memory, written when it changed or its last_seen is LAST_SEEN_EVERY_S old;
        the preemptions followed (`rooms`: those made this cycle) and those settled, audited."""
        memory = self.store.jobs()
        memories = []
        for job_plan in plan.jobs:
            if not job_plan.managed:
                continue
            job = job_plan.job
            old = memory.get(job.job_id)
            written_level = old.written_level if old else None
            if (job.job_id, self.strategy_field) in succeeded:
                written_level = job_plan.level
            changes = {
                "level": job_plan.level,
                "written_level": written_level,
                "attained_gpu_s": job.attained_gpu_s,
                "attained_at_promotion_gpu_s": service_forgiven(
                    old.attained_at_promotion_gpu_s if old else 0.0, job_plan.promoted, job.attained_gpu_s),
                "promotions": (old.promotions if old else 0) + (1 if job_plan.promoted else 0),
                "requeues": (old.requeues if old else 0) + (1 if job.job_id in requeued else 0),
                "hands_off": job_plan.hands_off,
                "hands_off_reason": job_plan.hands_off_reason,
                "reason": job_plan.reason,
            }
            # unchanged: every value == the remembered one (compared by the items views, in C)
            fresh = old is not None and plan.time - old.last_seen < LAST_SEEN_EVERY_S
            if fresh and changes.items() <= old.__dict__.items():  # type: ignore[union-attr]
                continue  # what most jobs of a quiet cycle come to
            memories.append(replace(old, last_seen=plan.time, **changes) if old
                            else JobMemory(job.job_id, plan.time, **changes))
        lookback_start = self.config.accounting.window_start(plan.time)
        with self.store.transaction():
            self.store.remember(memories)
            for job_plan in plan.jobs:  # a user took these over: the engine no longer owns them
                if job_plan.hands_off:
                    self.store.release(job_plan.job.job_id, job_plan.hands_off)
            self.store.add_runs(plan.new_runs)
            if plan.accounting_ok:
                self.store.set_last_sync(plan.time)
            if plan.site_span is not None:
                self.store.set_site_span(plan.site_span)
            followed = {room.job_id: room for room in plan.freed_rooms}
            for job_id, room in rooms.items():  # a new plan for a job still followed adds its victims
                earlier = followed.get(job_id)
                followed[job_id] = room if earlier is None else replace(room, victims=earlier.victims + room.victims)
            self.store.set_freed_rooms(followed.values())
            for settled in plan.room_outcomes:
                room = settled.room
                self.store.audit(AuditEntry(
                    plan.time, cycle, room.job_id, "preemption", settled.outcome, "(none)", "none",
                    settled.outcome != WASTED, settled.why,
                    f"requeued {', '.join(map(str, room.victims))} at {format_timestamp(room.requeued_at)} "
                    f"to free {','.join(room.nodes)}", user=self._owners.get(room.job_id, ""),
                ))
            self.store.add_preemption_outcomes(requeues_by_outcome(plan.room_outcomes))
            self.store.prune_runs(lookback_start, [p.job.job_id for p in plan.jobs])
            # last_seen may lag the truth by LAST_SEEN_EVERY_S: never forget a job sooner than FORGET_AFTER_S
            self.store.forget_jobs(plan.time - FORGET_AFTER_S - LAST_SEEN_EVERY_S)


def _rooms(plan: CyclePlan, requeued: Sequence[tuple[Requeue, WriteOutcome]]) -> dict[int, FreedRoom]:
    """The preemptions this cycle made: per job they were for, its pinned nodes and the victims requeued."""
    victims: dict[int, list[int]] = {}
    for requeue, outcome in requeued:
        if outcome.ok and requeue.for_job is not None:
            victims.setdefault(requeue.for_job, []).append(requeue.job_id)
    rooms = {}
    for job_id, requeued_ids in victims.items():
        job_plan = plan.job(job_id)
        pinned = job_plan.placement_wanted.require_nodes if job_plan and job_plan.placement_wanted else ()
        if pinned:
            rooms[job_id] = FreedRoom(job_id, tuple(sorted(pinned)), tuple(requeued_ids), plan.time)
    return rooms


def _summary(report: CycleReport) -> CycleSummary:
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
