"""What one cycle plans: its writes, each job's plan, the whole cycle's plan, and what the
guardrails did to it. Built by `reconcile.diff` and `reconcile.guardrails`, written by `apply.py`."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from dike_slurm.domain.fields import FieldValue, JobField, JobUpdate
from dike_slurm.domain.decisions import PriorInForce, Requeue
from dike_slurm.domain.freed_rooms import FreedRoom, RoomOutcome
from dike_slurm.domain.model import Job, Node, Placement, Topology
from dike_slurm.domain.service_prior import Prediction
from dike_slurm.store.state import OwnedField, SiteSpan
from dike_slurm.slurm.usage import Run


class Guard(Enum):
    """A guardrail that held writes back (`reconcile.guardrails`)."""

    BREAKER = "breaker"  # mass rewrite: the circuit breaker trips, nothing is written this cycle
    MAX_CHANGES = "max_changes"  # more writes than max_changes_per_cycle: the rest waits for the next cycle


@dataclass(frozen=True)
class GuardNote:
    """What a guardrail did, typed, with the text the cycle's notes show."""

    guard: Guard
    text: str


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


@dataclass(frozen=True, kw_only=True)
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
    outside_window: bool = False  # pending beyond the head window: Slurm's own factors order it
    exempt: str = ""  # why the engine never writes it (domain.model.EXEMPT_KINDS), "" when it may
    # not pending, and the engine may not requeue it (not opted in, or no preemption): Slurm reads
    # neither its priority nor the AdminComment written with it, so neither is written
    priority_unused: bool = False


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
    guards: tuple[GuardNote, ...] = ()  # what the guardrails did (their texts are among `notes`)
    outside: tuple[Job, ...] = ()  # the active jobs outside the scope (`queue` and `explain` name them)
    site_span: SiteSpan | None = None  # the span just read from the site (an applied cycle stores it)
    freed_rooms: tuple[FreedRoom, ...] = ()  # preemptions still followed after this cycle's look
    room_outcomes: tuple[RoomOutcome, ...] = ()  # preemptions settled by this cycle's look (landed, wasted)
    expected: Mapping[int, Prediction] = field(default_factory=dict)  # the policy's service prior, by job
    prior: PriorInForce | None = None  # the service prior as the cycle used it
    window: int = 0  # pending jobs per partition the engine orders (head_window); 0: every one
    # SiteFactors the engine sent without learning the outcome and that Slurm holds: its own (an applied cycle owns them)
    adopted: tuple[OwnedField, ...] = ()
    # seconds of each phase (read, decide, diff) of the plan; the metrics export them
    phase_seconds: Mapping[str, float] = field(default_factory=dict, compare=False)
    # (predicted, attained) GPU-seconds of the jobs that finished since the last cycle, their
    # prediction being the service prior's last one while they were pending (the metrics export it)
    prior_judged: tuple[tuple[float, float], ...] = field(default=(), compare=False)
    # the read's nodes and switch tree, whole (the snapshot keeps the nodes in scope): what the
    # expected starts of `queue` and `explain` simulate on (sim/forward.py)
    nodes: tuple[Node, ...] = field(default=(), compare=False)
    topology: Topology | None = field(default=None, compare=False)

    def job(self, job_id: int) -> JobPlan | None:
        return next((p for p in self.jobs if p.job.job_id == job_id), None)

    @property
    def breaker(self) -> str:
        """Why the mass-rewrite breaker tripped in this plan ("" when it did not)."""
        return next((note.text for note in self.guards if note.guard is Guard.BREAKER), "")
