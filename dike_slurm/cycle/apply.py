"""Apply: a cycle plan's writes through the backend, each audited ahead in the state store.

Every write, requeue and signal has its audit row (built by the cycle's `Journal`) committed as
"unconfirmed" before Slurm is called, then completed with the result (and, for a write, the field
the engine now owns, in the same transaction), so a crash at any point leaves the attempt in the
audit. The circuit breakers, the cycle deadline and the preemption grace signal are enforced
here; afterwards the cycle's levels, promotions and runs are remembered, and a field found someone
else's (a user's change, a SiteFactor the site set) is audited `left-alone` once, in the transaction
that remembers it and lets go of it.
"""

from __future__ import annotations

import getpass
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import partial

from dike_slurm.slurm.backends.base import Backend, WriteOutcome, started
from dike_slurm.domain.fields import JobField
from dike_slurm.config import Config
from dike_slurm.domain.decisions import Requeue, service_forgiven
from dike_slurm.domain.freed_rooms import WASTED, FreedRoom, requeues_by_outcome
from dike_slurm.domain.model import Job
from dike_slurm.parsing.durations import format_timestamp
from dike_slurm.cycle.plan import CyclePlan, JobPlan, PlannedWrite
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


@dataclass(frozen=True, kw_only=True)
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
    left_alone: int = 0  # jobs with a field this cycle found someone else's (audited left-alone)


def field_changes(write: PlannedWrite) -> list[tuple[JobField, object, object]]:
    """(field, what Slurm held just before the write, the value written) for each field."""
    before = dict(write.originals) | dict(write.before)  # `before` is what Slurm held; plans without it: the original
    return [(key, before.get(key), value) for key, value in write.update.values]


def change_text(write: PlannedWrite) -> str:
    """A write as the audit shows it: each field from the value Slurm held to the new one."""
    return "; ".join(
        f"{key.value} {describe_value(old)} -> {describe_value(new)}" for key, old, new in field_changes(write)
    ) or "released " + ", ".join(f.value for f in write.restores)


def unconfirmed_site_factor(entry: AuditEntry | None) -> tuple[int, int] | None:
    """(SiteFactor before, SiteFactor sent) of an update whose outcome the engine never learned
    (its scontrol killed, or the engine stopped before Slurm answered), from its change_text."""
    if entry is None or entry.ok or not entry.message.startswith("unconfirmed"):
        return None
    match = _SITE_FACTOR_CHANGE.match(entry.change)
    return (int(match[1]), int(match[2])) if match else None


_SITE_FACTOR_CHANGE = re.compile(rf"{JobField.SITE_FACTOR.value} (-?\d+) -> (-?\d+)(?:;|$)")  # change_text's first field


def log_fields(write: PlannedWrite) -> dict[str, object]:
    """The structured part of a write's log record (JSON logs carry it): job, then field, old, new."""
    return {"job": write.job_id, "changes": [
        {"field": key.value, "old": describe_value(old), "new": describe_value(new)}
        for key, old, new in field_changes(write)
    ]}


@dataclass
class Stopping:
    """Whether, and why, a cycle stopped writing."""

    stop: Stop | None = None
    why: str = ""  # among the notes, and the message of each row of what was not attempted
    before_writes: bool = False  # paused or breaker latched: one row says it for the whole cycle

    def halt(self, stop: Stop, why: str) -> None:
        self.stop, self.why = stop, why

    @property
    def denied(self) -> str:
        """What to grant, when Slurm refused a write for lack of rights ("" otherwise)."""
        return self.why if self.stop is Stop.DENIED else ""


@dataclass
class Tally:
    """What a cycle's writes and requeues came to so far."""

    outcomes: list[tuple[PlannedWrite, WriteOutcome]] = field(default_factory=list)
    requeued: list[tuple[Requeue, WriteOutcome]] = field(default_factory=list)
    succeeded: set[tuple[int, JobField]] = field(default_factory=set)  # (job, field) written
    notes: list[str] = field(default_factory=list)
    errors: int = 0  # failed calls; a job gone, or a write Slurm asked for again later, not counted
    signals: int = 0
    budget_held: int = 0

    def count_failure(self, outcome: WriteOutcome) -> None:
        if not outcome.ok and not outcome.job_gone and not outcome.retry_later:
            self.errors += 1


