"""The discrete-event replay: one trace, one policy, Slurm-like scheduling of a simulated cluster.

A simulator you step, in SimPy's manner: `step()` handles the next event of one heap, `run(until)`
steps to a time or to the end. Events are ordered by (time, round, kind, sequence). At one
instant they are handled in rounds: those due when the instant begins, then those that round
added for the same instant, and so on; within a round run ends come first, then submissions,
then wake-ups (a job becoming eligible, a Switches wait running out), then a cycle's decisions
reaching Slurm, then the policy cycle and the backfill tick. When no event of the instant is
left, Slurm's passes follow as one more round (sim/scheduler.py): the main pass if anything
changed, the backfill pass if its tick fell and something changed since its last pass. See
docs/replay.md for the semantics and the simplifications.

Over 500 lines for a reason: the loop, the job lifecycle, the policy cycle and the snapshot views
share the jobs' mutable state (the views are cached per job and invalidated by the lifecycle);
split further, each part would reach into the others' fields.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from operator import attrgetter

from dike_slurm.decisions import ClearPlacement, Decisions, SetPlacement, service_forgiven
from dike_slurm.errors import DikeError
from dike_slurm.freed_rooms import WASTED_AFTER_CYCLES
from dike_slurm.head_window import policy_window
from dike_slurm.model import NO_PLACEMENT, Job, JobState, Node, Placement, Snapshot, may_use_gpus
from dike_slurm.policies.base import Policy, PolicyParams
from dike_slurm.requeue_guard import guard_requeues, requeue_limits
from dike_slurm.service_prior import FinishedJob, PriorLearner
from dike_slurm.sim.cluster import SimCluster
from dike_slurm.sim.history import SortedBlocks
from dike_slurm.sim.priority import SimWrite, SlurmOrder, engine_writes, within_budget
from dike_slurm.sim.job import DONE, INFINITY, PENDING, RUNNING, SimJob
from dike_slurm.sim.records import JobResult, SimSettings, SimStats, Timeline
from dike_slurm.sim.scheduler import Shape, SlurmScheduler, next_tick
from dike_slurm.sim.trace import TraceJob
from dike_slurm.sim.usage import DecayedUsage

# Event kinds, in the order they are handled within a round; the passes make a round of their own.
FINISH, SUBMIT, WAKE, LAND, CYCLE, BACKFILL, MAIN_PASS, BACKFILL_PASS = range(8)
STUCK_AFTER_S = 7 * 86400.0  # jobs waiting this long on an idle cluster: the replay stops


class SimulationStuck(DikeError):
    """The replay cannot progress: jobs wait forever on an idle cluster."""


class WrongGpuType(RuntimeError):
    """A bug: the simulator started a job on a node without any GPU type the job asked for."""


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
        self.may_requeue = policy.requeue_min_run_s(params) is not None
        self.requeue_limits = requeue_limits(policy, params, settings.max_requeues_per_cycle)
        self.events: list[tuple[float, int, int, int, SimJob | None]] = []
        self.sequence = 0
        self.now = -INFINITY
        self.round = 0  # of the event being handled
        self.instant_open = False  # events of this instant were handled, its passes are not scheduled yet
        self.awaiting: Awaiting | None = None
        # A cycle's decisions on their way to Slurm: (decisions, the snapshot's views and time, written)
        self.landing: tuple[Decisions, Mapping[int, Job], float, Mapping[int, int] | None] | None = None
        self.active: dict[int, SimJob] = {}  # submit order
        self.engine_placed: set[int] = set()  # jobs carrying a constraint the policy asked for
        # beneficiary -> (the nodes freed for it, victims, the cycle by which it must have started)
        self.freed_rooms: dict[int, tuple[frozenset[str], int, int]] = {}
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
        # Finished jobs' GPU service for the snapshot, kept only for a policy that reads it.
        self.keeps_history = policy.reads_completed_service(params)
        self.history: deque[tuple[float, float]] = deque()  # (end, GPU service) in end order
        # The service prior, learned from the same finished jobs, for a policy that reads it.
        self.prior = PriorLearner() if policy.reads_service_prior(params) else None
        self.prior_history: deque[FinishedJob] = deque()  # in end order
        self.history_sorted = SortedBlocks()
        self.node_views: list[Node] = list(cluster.nodes)
        self.dirty_nodes: set[int] = set()
        self.shares = dict(settings.user_shares)
        self._push_next_submit()

    # ------------------------------------------------------------------ the loop

    def run(self, until: float | None = None) -> SimStats:
        """Step until simulated time `until` (events at `until` are left) or to the end; stop early
        when a policy cycle awaits decisions (`decides=False`). Returns the counters."""
        limit = INFINITY if until is None else until
        while self.awaiting is None and self.peek() < limit:
            self.step()
        return self.stats

    def peek(self) -> float:
        """The time of the next step (infinity when nothing is left)."""
        if self.instant_open:
            return self.now
        return self.events[0][0] if self.events else INFINITY

    def step(self) -> None:
        """Handle the next event; when the current instant has no event left, schedule its passes first."""
        if self.awaiting is not None:
            raise DikeError("a policy cycle awaits its decisions (Simulator.decide)")
        events = self.events
        if self.instant_open and not (events and events[0][0] == self.now):
            self._end_instant()
            if not events:
                return
        if not events:
            raise EmptySchedule("the simulation has no event left")
        now, self.round, kind, token, job = heapq.heappop(events)
        self.now = now
        if kind >= MAIN_PASS:
            if kind == MAIN_PASS:
                if now != self.main_pass_due:
                    return  # superseded by an earlier pass
                self.main_pass_due = None
                self.last_main_pass = now
                self.changed = False  # the pass sees everything so far
                self._pass(self.scheduler.main_pass, now)
            elif self.backfill_changed:
                self.backfill_changed = False
                self._pass(self.scheduler.backfill_pass, now)
            return
        self.instant_open = True
        self.stats.events += 1
        if kind == FINISH:
            if job is not None and job.finish_token == token:
                self._finish(job, now)
        elif kind == SUBMIT:
            self._submit(job, now)  # type: ignore[arg-type]
        elif kind == WAKE:
            if job is not None and job.state == PENDING:
                self.scheduler.count_eligible(job)  # it became eligible
            self._touch()
        elif kind == LAND:
            self._land()
        elif kind == CYCLE:
            self._cycle(now)
        else:
            self._backfill_tick(now)

    def _end_instant(self) -> None:
        """The instant's events are handled: Slurm's passes follow, as the instant's last round."""
        self.instant_open = False
        if self.changed:
            self.changed = False
            due = self._main_pass_time(self.now)
            if self.main_pass_due is None or due < self.main_pass_due:
                self.main_pass_due = due
                self._push(due, MAIN_PASS)
        if self.backfill_due:
            self.backfill_due = False
            self._push(self.now, BACKFILL_PASS)

    def _main_pass_time(self, now: float) -> float:
        """When Slurm's main scheduler runs after a change at `now` (22.05 controller.c): a change
        asks for a pass, which runs once `batch_sched_delay` has passed since the last pass, or at
        the periodic full pass (every `sched_interval`) if that comes first. With a delay of 0 (the
        SimSettings default) the pass runs at once."""
        delay = self.settings.batch_sched_delay_s
        if delay <= 0:
            return now
        period = self.settings.sched_interval_s
        origin = self.timeline.origin
        previous_full = origin + math.floor((now - origin) / period) * period
        if previous_full == now:
            return now
        last = max(self.last_main_pass, previous_full)
        return min(max(now, last + delay), previous_full + period)

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

    def _backfill_tick(self, now: float) -> None:
        if not self.pending_count:
            self.backfill_armed = False
            return
        self.backfill_due = True
        self._push(now + self.settings.bf_interval_s, BACKFILL, None)

    def _push(self, time: float, kind: int, job: SimJob | None = None) -> int:
        """Schedule an event; one for the current instant goes to the round after this one."""
        self.sequence += 1
        heapq.heappush(self.events, (time, self.round + 1 if time == self.now else 0, kind, self.sequence, job))
        return self.sequence

    def _wake(self, time: float) -> None:
        """A scheduling pass is due at `time` (a Switches wait runs out)."""
        self._push(time, WAKE)

    def _push_next_submit(self) -> None:
        for trace_job in self.trace:
            self._push(trace_job.submit, SUBMIT, SimJob.from_trace(trace_job, self.settings, self.cluster))
            return

    # ------------------------------------------------------------------ job life

    def _submit(self, job: SimJob, now: float) -> None:
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

    def _check_gpu_types(self, job: SimJob, nodes: list[int]) -> None:
        """The invariant, at every start of a typed job: no job runs on a GPU type it did not ask for."""
        for node in nodes:
            template = self.cluster.nodes[node]
            if not may_use_gpus(job.trace.gpu_types, template.gpu_types):
                raise WrongGpuType(
                    f"job {job.trace.display_id} asked for GPU types {'|'.join(job.trace.gpu_types)} and was "
                    f"started on {template.name} ({'|'.join(template.gpu_types) or 'untyped'})")
        self.stats.typed_starts += 1

    def _start(self, job: SimJob, nodes: list[int], now: float) -> None:
        """The scheduler starts a pending job on `nodes`."""
        trace = job.trace
        if trace.gpu_types:
            self._check_gpu_types(job, nodes)
        self.pending_count -= 1
        if self.freed_rooms:
            self._settle_freed_room(job, nodes)
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
        self.dirty_nodes.update(nodes)
        job.billing = self._billing(job, nodes)
        billed = trace.gpus * job.billing
        self.usage.change_rate(trace.account if self.usage_by_account else trace.user, now, billed)
        self.slurm_order.change_rate(job, now, billed)
        self.stats.starts += 1

    def _billing(self, job: SimJob, nodes: list[int]) -> float:
        """What a GPU-second of this run is charged: the partition's TRESBillingWeights for the
        GPU types of its nodes (1 where the site weighs no GPU), as the engine charges a run."""
        model = self.settings.priority_model
        return model.gpu_weight(job.trace.partition, self._gpu_types(nodes)) if model is not None else 1.0

    def _gpu_types(self, nodes: list[int]) -> tuple[str, ...]:
        """The GPU types of a run's nodes, in order, once each (what its AllocTRES shows)."""
        types: list[str] = []
        for node in nodes:
            for gpu_type in self.cluster.nodes[node].gpu_types:
                if gpu_type not in types:
                    types.append(gpu_type)
        return tuple(types)

    def _stop_run(self, job: SimJob, now: float) -> float:
        """End the current run (finished or preempted); returns its length."""
        trace = job.trace
        length = now - job.start
        billed = trace.gpus * job.billing
        job.attained += billed * length
        job.gpu_seconds += trace.gpus * length
        job.last_run_s = length
        self.scheduler.vacate(job)
        self.dirty_nodes.update(job.nodes)
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
        self._remember_service(job.attained)
        if self.prior is not None:
            trace = job.trace
            finished = FinishedJob(trace.user, trace.name, trace.gpus, job.attained / trace.gpus if trace.gpus else 0.0, now)
            self.prior.add(finished)
            self.prior_history.append(finished)
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
                gpu_types=self._gpu_types(job.nodes),
            )
        )

    def _freed_for(self, beneficiary: int | None, decisions: Decisions) -> None:
        """Follow one requeue's room: landed if the job it was freed for starts on it, wasted if that
        job starts elsewhere or is still waiting `WASTED_AFTER_CYCLES` cycles after the victims' end
        (here the requeue itself; the live engine first sees it at its next cycle, hence the +1)."""
        if beneficiary is None:
            return
        pin = decisions.placement_of(beneficiary)
        nodes = frozenset(pin.placement.require_nodes) if isinstance(pin, SetPlacement) else frozenset()
        _, victims, _ = self.freed_rooms.get(beneficiary, (None, 0, 0))
        self.freed_rooms[beneficiary] = (nodes, victims + 1, self.stats.cycles + 1 + WASTED_AFTER_CYCLES)
        job = self.active.get(beneficiary)
        if job is not None:
            job.pending_view = None  # protected from now on

    def _room_is_pinned(self, job: SimJob) -> bool:
        """A preemption freed nodes for the job, it has not started, and it is pinned to them."""
        room = self.freed_rooms.get(job.trace.job_id)
        return room is not None and room[0] == frozenset(job.placement.require_nodes)

    def _settle_freed_room(self, job: SimJob, nodes: list[int]) -> None:
        room = self.freed_rooms.pop(job.trace.job_id, None)
        if room is None:
            return
        names = {self.cluster.names[n] for n in nodes}
        if room[0] and names <= room[0]:
            self.stats.landed_preemptions += room[1]
        else:
            self.stats.wasted_preemptions += room[1]

    def _expire_freed_rooms(self) -> None:
        cycles = self.stats.cycles
        for job_id in [j for j, (_, _, due) in self.freed_rooms.items() if due <= cycles]:
            self.stats.wasted_preemptions += self.freed_rooms.pop(job_id)[1]
            job = self.active.get(job_id)
            if job is not None:
                job.pending_view = None  # no longer protected

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

    def _remember_service(self, gpu_seconds: float) -> None:
        if not self.keeps_history:
            return
        self.history.append((self.now, gpu_seconds))
        self.history_sorted.add(gpu_seconds)

    def _forget_old_history(self, now: float) -> None:
        """Jobs that ended more than the history window ago leave the snapshot's history."""
        horizon = now - self.settings.history_window_s
        while self.history and self.history[0][0] < horizon:
            _, oldest = self.history.popleft()
            self.history_sorted.remove(oldest)
        if self.prior is not None:
            while self.prior_history and self.prior_history[0].end < horizon:
                self.prior.remove(self.prior_history.popleft())

    # ------------------------------------------------------------------ policy cycles

    def _cycle(self, now: float) -> None:
        """A policy cycle is due. It is evaluated now if one of the jobs waiting now could start
        (or the policy may requeue); otherwise it is postponed until one could, as until then its
        decisions would change nothing the scheduler does for those jobs."""
        if not self.pending_count:
            self.cycle_armed = False
            return
        self.stats.cycles += 1
        self.stats.most_pending = max(self.stats.most_pending, self.pending_count)
        if self.freed_rooms:
            self._expire_freed_rooms()
        self._check_not_stuck(now)
        self._push(now + self.settings.interval_s, CYCLE)
        self.postponed_cycle = now
        if self.may_requeue or self._waiting_job_could_start(self.scheduler.fitting_shapes()):
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
        would write for these decisions (sim/priority.py: engine_writes)."""
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

    def _land(self) -> None:
        """A cycle's decisions reach Slurm."""
        assert self.landing is not None
        decisions, views, decided_at, written = self.landing
        self.landing = None
        self._apply(decisions, views, decided_at, written)
        self._touch()

    def _snapshot(self, at: float) -> tuple[Snapshot, dict[int, Job]]:
        views: dict[int, Job] = {}
        new, set_dict = object.__new__, object.__setattr__
        for job_id, job in self.active.items():
            if job.state == PENDING:
                views[job_id] = job.pending_view or self._pending_view(job)
                continue
            # A running job: a copy of its frozen per-run view with the two fields that move
            # with time (dataclasses.replace re-runs __init__ over every field, which would
            # dominate the cycle at scale).
            fields = (job.running_base or self._running_base(job)).__dict__.copy()
            reported = math.floor(job.start)  # Slurm reports StartTime in whole seconds
            elapsed = at - reported if at > reported else 0.0
            fields["attained_gpu_s"] = job.attained + job.trace.gpus * job.billing * elapsed
            fields["last_run_s"] = elapsed
            view = new(Job)
            set_dict(view, "__dict__", fields)
            views[job_id] = view
        for node in self.dirty_nodes:
            self.node_views[node] = self._node_view(node)
        self.dirty_nodes.clear()
        self._forget_old_history(at)
        snapshot = Snapshot(
            time=at,
            jobs=tuple(views.values()),
            nodes=tuple(self.node_views),
            topology=self.cluster.topology,
            user_usage_gpu_s=self.usage.snapshot(at),
            user_shares=self.shares,
            completed_service_gpu_s=self.history_sorted.view(),
            site_priority=self.settings.priority_model,
            service_prior=self.prior.view() if self.prior is not None else None,
        )
        return snapshot, views

    def _job_fields(self, job: SimJob) -> dict:
        trace = job.trace
        return dict(
            job_id=trace.job_id, user=trace.user, submit_time=trace.submit, gpus=trace.gpus,
            num_nodes=trace.num_nodes, cpus=trace.cpus, account=trace.account, partition=trace.partition,
            qos=trace.qos, name=trace.name, comment=trace.comment, array_job_id=trace.array_job_id,
            array_task_id=trace.array_task_id, eligible_time=job.eligible_at, pending_since=job.pending_since,
            time_limit_s=trace.time_limit_s, attained_at_promotion_gpu_s=job.promoted_at,
            run_count=job.run_count, preemptions=job.preemptions,
            requeueable=self.settings.requeueable and job.preemptible, gpu_types=trace.gpu_types,
            # The oracle's "true duration": the work left when this run (or wait) began.
            true_duration_s=job.work_left + (self.settings.restart_cost_s if job.restart_due else 0.0),
        )

    def _pending_view(self, job: SimJob) -> Job:
        view = Job(
            state=JobState.PENDING, attained_gpu_s=job.attained, last_run_s=job.last_run_s,
            placement=job.placement,
            pinned_for_preemption=self._room_is_pinned(job),
            **self._job_fields(job),
        )
        job.pending_view = view
        return view

    def _running_base(self, job: SimJob) -> Job:
        base = Job(
            state=JobState.RUNNING, start_time=math.floor(job.start), attained_gpu_s=job.attained, placement=job.placement,
            nodes=tuple(self.cluster.names[n] for n in job.nodes), **self._job_fields(job),
        )
        job.running_base = base
        return base

    def _node_view(self, node: int) -> Node:
        cluster = self.cluster
        template = cluster.nodes[node]
        total = int(cluster.gpus[node])
        allocated = total - int(cluster.free_gpus[node])
        if allocated <= 0 and cluster.free_cpus[node] == cluster.cpus[node]:
            state = "IDLE"
        elif allocated >= total and total > 0:
            state = "ALLOCATED"
        else:
            state = "MIXED"
        return Node(template.name, total, allocated, template.cpus, state, template.features, template.partitions,
                    template.gpu_types)

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
            landing, held = self._engine_writes(decisions, views, decided_at)
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

    def _engine_writes(self, decisions: Decisions, views: Mapping[int, Job],
                       decided_at: float) -> tuple[list[SimWrite], set[int]]:
        """The priority writes the live engine would land for decisions made on the views of
        `decided_at` (inside the head window, within the guardrails' cap and the write budget, first
        jobs first), and the jobs whose constraint it would not write this cycle."""
        settings = self.settings
        ranked = decisions.ranked()
        rank = {decision.job_id: index for index, decision in enumerate(ranked)}
        latest = {decision.job_id: decision for decision in decisions.priorities}
        inside = policy_window(ranked, latest, views, decided_at, settings.head_window)
        writes = engine_writes(decisions, self.active, self.declared_ceiling, settings, views, inside, ranked, rank)
        unranked, held = len(rank), set()
        for job_id, placement in self._wanted_placements(decisions).items():
            job = self.active.get(job_id)
            if job is None or job.state != PENDING:
                continue
            if inside is not None and job_id not in inside:
                held.add(job_id)  # beyond the window: its constraint waits until it comes near the head
            elif placement != job.placement:
                writes.append(SimWrite(rank.get(job_id, unranked), job_id, "placement", True, _no_op))
        kept = within_budget(writes, settings.writes_per_cycle)
        landed = sum(1 for w in kept if w.counted)
        self.stats.engine_writes += landed
        self.stats.writes_held += sum(1 for w in writes if w.counted) - landed
        held |= {w.job_id for w in writes if w.kind == "placement"} - {w.job_id for w in kept if w.kind == "placement"}
        return [w for w in kept if w.kind == "priority"], held

    def _wanted_placements(self, decisions: Decisions) -> dict[int, Placement]:
        """The constraint each job should carry after the cycle: the policy's, none where it asks to
        clear one, none for a job the engine constrained that the cycle does not name again."""
        wanted = _policy_placements(decisions)
        for job_id in self.engine_placed:
            wanted.setdefault(job_id, NO_PLACEMENT)
        return wanted

    def _apply_placements(self, decisions: Decisions, held: set[int]) -> None:
        """The cycle's placements are the wanted constraints: one not re-asserted is removed.
        `held`: jobs whose constraint the engine does not write this cycle (they keep theirs)."""
        wanted = _policy_placements(decisions)
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


def _no_op() -> None:
    """A constraint write lands in _apply_placements (after the queue order, as it always did)."""


def _policy_placements(decisions: Decisions) -> dict[int, Placement]:
    """The constraint the cycle's decisions ask of each job they name (none to clear one)."""
    wanted: dict[int, Placement] = {}
    for decision in decisions.placements:
        if isinstance(decision, SetPlacement):
            wanted[decision.job_id] = decision.placement
        elif isinstance(decision, ClearPlacement):
            wanted[decision.job_id] = NO_PLACEMENT
    return wanted
