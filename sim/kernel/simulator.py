"""The discrete-event replay: one trace, one policy, Slurm-like scheduling of a simulated cluster.

A simulator you step, in SimPy's manner: `step()` handles the next event of one heap, `run(until)`
steps to a time or to the end. Events are ordered by (time, round, kind, sequence). At one
instant they are handled in rounds: those due when the instant begins, then those that round
added for the same instant, and so on; within a round run ends come first, then submissions,
then wake-ups (a job becoming eligible, a Switches wait running out), then a cycle's decisions
reaching Slurm, then the policy cycle and the backfill tick. When no event of the instant is
left, Slurm's passes follow as one more round (sim/kernel/scheduler.py): the main pass if anything
changed, the backfill pass if its tick fell and something changed since its last pass. See
docs/replay.md for the semantics and the simplifications.

Beside it: the snapshot views (sim/kernel/views.py), the rooms preemptions free (sim/kernel/rooms.py), the
finished jobs' service (sim/kernel/history.py) and the engine's writes (sim/kernel/priority.py).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple

from dike_slurm.domain.decisions import Decisions, service_forgiven
from dike_slurm.errors import DikeError
from dike_slurm.domain.model import NO_PLACEMENT, Job, JobState, Placement, Snapshot
from dike_slurm.policies.base import Policy, PolicyParams
from dike_slurm.cycle.requeue_guard import guard_requeues, requeue_limits
from dike_slurm.domain.service_prior import PriorLearner
from dike_slurm.sim.kernel.cluster import SimCluster
from dike_slurm.sim.kernel.history import FinishedService
from dike_slurm.sim.kernel.priority import SlurmOrder, cycle_writes, policy_placements
from dike_slurm.sim.kernel.job import DONE, INFINITY, PENDING, RUNNING, SimJob
from dike_slurm.sim.kernel.records import JobResult, SimSettings, SimStats, Timeline
from dike_slurm.sim.kernel.rooms import FreedRooms
from dike_slurm.sim.kernel.scheduler import Shape, SlurmScheduler, main_pass_time, next_tick
from dike_slurm.sim.kernel.trace import TraceJob
from dike_slurm.sim.kernel.usage import DecayedUsage
from dike_slurm.sim.kernel.views import SnapshotViews
from dike_slurm.sim.kernel.warm import History

# Entry kinds, in the order they are handled within a round; the passes make a round of their own.
# END_INSTANT closes an instant: it schedules the instant's passes.
FINISH, SUBMIT, WAKE, LAND, CYCLE, BACKFILL, MAIN_PASS, BACKFILL_PASS, END_INSTANT = range(9)
# An instant's end goes this many rounds behind the event that opened the instant: no instant
# has as many rounds (each round is at least one event of the instant), so it is handled last.
INSTANT_ROUNDS = 1 << 40
STUCK_AFTER_S = 7 * 86400.0  # jobs waiting this long on an idle cluster: the replay stops


class Seated(NamedTuple):
    """A job running when a simulation resumes from a live state (`Simulator.resume`): its node
    indexes, the start it had, and when it is expected to end."""

    job: SimJob
    nodes: Sequence[int]
    started: float
    ends: float


class SimulationStuck(DikeError):
    """The replay cannot progress: jobs wait forever on an idle cluster."""


class EmptySchedule(DikeError):
    """`step()` was called with no event left."""


@dataclass(frozen=True)
class Awaiting:
    """A policy cycle waiting for its decisions (`Simulator.decide`)."""

    snapshot: Snapshot
    views: Mapping[int, Job]
    then: Callable[[], None] | None  # the scheduling pass the cycle came before, to finish


class Simulator:
    """Replays one trace under one policy on a simulated cluster.

    With `decides=False` the policy in the slot is only asked what it declares (its requeue
    minimum, its usage owner): at each policy cycle the simulator stops with the snapshot in
    `awaiting` until `decide(decisions)` hands it what was decided elsewhere (the live engine:
    sim/backend.py).
    """

    def __init__(
        self,
        trace: Iterable[TraceJob],
        cluster: SimCluster,
        policy: Policy,
        params: PolicyParams,
        settings: SimSettings,
        timeline: Timeline,
        on_finish: Callable[[JobResult], None],
        *,
        decides: bool = True,
        history: History | None = None,
    ) -> None:
        self.trace: Iterator[TraceJob] = iter(trace)
        self.cluster = cluster
        self.policy = policy
        self.params = params
        self.settings = settings
        self.timeline = timeline
        self.on_finish = on_finish
        self.decides = decides
        self.rng = random.Random(settings.seed)
        self.stats = SimStats()
        self.slurm_order = SlurmOrder(settings, settings.user_shares, basic=policy.replays_as_priority_basic(params))
        self.scheduler = SlurmScheduler(
            cluster, settings, self.stats, timeline.origin, self._start, self._wake, self.slurm_order)
        self.declared_ceiling = policy.score_ceiling(params)
        # decided at every cycle it falls due, as the live engine decides, unless the policy says
        # deciding later is the same (Policy.replay_may_postpone) and it never requeues
        self.decides_when_due = (policy.requeue_min_run_s(params) is not None
                                 or not policy.replay_may_postpone(params))
        self.requeue_limits = requeue_limits(policy, params, settings.max_requeues_per_cycle)
        self.events: list[tuple[float, int, int, int, SimJob | None]] = []
        self.sequence = 0
        self.now = -INFINITY
        self.round = 0  # of the event being handled
        self.instant_open = False  # events of this instant were handled, its end is on the heap
        self.awaiting: Awaiting | None = None
        # A cycle's decisions on their way to Slurm: (decisions, the snapshot's views and time, written)
        self.landing: tuple[Decisions, Mapping[int, Job], float, Mapping[int, int] | None] | None = None
        self.active: dict[int, SimJob] = {}  # submit order
        self.engine_placed: set[int] = set()  # jobs carrying a constraint the policy asked for
        self.freed_rooms = FreedRooms(cluster.names, self.stats)
        self.pending_count = 0
        self.cycle_armed = False
        self.backfill_armed = False
        self.backfill_due = False
        self.postponed_cycle: float | None = None  # due time of a cycle waiting to be evaluated
        self.idle_since: float | None = None  # jobs wait on an idle cluster since then
        self.changed = False  # something happened since the last main pass
        self.last_main_pass = -INFINITY
        self.main_pass_due: float | None = None  # a main pass is scheduled then
        self.backfill_changed = False  # ... since the last backfill pass
        self.usage = DecayedUsage(settings.usage_half_life_s)
        # Usage is kept per owner as the live engine keeps it: by account when the policy's
        # fairness is by account.
        self.usage_by_account = policy.usage_owner(params) == "account"
        # Finished jobs' GPU service and the service prior learned from them, each kept only for
        # a policy that reads it.
        self.finished = FinishedService(settings.history_window_s, policy.reads_completed_service(params),
                                        PriorLearner() if policy.reads_service_prior(params) else None)
        self.views = SnapshotViews(cluster, settings)
        self.shares = dict(settings.user_shares)
        # by entry kind
        self.handlers: tuple[Callable[[float, int, SimJob | None], None], ...] = (
            self._on_finish, self._on_submit, self._on_wake, self._on_land, self._on_cycle, self._on_backfill_tick,
            self._on_main_pass, self._on_backfill_pass, self._on_end_instant)
        if history is not None:
            self._warm(history)
        self._push_next_submit()

    def _warm(self, history: History) -> None:
        """Seed what the live engine reads from accounting on the window's first day: the past
        jobs' service and prior (in end order, as they finished) and the decayed usage of their
        runs, Dike's and Slurm's, as if the simulator had run them (sim/kernel/warm.py)."""
        model = self.settings.priority_model
        changes: list[tuple[float, int, float, TraceJob]] = []
        for past in history.jobs:
            trace, attained = past.trace, 0.0
            for run in past.runs:
                billing = 1.0 if model is None else model.gpu_weight(trace.partition, run.gpu_types)
                billed = trace.gpus * billing
                attained += billed * (run.end - run.start)
                changes += [(run.start, 1, billed, trace), (run.end, 0, -billed, trace)]
            self.finished.add(past.end, trace, attained)
        changes.sort(key=lambda change: (change[0], change[1]))  # each owner's changes in time order
        for at, _, billed, trace in changes:
            self.usage.change_rate(trace.account if self.usage_by_account else trace.user, at, billed)
            self.slurm_order.change_past_rate((trace.account, trace.user), at, billed)

    # ------------------------------------------------------------------ the loop

    def run(self, until: float | None = None) -> SimStats:
        """Step until simulated time `until` (events at `until` are left) or to the end; stop early
        when a policy cycle awaits decisions (`decides=False`). Returns the counters. An `until`
        not after the current time is an error: the simulation cannot run into its past."""
        if until is not None and until <= self.now:
            raise ValueError(f"run(until={until:g}): the simulation is at {self.now:g} already; "
                             "until must be later")
        limit = INFINITY if until is None else until
        while self.awaiting is None and self.peek() < limit:
            self.step()
        return self.stats

    def peek(self) -> float:
        """The time of the next entry on the heap (infinity when nothing is left)."""
        return self.events[0][0] if self.events else INFINITY

    def step(self) -> None:
        """Take the next entry off the heap and handle it. The first event of an instant puts the
        instant's end on the heap, behind every round the instant may still have."""
        if self.awaiting is not None:
            raise DikeError("a policy cycle awaits its decisions (Simulator.decide)")
        if not self.events:
            raise EmptySchedule("the simulation has no event left")
        now, self.round, kind, token, job = heapq.heappop(self.events)
        self.now = now
        if kind < MAIN_PASS:  # an event of the instant (not a pass, not the instant's end)
            if not self.instant_open:
                self.instant_open = True
                self._push(now, END_INSTANT, round_=self.round + INSTANT_ROUNDS)
            self.stats.events += 1
        self.handlers[kind](now, token, job)

    def _on_finish(self, now: float, token: int, job: SimJob | None) -> None:
        if job is not None and job.finish_token == token:
            self._finish(job, now)

    def _on_wake(self, now: float, token: int, job: SimJob | None) -> None:
        if job is not None and job.state == PENDING:
            self.scheduler.count_eligible(job)  # it became eligible
        self._touch()

    def _on_main_pass(self, now: float, token: int, job: SimJob | None) -> None:
        if now != self.main_pass_due:
            return  # superseded by an earlier pass
        self.main_pass_due = None
        self.last_main_pass = now
        self.changed = False  # the pass sees everything so far
        self._pass(self.scheduler.main_pass, now)

    def _on_backfill_pass(self, now: float, token: int, job: SimJob | None) -> None:
        if self.backfill_changed:
            self.backfill_changed = False
            self._pass(self.scheduler.backfill_pass, now)

    def _on_end_instant(self, now: float, token: int, job: SimJob | None) -> None:
        """The instant's events are handled: Slurm's passes follow, as the instant's last round."""
        self.instant_open = False
        if self.changed:
            self.changed = False
            due = main_pass_time(self.settings, self.timeline.origin, self.last_main_pass, now)
            if self.main_pass_due is None or due < self.main_pass_due:
                self.main_pass_due = due
                self._push(due, MAIN_PASS)
        if self.backfill_due:
            self.backfill_due = False
            self._push(now, BACKFILL_PASS)

    def _pass(self, scheduler_pass: Callable[[float, set[Shape]], None], now: float) -> None:
        """A scheduling pass; a postponed cycle is evaluated first if a job it covers could start."""
        if not self.pending_count:
            return
        fitting = self.scheduler.fitting_shapes()
        if self.postponed_cycle is not None and self._waiting_job_could_start(fitting):
            self._evaluate(now, then=lambda: self._pass_after_cycle(scheduler_pass, now))
        else:
            scheduler_pass(now, fitting)

    def _pass_after_cycle(self, scheduler_pass: Callable[[float, set[Shape]], None], now: float) -> None:
        self.changed = False  # this pass sees the decisions
        scheduler_pass(now, self.scheduler.fitting_shapes())

    def _touch(self) -> None:
        """Something the schedulers care about changed: both passes should look again."""
        self.changed = True
        self.backfill_changed = True

    def _on_backfill_tick(self, now: float, token: int, job: None) -> None:
        if not self.pending_count:
            self.backfill_armed = False
            return
        self.backfill_due = True
        self._push(now + self.settings.bf_interval_s, BACKFILL, None)

    def _push(self, time: float, kind: int, job: SimJob | None = None, *, round_: int | None = None) -> int:
        """Schedule an event; one for the current instant goes to the round after this one."""
        self.sequence += 1
        if round_ is None:
            round_ = self.round + 1 if time == self.now else 0
        heapq.heappush(self.events, (time, round_, kind, self.sequence, job))
        return self.sequence

    def _wake(self, time: float) -> None:
        """A scheduling pass is due at `time` (a Switches wait runs out)."""
        self._push(time, WAKE)

    def _push_next_submit(self) -> None:
        for trace_job in self.trace:
            self._push(trace_job.submit, SUBMIT, SimJob.from_trace(trace_job, self.settings, self.cluster))
            return

    def resume(self, at: float, running: Iterable[Seated], pending: Iterable[tuple[SimJob, Placement]]) -> None:
        """Begin at `at` from a live cluster's state instead of an empty cluster (sim/forward.py: the
        expected starts). Each running job holds its nodes from `at` and ends at its `ends`; its time
        limit, which backfill plans by, counts from the start it really had. Each pending job, its
        Slurm priority set by the caller, is queued at `at` with its placement. Before the first step."""
        if self.now != -INFINITY:
            raise DikeError("resume() comes before the simulation's first step")
        self.now = at
        for seated in running:
            job, nodes = seated.job, list(seated.nodes)
            self.active[job.trace.job_id] = job
            self.slurm_order.join(job, at)
            job.state = RUNNING
            job.start = job.first_start = seated.started
            job.nodes, job.leaves = nodes, self.cluster.leaves_spanned(nodes)
            job.planned_end = job.limit_end(seated.started)
            job.run_count += 1
            self.scheduler.count_eligible(job)  # occupy() takes a starting job off the pending counts
            self.scheduler.occupy(job)
            self.views.dirty_nodes.update(nodes)
            billed = job.trace.gpus * job.billing
            self.usage.change_rate(job.trace.account if self.usage_by_account else job.trace.user, at, billed)
            self.slurm_order.change_rate(job, at, billed)
            job.finish_token = self._push(max(seated.ends, at), FINISH, job)
        for job, placement in pending:
            if not placement.is_empty:
                self.scheduler.constrain(job, placement, at)
            self._push(at, SUBMIT, job)

    # ------------------------------------------------------------------ job life

    def _on_submit(self, now: float, token: int, job: SimJob) -> None:
        self.stats.first_submit = min(self.stats.first_submit, now)
        self.active[job.trace.job_id] = job
        self.slurm_order.join(job, now)
        self._enter_pending(job)
        if job.eligible_at > now:
            self._push(job.eligible_at, WAKE, job)
        self._push_next_submit()

    def _enter_pending(self, job: SimJob) -> None:
        job.state = PENDING
        job.pending_view = None
        self.scheduler.enqueue(job, self.now)
        self.pending_count += 1
        self._touch()
        origin = self.timeline.origin
        if not self.cycle_armed:
            self.cycle_armed = True
            self._push(next_tick(origin, self.settings.interval_s, self.now), CYCLE)
        if not self.backfill_armed:
            self.backfill_armed = True
            self._push(next_tick(origin, self.settings.bf_interval_s, self.now), BACKFILL)

    def _start(self, job: SimJob, nodes: list[int], now: float) -> None:
        """The scheduler starts a pending job on `nodes`."""
        trace = job.trace
        if trace.gpu_types:
            self.cluster.check_gpu_types(trace.display_id, trace.gpu_types, nodes)
            self.stats.typed_starts += 1
        self.pending_count -= 1
        if self.freed_rooms:
            self.freed_rooms.settle(job, nodes)
        job.state = RUNNING
        job.pending_total += now - job.pending_since
        job.start = now
        job.nodes = nodes
        job.leaves = self.cluster.leaves_spanned(nodes)
        extra_leaves = job.leaves - job.fewest_leaves
        job.slowdown = 1.0 + self.settings.comm_penalty * extra_leaves if job.heavy and extra_leaves > 0 else 1.0
        if job.heavy and extra_leaves > 0:
            job.all_consolidated = False
        restart = self.settings.restart_cost_s if job.restart_due else 0.0
        run_s = restart + job.work_left * job.slowdown + self.settings.run_overhead_s
        job.finish_token = self._push(now + run_s, FINISH, job)
        job.planned_end = job.limit_end(now)
        job.run_count += 1
        job.pending_view = None
        job.running_base = None
        if job.first_start is None:
            job.first_start = now
        self.scheduler.occupy(job)
        self.views.dirty_nodes.update(nodes)
        # a GPU-second of this run is charged the partition's TRESBillingWeights for the GPU types
        # of its nodes (1 where the site weighs no GPU), as the engine charges a run
        model = self.settings.priority_model
        job.billing = 1.0 if model is None else model.gpu_weight(trace.partition, self.cluster.gpu_types_of(nodes))
        billed = trace.gpus * job.billing
        self.usage.change_rate(trace.account if self.usage_by_account else trace.user, now, billed)
        self.slurm_order.change_rate(job, now, billed)
        self.stats.starts += 1

    def _stop_run(self, job: SimJob, now: float) -> float:
        """End the current run (finished or preempted); returns its length."""
        trace = job.trace
        length = now - job.start
        billed = trace.gpus * job.billing
        job.attained += billed * length
        job.gpu_seconds += trace.gpus * length
        job.last_run_s = length
        self.scheduler.vacate(job)
        self.views.dirty_nodes.update(job.nodes)
        self.usage.change_rate(trace.account if self.usage_by_account else trace.user, now, -billed)
        self.slurm_order.change_rate(job, now, -billed)
        self.timeline.add_busy(job.start, now, trace.gpus)
        job.finish_token = -1
        self._touch()
        return length

    def _finish(self, job: SimJob, now: float) -> None:
        length = self._stop_run(job, now)
        if job.restart_due:  # the restart of a requeued job produced nothing
            job.lost_gpu_s += job.trace.gpus * min(length, self.settings.restart_cost_s)
        job.state = DONE
        del self.active[job.trace.job_id]
        self.finished.add(now, job.trace, job.attained)
        self.stats.last_end = max(self.stats.last_end, now)
        trace = job.trace
        self.on_finish(
            JobResult(
                job_id=trace.job_id,
                display_id=trace.display_id,
                user=trace.user,
                gpus=trace.gpus,
                submit=trace.submit,
                start=job.first_start if job.first_start is not None else now,
                end=now,
                wait_s=job.pending_total,
                jct_s=now - trace.submit,
                duration_s=trace.duration_s,
                level=job.level,
                leaves=job.leaves,
                preemptions=job.preemptions,
                heavy=job.heavy,
                consolidated=job.all_consolidated,
                gpu_seconds=job.gpu_seconds,
                lost_gpu_s=job.lost_gpu_s,
                partition=trace.partition,
                gpu_types=self.cluster.gpu_types_of(job.nodes),
            )
        )

    def _freed_for(self, beneficiary: int | None, decisions: Decisions) -> None:
        """Follow one requeue's room (sim/kernel/rooms.py)."""
        if beneficiary is None:
            return
        self.freed_rooms.freed(beneficiary, decisions)
        job = self.active.get(beneficiary)
        if job is not None:
            job.pending_view = None  # protected from now on

    def _preempt(self, job: SimJob, now: float) -> None:
        """Requeue a running job: it keeps its attained service and its last checkpoint, loses the
        work since, and restarts later (paying the restart cost again)."""
        length = self._stop_run(job, now)
        restart = self.settings.restart_cost_s if job.restart_due else 0.0
        worked = max(0.0, length - restart) / job.slowdown  # the trace's run time done in this run
        interval = self.settings.checkpoint_interval_s
        saved = min(job.work_left, worked if interval <= 0 else math.floor(worked / interval) * interval)
        job.work_left -= saved
        job.lost_gpu_s += job.trace.gpus * (length - saved * job.slowdown)
        job.restart_due = True
        job.preemptions += 1
        job.pending_since = now  # its Switches clock is kept, as Slurm keeps wait4switch_start
        self.stats.preemptions += 1
        # Slurm holds a requeued job: its begin time becomes now + cred_expire + 1 (121 s by default).
        job.eligible_at = max(job.eligible_at, now + self.settings.requeue_hold_s)
        self._enter_pending(job)
        if job.eligible_at > now:
            self._push(job.eligible_at, WAKE, job)

    # ------------------------------------------------------------------ policy cycles

    def _on_cycle(self, now: float, token: int, job: None) -> None:
        """A policy cycle is due. It is evaluated now, as the live engine decides, unless the policy
        lets the replay postpone it (Policy.replay_may_postpone): then only if one of the jobs
        waiting now could start, else when one could."""
        if not self.pending_count:
            self.cycle_armed = False
            return
        self.stats.cycles += 1
        self.stats.most_pending = max(self.stats.most_pending, self.pending_count)
        if self.freed_rooms:
            for job_id in self.freed_rooms.expire():
                job = self.active.get(job_id)
                if job is not None:
                    job.pending_view = None  # no longer protected
        self._check_not_stuck(now)
        self._push(now + self.settings.interval_s, CYCLE)
        self.postponed_cycle = now
        if self.decides_when_due or self._waiting_job_could_start(self.scheduler.fitting_shapes()):
            self._evaluate(now)
        else:
            self.stats.postponed_cycles += 1

    def _check_not_stuck(self, now: float) -> None:
        """Fail clearly when jobs wait on an idle cluster with nothing left to happen but cycles
        (constraints that no node satisfies, kept by the policy), instead of cycling forever."""
        idle = len(self.active) == self.pending_count and all(kind >= CYCLE for _, _, kind, _, _ in self.events)
        if not idle:
            self.idle_since = None
            return
        if self.idle_since is None:
            self.idle_since = now
        elif now - self.idle_since > STUCK_AFTER_S:
            stuck = [job.trace.display_id for job in self.scheduler.pending_in_order()][:3]
            raise SimulationStuck(
                f"{self.pending_count} job(s) cannot start on an idle cluster for {STUCK_AFTER_S / 86400:g} "
                f"simulated days (e.g. job {', '.join(stuck)}): the constraints the policy keeps on them "
                "fit no node"
            )

    def _waiting_job_could_start(self, fitting: set[Shape]) -> bool:
        """Whether an eligible job already waiting when the postponed cycle fell due fits now."""
        if not fitting:
            return False
        due, now = self.postponed_cycle, self.now
        for job in self.scheduler.pending_in_order():
            if job.shape in fitting and job.trace.submit <= due and job.eligible_at <= now:  # type: ignore[operator]
                return True
        return False

    def _evaluate(self, now: float, then: Callable[[], None] | None = None) -> None:
        """A policy cycle on a snapshot of this instant: the policy decides now, or the simulator
        stops until `decide` is called."""
        self.postponed_cycle = None
        snapshot, views = self._snapshot(now)
        self.stats.decide_calls += 1
        self.awaiting = Awaiting(snapshot, views, then)
        if self.decides:
            self.decide(self.policy.decide(snapshot, self.params, self.rng))

    def decide(self, decisions: Decisions, written: Mapping[int, int] | None = None) -> None:
        """Apply the decisions for the awaited snapshot and carry on where the cycle came in.

        `written`: the value of the priority strategy's field the engine wrote to each job (the
        live engine on the simulated backend); without it the simulator works out what the engine
        would write for these decisions (sim/kernel/priority.py: engine_writes)."""
        awaiting = self.awaiting
        if awaiting is None:
            raise DikeError("no policy cycle awaits decisions")
        self.awaiting = None
        latency = self.settings.cycle_latency_s
        if latency > 0 and awaiting.then is None:
            # The live engine writes after its reads and its decision: Slurm sees the cycle's
            # decisions this long after the snapshot (a postponed cycle, evaluated inside a pass,
            # stands for one that ran earlier, so its decisions are in place already).
            self.landing = (decisions, awaiting.views, awaiting.snapshot.time, written)
            self._push(awaiting.snapshot.time + latency, LAND)
            return
        self._apply(decisions, awaiting.views, awaiting.snapshot.time, written)
        self._touch()
        if awaiting.then is not None:
            awaiting.then()

    def _on_land(self, now: float, token: int, job: None) -> None:
        """A cycle's decisions reach Slurm."""
        assert self.landing is not None
        decisions, views, decided_at, written = self.landing
        self.landing = None
        self._apply(decisions, views, decided_at, written)
        self._touch()

    def _snapshot(self, at: float) -> tuple[Snapshot, dict[int, Job]]:
        views = self.views.jobs(self.active, at, self.freed_rooms.pinned)
        nodes = self.views.nodes()
        self.finished.forget(at)
        snapshot = Snapshot(
            time=at,
            jobs=tuple(views.values()),
            nodes=nodes,
            topology=self.cluster.topology,
            user_usage_gpu_s=self.usage.snapshot(at),
            user_shares=self.shares,
            completed_service_gpu_s=self.finished.service.view(),
            site_priority=self.settings.priority_model,
            service_prior=self.finished.prior.view() if self.finished.prior is not None else None,
        )
        return snapshot, views

    def _apply(self, decisions: Decisions, views: Mapping[int, Job], decided_at: float,
               written: Mapping[int, int] | None) -> None:
        """A cycle's decisions, made on the views of `decided_at`, take effect now."""
        active, now = self.active, self.now
        for decision in decisions.priorities:
            job = active.get(decision.job_id)
            if job is None:
                continue
            job.level = decision.level
            if decision.promoted:
                view = views.get(decision.job_id)
                attained = view.attained_gpu_s if view is not None else job.attained
                job.promoted_at = service_forgiven(job.promoted_at, decision.promoted, attained)
                job.pending_view = None
        held: set[int] = set()  # jobs whose constraints the engine does not write this cycle
        if written is None:
            landing, held, landed, held_back = cycle_writes(
                decisions, self.active, self.engine_placed, self.declared_ceiling, self.settings, views, decided_at,
                self.requeue_limits.preempts)
            self.stats.engine_writes += landed
            self.stats.writes_held += held_back
            for write in landing:
                write.land()
        else:
            for job_id, job in active.items():
                value = written.get(job_id)
                job.written, job.owned = (value, True) if value is not None else (0, False)
        self.slurm_order.recalculate(now)
        self.scheduler.set_order([job for job in active.values() if job.state == PENDING], now)
        if decisions.requeues:
            running = {job_id: view for job_id, view in views.items() if view.state is JobState.RUNNING}
            decisions, refused = guard_requeues(decisions, running, decided_at, self.requeue_limits)
            self.stats.requeues_refused += len(refused)
        self._apply_placements(decisions, held)
        for requeue in decisions.requeues:
            job = active.get(requeue.job_id)
            if job is not None and job.state == RUNNING:
                self._preempt(job, now)
                self._freed_for(requeue.for_job, decisions)
        self.timeline.add_levels(now, Counter(map(attrgetter("level"), decisions.priorities)))

    def _apply_placements(self, decisions: Decisions, held: set[int]) -> None:
        """The cycle's placements are the wanted constraints: one not re-asserted is removed.
        `held`: jobs whose constraint the engine does not write this cycle (they keep theirs)."""
        wanted = policy_placements(decisions)
        active = self.active
        for job_id, placement in wanted.items():
            if job_id in held:
                continue
            job = active.get(job_id)
            if job is not None and job.state == PENDING:
                self._set_placement(job, placement)
                if placement.is_empty:
                    self.engine_placed.discard(job_id)
                else:
                    self.engine_placed.add(job_id)
        for job_id in [j for j in self.engine_placed if j not in wanted]:
            job = active.get(job_id)
            if job is None:
                self.engine_placed.discard(job_id)
            elif job.state == PENDING and job_id not in held:
                self._set_placement(job, NO_PLACEMENT)
                self.engine_placed.discard(job_id)

    def _set_placement(self, job: SimJob, placement: Placement) -> None:
        if placement == job.placement:
            return
        job.pending_view = None
        job.running_base = None
        self.scheduler.constrain(job, placement, self.now)