@dataclass
class Journal:
    """The audit rows of one cycle. A call to Slurm has its row committed first, as unconfirmed
    (`ahead`), and completed with the answer (`finish`), so a crash at any point leaves the
    attempt in the audit; what the cycle did not attempt has a row of its own (`not_attempted`)."""

    store: StateStore
    cycle: int
    at: float  # every row's time: the plan's (a revert's: when it runs)
    owners: Mapping[int, str]  # job id -> user (the audit's user column)

    def add(self, job_id: int, action: str, change: str, command: str, undo: str, ok: bool, message: str,
            reason: str, user: str | None = None) -> int:
        """One row (inside the caller's transaction); its id. `user`: the job's owner unless given."""
        return self.store.audit(AuditEntry(
            self.at, self.cycle, job_id, action, change, command, undo, ok, message, reason,
            user=self.owners.get(job_id, "") if user is None else user,
        ))

    def ahead(self, job_id: int, action: str, change: str, command: str, undo: str, reason: str) -> int:
        """The write-ahead row of a call about to be made (inside the caller's transaction)."""
        return self.add(job_id, action, change, command, undo, False, UNCONFIRMED, reason)

    def finish(self, entry_id: int, outcome: WriteOutcome) -> None:
        """A write-ahead row completed with Slurm's answer (inside the caller's transaction)."""
        self.store.finish_audit(entry_id, outcome.ok, outcome.message, outcome.command)

    def not_attempted(self, job_id: int, change: str, why: str, reason: str, user: str | None = None) -> None:
        self.add(job_id, "skipped", change, "(not run)", "none", False, why, reason, user)

    def call(self, job_id: int, action: str, change: str, command: str, undo: str, reason: str,
             slurm: Callable[[], WriteOutcome]) -> WriteOutcome:
        """One call to Slurm between its write-ahead row and its completion, each committed alone."""
        with self.store.transaction():
            entry_id = self.ahead(job_id, action, change, command, undo, reason)
        outcome = slurm()
        with self.store.transaction():
            self.finish(entry_id, outcome)
        return outcome


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

    def apply(self, plan: CyclePlan, started: float | None = None) -> CycleReport:
        """Write the plan, audit every write, remember levels, runs and promotions."""
        started = self.clock() if started is None else started
        calls_before = self.backend.calls
        journal = Journal(self.store, self.store.next_cycle(), plan.time, {p.job.job_id: p.job.user for p in plan.jobs})
        tally = Tally()
        if plan.adopted:  # its own earlier writes, found in Slurm: owned from now on (before this cycle's)
            with self.store.transaction():
                for mine in plan.adopted:
                    self.store.record_write(mine.job_id, mine.field, mine.original, mine.written, mine.written_at)
        stopping = self._gate(plan, journal, tally)
        phase_started = time.perf_counter()
        self._batches(plan, journal, tally, stopping, started)
        self._requeues(plan, journal, tally, stopping, started)
        requeued = {r.job_id for r, o in tally.requeued if o.ok}
        memories, left_alone = self._memories(plan, tally.succeeded, requeued)
        self._remember(plan, memories, journal, _rooms(plan, tally.requeued), left_alone)
        seconds = self.clock() - started
        write_calls = self.backend.calls - calls_before
        report = CycleReport(
            plan=plan, applied=True, outcomes=tuple(tally.outcomes), requeued=tuple(tally.requeued),
            errors=tally.errors, seconds=seconds, slurm_calls=plan.read_calls + write_calls,
            write_calls=write_calls, notes=tuple(tally.notes), denied=stopping.denied,
            preemption_totals=self.store.preemption_totals(), budget_held=tally.budget_held, signals=tally.signals,
            paused=stopping.stop is Stop.PAUSED, breaker_latched=self.store.breaker() is not None,
            write_seconds=time.perf_counter() - phase_started, stopped=stopping.stop, left_alone=len(left_alone),
        )
        with self.store.transaction():
            self.store.record_cycle(_summary(report))
        return report

    def _gate(self, plan: CyclePlan, journal: Journal, tally: Tally) -> Stopping:
        """Paused, or the breaker latched (by an earlier cycle or this plan's mass rewrite): the
        cycle writes nothing, and one row (job 0) says what it planned, not a row per write."""
        paused = self.store.paused()
        tripped = self.store.breaker()
        if paused is None and tripped is None and plan.breaker:
            tripped = self._trip(plan.breaker)
        if paused is not None:
            stopping = Stopping(Stop.PAUSED, f"paused ({paused}): nothing is written until an operator runs "
                                             f"`dike-slurm resume`", before_writes=True)
        elif tripped is not None:
            stopping = Stopping(Stop.BREAKER, f"circuit breaker tripped ({tripped}): nothing is written until an "
                                              f"operator runs `dike-slurm breaker reset`", before_writes=True)
        else:
            return Stopping()
        tally.notes.append(stopping.why)
        planned = f"{len(plan.writes)} planned write(s) and {len(plan.requeues)} requeue(s) not made"
        jobs = sorted({w.job_id for w in plan.writes} | {r.job_id for r in plan.requeues})
        listed = f"jobs {', '.join(map(str, jobs[:20]))}" + (", ..." if len(jobs) > 20 else "") if jobs else "nothing planned"
        with self.store.transaction():
            journal.not_attempted(0, planned, stopping.why, listed, user=getpass.getuser())
        return stopping

    def _batches(self, plan: CyclePlan, journal: Journal, tally: Tally, stopping: Stopping, started: float) -> None:
        """The plan's writes in batches, until the breaker's error limit, the cycle deadline, a
        refusal for lack of rights or the write budget stops them."""
        engine = self.config.engine
        writes = () if stopping.stop else plan.writes
        index, size = 0, FIRST_BATCH
        writing_since = self.clock()
        while index < len(writes):
            left = engine.cycle_deadline_s - (self.clock() - started)
            spent = self.clock() - writing_since
            if spent >= engine.write_budget_s and tally.errors < engine.breaker_max_errors and left >= 0:
                # the queue's tail waits for the next cycle, which plans it again (not audited one
                # by one: at a big site that would be thousands of rows a cycle)
                tally.budget_held = len(writes) - index
                tally.notes.append(f"write budget {engine.write_budget_s:g}s used ({spent:.1f}s, {index} write(s)): "
                                   f"{tally.budget_held} write(s) further down the queue wait for the next cycle")
                return
            if tally.errors >= engine.breaker_max_errors:
                stopping.halt(Stop.FAILED_WRITES, f"circuit breaker: {tally.errors} failed writes; nothing more is "
                                                  f"written until an operator resets it")
                self._trip(f"{tally.errors} failed writes in cycle {journal.cycle}")
            elif left < 0:
                stopping.halt(Stop.DEADLINE, f"cycle deadline {engine.cycle_deadline_s:g}s passed; the rest waits "
                                             f"for the next cycle")
            if stopping.stop:
                return self._skip(writes[index:], journal, tally, stopping)
            # the first batch, and every batch after a failure, can fail no more writes than the
            # breaker still allows; batches after clean ones double
            room = size if tally.errors == 0 and index > 0 else engine.breaker_max_errors - tally.errors
            batch = writes[index:index + min(size, room)]
            index += len(batch)
            size = min(2 * len(batch), MAX_BATCH)
            denied = ""
            later = []
            for write, outcome in zip(batch, self._write_batch(batch, journal, left)):
                tally.outcomes.append((write, outcome))
                tally.count_failure(outcome)
                if outcome.retry_later:
                    later.append(write.job_id)
                if outcome.ok:
                    tally.succeeded.update((write.job_id, f) for f in write.update.fields)
                elif not outcome.job_gone and not denied and any(words in outcome.message for words in _DENIED):
                    denied = PRIVILEGE_HINT.format(message=outcome.message.strip(), user=getpass.getuser())
            if later:
                tally.notes.append(f"job(s) {', '.join(map(str, later))}: Slurm asked for the update again later "
                                   "(its database index is being set): the next cycle writes it if the job is "
                                   "still there")
            if denied:  # every other write would fail alike
                stopping.halt(Stop.DENIED, denied)
                return self._skip(writes[index:], journal, tally, stopping)

    def _skip(self, writes: Sequence[PlannedWrite], journal: Journal, tally: Tally, stopping: Stopping) -> None:
        """Writes the cycle planned but did not attempt: in the audit as such (ok = 0, action skipped)."""
        tally.notes.append(stopping.why)
        with self.store.transaction():
            for write in writes:
                journal.not_attempted(write.job_id, change_text(write), stopping.why, write.reason)

    def _requeues(self, plan: CyclePlan, journal: Journal, tally: Tally, stopping: Stopping, started: float) -> None:
        """The preemptions' requeues, group by group (a job's victims together), each after its
        victims' grace signal when engine.preempt_signal is set."""
        engine = self.config.engine
        running_jobs = {p.job.job_id: p.job for p in plan.jobs}
        # a preemption waits for its job's own writes (its pin and protected value, ranked first):
        # without them the freed nodes would go to whatever Slurm starts next
        unwritten = {w.job_id for w in plan.held_back} | {w.job_id for w, o in tally.outcomes if not o.ok}
        unwritten |= {w.job_id for w in plan.writes[len(tally.outcomes):]}
        for group in requeue_groups(plan.requeues):
            beneficiary = group[0].for_job
            why = stopping.why or (
                "error limit or cycle deadline reached"
                if tally.errors >= engine.breaker_max_errors or self.clock() - started > engine.cycle_deadline_s
                else f"job {beneficiary}'s pin and priority were not written" if beneficiary in unwritten else "")
            if why:
                if not stopping.before_writes:  # else the cycle's one row says it
                    with self.store.transaction():
                        for requeue in group:
                            journal.not_attempted(requeue.job_id, "requeue not attempted", why, requeue.reason)
                continue
            if engine.preempt_signal is not None:
                waiting = self._grace(group, running_jobs, journal)
                for outcome in waiting.values():
                    if outcome is not None:
                        tally.count_failure(outcome)
                        tally.signals += outcome.ok
                if waiting:
                    tally.notes.append(
                        f"job(s) {', '.join(map(str, waiting))} signalled {engine.preempt_signal}: requeued once "
                        f"{engine.preempt_grace_s:g}s have passed"
                    )
                    continue
            for requeue in group:
                outcome = self._requeue(requeue, journal)
                tally.requeued.append((requeue, outcome))
                tally.count_failure(outcome)

    def _requeue(self, requeue: Requeue, journal: Journal) -> WriteOutcome:
        """`scontrol requeue`, audited ahead."""
        job_id = requeue.job_id
        outcome = journal.call(job_id, "requeue", "requeued", f"requeue {job_id}", "none: a requeue cannot be undone",
                               requeue.reason, partial(self.backend.requeue, job_id))
        log.info("job %s: requeued (%s)%s", job_id, requeue.reason,
                 "" if outcome.ok else f" FAILED: {outcome.message}",
                 extra={"dike": {"job": job_id, "action": "requeue", "ok": outcome.ok}})
        return outcome

    def _grace(self, group: list[Requeue], jobs: Mapping[int, Job], journal: Journal) -> dict[int, WriteOutcome | None]:
        """Signal the victims not signalled in their current run; the ones still inside their grace
        period (None: signalled earlier). Empty: every victim's grace has passed, requeue them."""
        engine = self.config.engine
        signal = engine.preempt_signal
        assert signal is not None
        waiting: dict[int, WriteOutcome | None] = {}
        for requeue in group:
            job_id = requeue.job_id
            job = jobs.get(job_id)
            since = job.start_time if job is not None and job.start_time is not None else 0.0
            sent = self.store.last_done(job_id, "signal", since)
            if sent is not None:
                if journal.at - sent < engine.preempt_grace_s:
                    waiting[job_id] = None
                continue
            waiting[job_id] = journal.call(
                job_id, "signal", f"signal {signal} before requeue", f"signal {job_id}",
                "none: a signal cannot be undone", requeue.reason, partial(self.backend.signal, job_id, signal))
        return waiting

    def _trip(self, reason: str) -> str:
        with self.store.transaction():
            self.store.trip_breaker(reason)
        log.error("circuit breaker tripped: %s", reason)
        return reason

    def _write_batch(self, writes: Sequence[PlannedWrite], journal: Journal, timeout: float) -> list[WriteOutcome]:
        """Write these through the backend in one call (`apply_many`), each audited ahead."""
        changes = [change_text(write) for write in writes]
        with self.store.transaction():
            entry_ids = [journal.ahead(
                write.job_id, "update", change,
                self.backend.describe(write.update) if write.update.values else "(none)",
                self.backend.describe(write.undo) if write.undo.values else "none", write.reason,
            ) for write, change in zip(writes, changes)]
        sent = iter(self.backend.apply_many([w.update for w in writes if w.update.values], timeout))
        outcomes = [next(sent) if write.update.values else WriteOutcome(True, "(none: Slurm already holds the original)")
                    for write in writes]
        with self.store.transaction():
            for entry_id, write, outcome in zip(entry_ids, writes, outcomes):
                journal.finish(entry_id, outcome)
                self._own(write, outcome, journal.at)
        for write, change, outcome in zip(writes, changes, outcomes):
            log.info(
                "job %s: %s (%s)%s", write.job_id, change, write.reason,
                "" if outcome.ok else f" FAILED: {outcome.message}",
                extra={"dike": log_fields(write) | {"ok": outcome.ok}},
            )
        return outcomes

    def _own(self, write: PlannedWrite, outcome: WriteOutcome, now: float) -> None:
        """The fields the engine owns after a write (inside the transaction that completes its row)."""
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

    def _memories(self, plan: CyclePlan, succeeded: set[tuple[int, JobField]],
                  requeued: set[int]) -> tuple[list[JobMemory], list[tuple[JobPlan, tuple[JobField, ...]]]]:
        """Each managed job's memory that changed or whose last_seen is LAST_SEEN_EVERY_S old; the
        jobs with fields found someone else's this cycle, with those fields."""
        memory = self.store.jobs()
        memories = []
        left_alone = []
        for job_plan in plan.jobs:
            if not job_plan.managed:
                continue
            job = job_plan.job
            old = memory.get(job.job_id)
            if job_plan.hands_off:
                new = tuple(f for f in job_plan.hands_off if old is None or f not in old.hands_off)
                if new:
                    left_alone.append((job_plan, new))
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
        return memories, left_alone

    def _remember(self, plan: CyclePlan, memories: list[JobMemory], journal: Journal,
                  rooms: Mapping[int, FreedRoom], left_alone: Sequence[tuple[JobPlan, tuple[JobField, ...]]]) -> None:
        """The jobs' memories, the runs, the preemptions followed (`rooms`: those made this cycle)
        and those settled, audited; the fields found someone else's, audited left-alone."""
        lookback_start = self.config.accounting.window_start(plan.time)
        with self.store.transaction():
            self.store.remember(memories)
            for job_plan in plan.jobs:  # a user (or the site) took these over: the engine no longer owns them
                if job_plan.hands_off:
                    self.store.release(job_plan.job.job_id, job_plan.hands_off)
            for job_plan, fields in left_alone:
                journal.add(job_plan.job.job_id, "left-alone", _left_alone_text(job_plan, fields, self.strategy_field),
                            "(none)", "none", True, job_plan.hands_off_reason, job_plan.reason)
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
                journal.add(
                    room.job_id, "preemption", settled.outcome, "(none)", "none", settled.outcome != WASTED,
                    settled.why, f"requeued {', '.join(map(str, room.victims))} at "
                    f"{format_timestamp(room.requeued_at)} to free {','.join(room.nodes)}",
                )
            self.store.add_preemption_outcomes(requeues_by_outcome(plan.room_outcomes))
            self.store.prune_runs(lookback_start, [p.job.job_id for p in plan.jobs])
            # last_seen may lag the truth by LAST_SEEN_EVERY_S: never forget a job sooner than FORGET_AFTER_S
            self.store.forget_jobs(plan.time - FORGET_AFTER_S - LAST_SEEN_EVERY_S)


def _left_alone_text(job_plan: JobPlan, fields: Sequence[JobField], strategy: JobField) -> str:
    """What a left-alone row keeps: `SiteFactor 880000 kept`, `Switches, Features kept`."""
    return ", ".join(f"{f.value} {job_plan.value_now}" if f is strategy and job_plan.value_now is not None
                     else f.value for f in fields) + " kept"


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
