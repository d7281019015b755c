"""The discrete-event replay: one trace, one policy, Slurm-like scheduling of a simulated cluster.

Events sit in a heap ordered by (time, kind, sequence): at one instant run ends come first, then
submissions, then wake-ups (a job becoming eligible, a Switches wait running out), then the
policy cycle and the backfill tick. After the instant, Slurm's main scheduler runs if anything
changed, then its backfill scheduler if the tick fell. See docs/replay.md for the semantics and
the simplifications.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from dike_slurm.decisions import ClearPlacement, Decisions, SetPlacement
from dike_slurm.errors import DikeError
from dike_slurm.model import NO_PLACEMENT, Job, JobState, Node, Placement, Snapshot
from dike_slurm.policies.base import Policy, PolicyParams
from dike_slurm.policies.common import CommRule, is_comm_heavy
from dike_slurm.requeue_guard import guard_requeues, requeue_limits
from dike_slurm.sim.cluster import SimCluster
from dike_slurm.sim.history import SortedBlocks
from dike_slurm.sim.trace import TraceJob
from dike_slurm.sim.usage import DecayedUsage

PENDING, RUNNING, DONE = 0, 1, 2
# Event kinds, in the order they are handled at one instant.
FINISH, SUBMIT, WAKE, CYCLE, BACKFILL = 0, 1, 2, 3, 4
INFINITY = math.inf
STUCK_AFTER_S = 7 * 86400.0  # jobs waiting this long on an idle cluster: the replay stops


class SimulationStuck(DikeError):
    """The replay cannot progress: jobs wait forever on an idle cluster."""


# GPU slot table values: a slot of a job without time limit, and a GPU the node does not have.
SLOT_UNLIMITED = 1e300
SLOT_ABSENT = INFINITY


@dataclass(frozen=True)
class SimSettings:
    """Everything the simulator needs besides the trace, the cluster and the policy."""

    interval_s: float = 60.0
    comm_penalty: float = 1.0
    restart_cost_s: float = 120.0  # a requeued job's restart (reload, warm-up) before it progresses
    checkpoint_interval_s: float = 1800.0  # jobs checkpoint every this much work; 0: nothing is lost
    preemptible: float = 1.0  # share of jobs that may be preempted, drawn per job from the seed
    max_requeues_per_cycle: int = 2  # engine.max_requeues_per_cycle: the live engine's rate limit
    seed: int = 0
    usage_half_life_s: float = 168 * 3600.0
    user_shares: Mapping[str, float] = field(default_factory=dict)
    history_window_s: float = 30 * 86400.0  # finished jobs whose GPU service the snapshot carries
    max_switch_wait_s: int = 300  # SchedulerParameters=max_switch_wait (Slurm's default 300)
    bf_max_job_test: int = 500  # SchedulerParameters=bf_max_job_test
    bf_window_s: float = 86400.0  # SchedulerParameters=bf_window (1440 minutes)
    bf_interval_s: float = 30.0  # SchedulerParameters=bf_interval
    backfill_reservations: int = 16  # blocked jobs planned per pass (Slurm plans every tested job)
    requeueable: bool = True  # slurm.conf JobRequeue (default 1: batch jobs may be requeued)
    comm_gpus: int = 8  # communication-heavy threshold (the Dike policy's comm_gpus)
    comm_rules: tuple[CommRule, ...] = ()


@dataclass(frozen=True, slots=True)
class JobResult:
    """One finished job as the metrics and jobs-NAME.csv see it."""

    job_id: int
    display_id: str
    user: str
    gpus: int
    submit: float
    start: float  # first start
    end: float
    wait_s: float  # time pending, every pending period summed
    jct_s: float
    duration_s: float  # trace run time, consolidated and alone
    level: int  # last level the policy gave the job
    leaves: int  # leaf switches spanned by the last run
    preemptions: int
    heavy: bool
    consolidated: bool  # every run within the fewest leaves that can hold the job
    gpu_seconds: float  # GPUs x wall time of every run (restart and slow-down included)
    lost_gpu_s: float = 0.0  # GPU-seconds of runs whose work was lost to preemption, restarts included


@dataclass
class Timeline:
    """GPU use and queue levels over simulated time, in fixed-width bins."""

    origin: float
    width: float
    busy_gpu_s: list[float] = field(default_factory=list)
    level_sums: list[Counter] = field(default_factory=list)  # per bin: level -> sum of job counts
    level_samples: list[int] = field(default_factory=list)  # per bin: cycles sampled

    def _grow(self, index: int) -> None:
        while len(self.busy_gpu_s) <= index:
            self.busy_gpu_s.append(0.0)
            self.level_sums.append(Counter())
            self.level_samples.append(0)

    def add_busy(self, start: float, end: float, gpus: int) -> None:
        if end <= start:
            return
        first = max(0, int((start - self.origin) // self.width))
        last = max(0, int((end - self.origin) // self.width))
        self._grow(last)
        for index in range(first, last + 1):
            low = self.origin + index * self.width
            overlap = min(end, low + self.width) - max(start, low)
            if overlap > 0:
                self.busy_gpu_s[index] += overlap * gpus

    def add_levels(self, time: float, counts: Mapping[int, int]) -> None:
        index = max(0, int((time - self.origin) // self.width))
        self._grow(index)
        self.level_sums[index].update(counts)
        self.level_samples[index] += 1


@dataclass
class SimStats:
    """Counters of one replay (deterministic: no wall-clock time in here)."""

    events: int = 0
    passes: int = 0  # main scheduler passes (on events)
    backfill_passes: int = 0  # backfill passes (every bf_interval when something changed)
    cycles: int = 0  # policy cycles due (every interval while jobs wait)
    decide_calls: int = 0
    postponed_cycles: int = 0  # cycles at which no waiting job could start (evaluated later)
    starts: int = 0
    preemptions: int = 0
    requeues_refused: int = 0  # requeues the guard refused (dike_slurm.requeue_guard)
    reservations: int = 0
    first_submit: float = INFINITY
    last_end: float = -INFINITY


class SimJob:
    """A job's mutable state during the replay."""

    __slots__ = (
        "trace", "heavy", "state", "eligible_at", "pending_since", "attained", "promoted_at",
        "run_count", "preemptions", "last_run_s", "work_left", "restart_due", "start", "nodes",
        "leaves", "slowdown", "planned_end", "finish_token", "score", "level", "order_epoch",
        "placement", "allowed", "switch_wait_start", "pending_view",
        "running_base", "first_start", "pending_total", "all_consolidated", "gpu_seconds",
        "shape", "fewest_leaves", "preemptible", "lost_gpu_s",
    )

    def __init__(self, trace: TraceJob, heavy: bool, fewest_leaves: int, preemptible: bool) -> None:
        self.trace = trace
        self.preemptible = preemptible
        self.lost_gpu_s = 0.0
        self.heavy = heavy
        self.fewest_leaves = fewest_leaves
        self.state = PENDING
        self.eligible_at = trace.submit + trace.eligible_delay_s
        self.pending_since = trace.submit
        self.attained = 0.0  # GPU-seconds of finished runs
        self.promoted_at = 0.0
        self.run_count = 0
        self.preemptions = 0
        self.last_run_s = 0.0
        self.work_left = trace.duration_s
        self.restart_due = False
        self.start = 0.0
        self.nodes: list[int] = []
        self.leaves = 0
        self.slowdown = 1.0
        self.planned_end = INFINITY
        self.finish_token = -1
        self.score: float | None = None
        self.level = 0
        self.order_epoch = -1
        self.placement: Placement = NO_PLACEMENT
        self.allowed: np.ndarray | None = None
        self.switch_wait_start: float | None = None
        self.pending_view: Job | None = None
        self.running_base: Job | None = None
        self.first_start: float | None = None
        self.pending_total = 0.0
        self.all_consolidated = True
        self.gpu_seconds = 0.0
        self.shape = (trace.partition, trace.gpus_per_node, trace.cpus_per_node, trace.num_nodes)

    def limit_end(self, start: float) -> float:
        """When a run starting at `start` reaches the time limit (infinity: unlimited)."""
        limit = self.trace.time_limit_s
        return start + limit if limit is not None else INFINITY


class _Reservations:
    """The GPUs one scheduling pass has promised to blocked higher-priority jobs."""

    def __init__(self, node_count: int) -> None:
        self.reserved = np.zeros(node_count, dtype=np.int64)  # GPUs promised on each node
        self.by_node: dict[int, list[list[float]]] = {}  # node -> [[start T, GPUs to spare at T]]
        self.count = 0

    def admits(self, candidates: np.ndarray, gpus_per_node: int, end: float) -> np.ndarray:
        """Candidates whose use until `end` leaves every reservation starting before it intact."""
        for node, entries in self.by_node.items():
            if candidates[node]:
                for start, spare in entries:
                    if start < end and spare < gpus_per_node:
                        candidates[node] = False
                        break
        return candidates

    def consume(self, nodes: Iterable[int], gpus_per_node: int, end: float) -> None:
        for node in nodes:
            for entry in self.by_node.get(node, ()):
                if entry[0] < end:
                    entry[1] -= gpus_per_node


class Simulator:
    """Replays one trace under one policy on a simulated cluster."""

    def __init__(
        self,
        trace: Iterable[TraceJob],
        cluster: SimCluster,
        policy: Policy,
        params: PolicyParams,
        settings: SimSettings,
        timeline: Timeline,
        on_finish: Callable[[JobResult], None],
    ) -> None:
        self.trace: Iterator[TraceJob] = iter(trace)
        self.cluster = cluster
        self.policy = policy
        self.params = params
        self.settings = settings
        self.timeline = timeline
        self.on_finish = on_finish
        self.rng = random.Random(settings.seed)
        self.stats = SimStats()
        self.may_requeue = policy.requeue_min_run_s(params) is not None
        self.requeue_limits = requeue_limits(policy, params, settings.max_requeues_per_cycle)
        self.single_leaf_possible = bool(cluster.topology.switches) and cluster.leaf_count < len(cluster)
        self.events: list[tuple[float, int, int, SimJob | None]] = []
        self.sequence = 0
        self.now = -INFINITY
        self.active: dict[int, SimJob] = {}  # submit order
        self.engine_placed: set[int] = set()  # jobs carrying a constraint the policy asked for
        self.pending_count = 0
        self.pending_shapes: Counter[tuple[str, int, int, int]] = Counter()  # eligible pending jobs
        self.order: list[SimJob] = []  # scored pending jobs, best first (as of the last cycle)
        self.tail: list[SimJob] = []  # pending jobs not scored yet, in arrival order
        self.order_epoch = 0
        self.cycle_armed = False
        self.backfill_armed = False
        self.backfill_due = False
        self.postponed_cycle: float | None = None  # due time of a cycle waiting to be evaluated
        self.idle_since: float | None = None  # jobs wait on an idle cluster since then
        self.changed = False  # something happened since the last main pass
        self.backfill_changed = False  # ... since the last backfill pass
        self.usage = DecayedUsage(settings.usage_half_life_s)
        # Usage is kept per owner as the live engine keeps it: by account when the policy's
        # fairness is by account.
        self.usage_by_account = policy.usage_owner(params) == "account"
        # Finished jobs' GPU service for the snapshot, kept only for a policy that reads it.
        self.keeps_history = policy.reads_completed_service(params)
        self.history: deque[tuple[float, float]] = deque()  # (end, GPU service) in end order
        self.history_sorted = SortedBlocks()
        self.node_views: list[Node] = list(cluster.nodes)
        self.dirty_nodes: set[int] = set()
        self.slots = self._slot_table()
        self.fit_cache: dict[tuple[str, int, int, int], bool] = {}
        self.shares = dict(settings.user_shares)

    # ------------------------------------------------------------------ the loop

    def run(self) -> SimStats:
        """Replay the whole trace; results go to `on_finish` as jobs end."""
        self._push_next_submit()
        events = self.events
        while events:
            now = events[0][0]
            batch = []
            while events and events[0][0] == now:
                batch.append(heapq.heappop(events))
            self.now = now
            while batch:
                for _, kind, token, job in batch:
                    self.stats.events += 1
                    if kind == FINISH:
                        if job is not None and job.finish_token == token:
                            self._finish(job, now)
                    elif kind == SUBMIT:
                        self._submit(job, now)  # type: ignore[arg-type]
                    elif kind == WAKE:
                        if job is not None and job.state == PENDING:
                            self._count_shape(job)  # it became eligible
                        self._touch()
                    elif kind == CYCLE:
                        self._cycle(now)
                    else:
                        self._backfill_tick(now)
                batch = []
                while events and events[0][0] == now:  # pushed for this same instant
                    batch.append(heapq.heappop(events))
            if self.changed:
                self.changed = False
                self._main_pass(now)
            if self.backfill_due:
                self.backfill_due = False
                if self.backfill_changed:
                    self.backfill_changed = False
                    self._backfill_pass(now)
        return self.stats

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

    def _push(self, time: float, kind: int, job: SimJob | None) -> int:
        self.sequence += 1
        heapq.heappush(self.events, (time, kind, self.sequence, job))
        return self.sequence

    def _push_next_submit(self) -> None:
        for trace_job in self.trace:
            job = SimJob(
                trace_job, self._is_heavy(trace_job), self.cluster.fewest_leaves(trace_job.gpus),
                self._is_preemptible(trace_job),
            )
            self._push(trace_job.submit, SUBMIT, job)
            return

    def _is_preemptible(self, trace_job: TraceJob) -> bool:
        """`preemptible` as a share: each job's draw depends only on the seed and its id."""
        share = self.settings.preemptible
        if share >= 1.0 or share <= 0.0:
            return share >= 1.0
        return random.Random(f"{self.settings.seed}/{trace_job.job_id}").random() < share

    def _is_heavy(self, trace_job: TraceJob) -> bool:
        probe = Job(
            job_id=trace_job.job_id, user=trace_job.user, state=JobState.PENDING, submit_time=trace_job.submit,
            gpus=trace_job.gpus, num_nodes=trace_job.num_nodes, account=trace_job.account,
            partition=trace_job.partition, name=trace_job.name, comment=trace_job.comment,
        )
        return is_comm_heavy(probe, self.settings.comm_gpus, self.settings.comm_rules)

    # ------------------------------------------------------------------ job life

    def _submit(self, job: SimJob, now: float) -> None:
        self.stats.first_submit = min(self.stats.first_submit, now)
        self.active[job.trace.job_id] = job
        self._enter_pending(job)
        if job.eligible_at > now:
            self._push(job.eligible_at, WAKE, job)
        self._push_next_submit()

    def _enter_pending(self, job: SimJob) -> None:
        job.state = PENDING
        job.order_epoch = -1
        job.pending_view = None
        self.tail.append(job)
        self.pending_count += 1
        if job.eligible_at <= self.now:
            self._count_shape(job)
        self._touch()
        if not self.cycle_armed:
            self.cycle_armed = True
            self._push(self._next_tick(self.settings.interval_s), CYCLE, None)
        if not self.backfill_armed:
            self.backfill_armed = True
            self._push(self._next_tick(self.settings.bf_interval_s), BACKFILL, None)

    def _next_tick(self, period: float, after: float | None = None) -> float:
        """The first multiple of `period` after the trace's first submission that is not before
        `after` (default: now)."""
        origin = self.timeline.origin
        return origin + math.ceil(((self.now if after is None else after) - origin) / period) * period

    def _count_shape(self, job: SimJob) -> None:
        """Count an eligible pending job under its shape (what `_fitting_shapes` looks at)."""
        self.pending_shapes[job.shape] += 1

    def _leave_pending(self, job: SimJob) -> None:
        """A pending job starts (it was eligible, so its shape was counted)."""
        self.pending_count -= 1
        self.pending_shapes[job.shape] -= 1
        if not self.pending_shapes[job.shape]:
            del self.pending_shapes[job.shape]

    def _start(self, job: SimJob, nodes: list[int], now: float) -> None:
        trace = job.trace
        self._leave_pending(job)
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
        job.finish_token = self._push(now + restart + job.work_left * job.slowdown, FINISH, job)
        job.planned_end = job.limit_end(now)
        job.run_count += 1
        job.pending_view = None
        job.running_base = None
        if job.first_start is None:
            job.first_start = now
        gpus_per_node, cpus_per_node = trace.gpus_per_node, trace.cpus_per_node
        self.cluster.allocate(nodes, gpus_per_node, cpus_per_node)
        self._occupy_slots(nodes, gpus_per_node, job.planned_end)
        self.dirty_nodes.update(nodes)
        self.fit_cache.clear()
        self.usage.change_rate(trace.account if self.usage_by_account else trace.user, now, trace.gpus)
        self.stats.starts += 1

    def _stop_run(self, job: SimJob, now: float) -> float:
        """End the current run (finished or preempted); returns its length."""
        trace = job.trace
        length = now - job.start
        job.attained += trace.gpus * length
        job.gpu_seconds += trace.gpus * length
        job.last_run_s = length
        self.cluster.release(job.nodes, trace.gpus_per_node, trace.cpus_per_node)
        self._free_slots(job.nodes, trace.gpus_per_node, job.planned_end)
        self.dirty_nodes.update(job.nodes)
        self.fit_cache.clear()
        self.usage.change_rate(trace.account if self.usage_by_account else trace.user, now, -trace.gpus)
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
            )
        )

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
        job.pending_since = now
        job.switch_wait_start = None
        self.stats.preemptions += 1
        self._enter_pending(job)

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

    # ------------------------------------------------------------------ GPU slots (for planning)

    def _slot_table(self) -> np.ndarray:
        """Per node, the planned end of each GPU's current job (-inf free, +inf no such GPU), sorted."""
        widest = int(self.cluster.gpus.max()) if len(self.cluster) else 0
        table = np.full((len(self.cluster), max(widest, 1)), -INFINITY)
        for node, gpus in enumerate(self.cluster.gpus.tolist()):
            table[node, gpus:] = SLOT_ABSENT
        return table

    def _occupy_slots(self, nodes: list[int], gpus_per_node: int, planned_end: float) -> None:
        table = self.slots
        value = min(planned_end, SLOT_UNLIMITED)
        for node in nodes:
            row = table[node]
            row[:gpus_per_node] = value  # free slots (-inf) sort first
            row.sort()

    def _free_slots(self, nodes: list[int], gpus_per_node: int, planned_end: float) -> None:
        table = self.slots
        value = min(planned_end, SLOT_UNLIMITED)
        for node in nodes:
            row = table[node]
            held = np.flatnonzero(row == value)[:gpus_per_node]
            row[held] = -INFINITY
            row.sort()

    # ------------------------------------------------------------------ policy cycles

    def _cycle(self, now: float) -> None:
        """A policy cycle is due. It is evaluated now if one of the jobs waiting now could start
        (or the policy may requeue); otherwise it is postponed until one could, as until then its
        decisions would change nothing the scheduler does for those jobs."""
        if not self.pending_count:
            self.cycle_armed = False
            return
        self.stats.cycles += 1
        self._check_not_stuck(now)
        self._push(now + self.settings.interval_s, CYCLE, None)
        self.postponed_cycle = now
        if self.may_requeue or self._waiting_job_could_start(self._fitting_shapes()):
            self._evaluate(now)
        else:
            self.stats.postponed_cycles += 1

    def _check_not_stuck(self, now: float) -> None:
        """Fail clearly when jobs wait on an idle cluster with nothing left to happen but cycles
        (constraints that no node satisfies, kept by the policy), instead of cycling forever."""
        idle = len(self.active) == self.pending_count and all(kind >= CYCLE for _, kind, _, _ in self.events)
        if not idle:
            self.idle_since = None
            return
        if self.idle_since is None:
            self.idle_since = now
        elif now - self.idle_since > STUCK_AFTER_S:
            stuck = [job.trace.display_id for job in self._pending_in_order()][:3]
            raise SimulationStuck(
                f"{self.pending_count} job(s) cannot start on an idle cluster for {STUCK_AFTER_S / 86400:g} "
                f"simulated days (e.g. job {', '.join(stuck)}): the constraints the policy keeps on them "
                "fit no node"
            )

    def _waiting_job_could_start(self, fitting: set[tuple[str, int, int, int]]) -> bool:
        """Whether an eligible job already waiting when the postponed cycle fell due fits now."""
        if not fitting:
            return False
        due, now = self.postponed_cycle, self.now
        for job in self._pending_in_order():
            if job.shape in fitting and job.trace.submit <= due and job.eligible_at <= now:  # type: ignore[operator]
                return True
        return False

    def _evaluate(self, now: float) -> None:
        """Run the policy on a snapshot of this instant and apply its decisions."""
        self.postponed_cycle = None
        snapshot, views = self._snapshot(now)
        self.stats.decide_calls += 1
        decisions = self.policy.decide(snapshot, self.params, self.rng)
        self._apply(decisions, views, now)
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
            elapsed = at - job.start if at > job.start else 0.0
            fields["attained_gpu_s"] = job.attained + job.trace.gpus * elapsed
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
            requeueable=self.settings.requeueable and job.preemptible,
            # The oracle's "true duration": the work left when this run (or wait) began.
            true_duration_s=job.work_left + (self.settings.restart_cost_s if job.restart_due else 0.0),
        )

    def _pending_view(self, job: SimJob) -> Job:
        view = Job(
            state=JobState.PENDING, attained_gpu_s=job.attained, last_run_s=job.last_run_s,
            placement=job.placement, **self._job_fields(job),
        )
        job.pending_view = view
        return view

    def _running_base(self, job: SimJob) -> Job:
        base = Job(
            state=JobState.RUNNING, start_time=job.start, attained_gpu_s=job.attained, placement=job.placement,
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
        return Node(template.name, total, allocated, template.cpus, state, template.features, template.partitions)

    def _apply(self, decisions: Decisions, views: Mapping[int, Job], now: float) -> None:
        active = self.active
        scored: list[SimJob] = []
        for decision in decisions.priorities:
            job = active.get(decision.job_id)
            if job is None:
                continue
            job.score = decision.score
            job.level = decision.level
            if decision.promoted and job.state == PENDING:
                view = views.get(decision.job_id)
                job.promoted_at = view.attained_gpu_s if view is not None else job.attained
                job.pending_view = None
            if job.state == PENDING:
                scored.append(job)
        self._set_order(scored)
        if decisions.requeues:
            running = {job_id: view for job_id, view in views.items() if view.state is JobState.RUNNING}
            decisions, refused = guard_requeues(decisions, running, now, self.requeue_limits)
            self.stats.requeues_refused += len(refused)
        self._apply_placements(decisions, now)
        for requeue in decisions.requeues:
            job = active.get(requeue.job_id)
            if job is not None and job.state == RUNNING:
                self._preempt(job, now)
        self.timeline.add_levels(now, Counter(map(attrgetter("level"), decisions.priorities)))

    def _set_order(self, scored: list[SimJob]) -> None:
        self.order_epoch += 1
        epoch = self.order_epoch
        for job in scored:
            job.order_epoch = epoch
        scored.sort(key=lambda j: (-j.score, j.trace.submit, j.trace.job_id))  # type: ignore[operator]
        self.order = scored
        self.tail = [j for j in self.tail if j.state == PENDING and j.order_epoch != epoch]

    def _apply_placements(self, decisions: Decisions, now: float) -> None:
        """The cycle's placements are the wanted constraints: one not re-asserted is removed."""
        wanted: dict[int, Placement] = {}
        for decision in decisions.placements:
            if isinstance(decision, SetPlacement):
                wanted[decision.job_id] = decision.placement
            elif isinstance(decision, ClearPlacement):
                wanted[decision.job_id] = NO_PLACEMENT
        active = self.active
        for job_id, placement in wanted.items():
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
            elif job.state == PENDING:
                self._set_placement(job, NO_PLACEMENT)
                self.engine_placed.discard(job_id)

    def _set_placement(self, job: SimJob, placement: Placement) -> None:
        if placement == job.placement:
            return
        job.placement = placement
        job.allowed = None if placement.is_empty else self.cluster.allowed_mask(job.trace.partition, placement)
        job.switch_wait_start = None
        job.pending_view = None
        job.running_base = None
        if placement.max_switches == 1 and self.single_leaf_possible and job.state == PENDING:
            # Measured on Slurm 22.05 (tests/integration/test_switches_clock_lab.py): the wait
            # runs from when the job carries the constraint, also while it fits nowhere. A live
            # engine sets it at the first cycle that sees the job; a cycle postponed here (nothing
            # could start) would have set it then, so the clock starts at that cycle.
            waiting_since = max(job.pending_since, job.eligible_at)
            self._start_switch_clock(job, min(self.now, self._next_tick(self.settings.interval_s, waiting_since)))

    def _switch_wait(self, placement: Placement) -> int:
        """Seconds a Switches=1@W job waits for one leaf: W capped by max_switch_wait."""
        wait = self.settings.max_switch_wait_s
        return wait if placement.switches_wait_s is None else min(wait, placement.switches_wait_s)

    def _start_switch_clock(self, job: SimJob, at: float) -> None:
        job.switch_wait_start = at
        wait = self._switch_wait(job.placement)
        if at + wait > self.now:  # an earlier end (a clock started at a postponed cycle) is due now
            self._push(at + wait, WAKE, None)  # the pass that lets it run spread

    # ------------------------------------------------------------------ scheduling

    def _fitting_shapes(self) -> set[tuple[str, int, int, int]]:
        """The pending shapes that fit the free resources now (placement constraints ignored)."""
        cluster = self.cluster
        if cluster.free_total <= 0:
            return set()
        cache = self.fit_cache
        fitting = set()
        for shape in self.pending_shapes:
            fits = cache.get(shape)
            if fits is None:
                partition, gpus_per_node, cpus_per_node, count = shape
                if cluster.may_fit(gpus_per_node, count):
                    mask = cluster.partition_masks.get(partition, cluster.all_nodes)
                    fits = bool(np.count_nonzero(cluster.candidates(mask, gpus_per_node, cpus_per_node)) >= count)
                else:
                    fits = False
                cache[shape] = fits
            if fits:
                fitting.add(shape)
        return fitting

    def _pending_in_order(self) -> Iterator[SimJob]:
        epoch = self.order_epoch
        for job in self.order:
            if job.state == PENDING and job.order_epoch == epoch:
                yield job
        for job in self.tail:
            if job.state == PENDING and job.order_epoch != epoch:
                yield job

    def _constraints(self, job: SimJob, now: float) -> tuple[np.ndarray, bool]:
        """(allowed nodes, must stay within one leaf) for a pending job now."""
        cluster = self.cluster
        allowed = job.allowed if job.allowed is not None else cluster.partition_masks.get(job.trace.partition, cluster.all_nodes)
        placement = job.placement
        if placement.max_switches != 1 or not self.single_leaf_possible:
            return allowed, False  # Slurm's cons_tres ignores Switches > 1
        if job.switch_wait_start is None:  # a requeued job: from its first try again
            self._start_switch_clock(job, now)
        return allowed, now - job.switch_wait_start < self._switch_wait(placement)

    def _ready_to_schedule(self) -> set[tuple[str, int, int, int]]:
        """The fitting shapes; a postponed cycle is evaluated first if a job it covers could start."""
        if not self.pending_count:
            return set()
        fitting = self._fitting_shapes()
        if self.postponed_cycle is not None and self._waiting_job_could_start(fitting):
            self._evaluate(self.now)
            self.changed = False  # this pass sees the decisions
            fitting = self._fitting_shapes()
        return fitting

    def _main_pass(self, now: float) -> None:
        """Slurm's main scheduler, run on events: priority order, and the first job that cannot
        start blocks everything below it in its partition (only backfill may pass it)."""
        fitting = self._ready_to_schedule()
        if not fitting:
            return
        self.stats.passes += 1
        cluster = self.cluster
        blocked_partitions: set[str] = set()
        partitions = len({shape[0] for shape in self.pending_shapes})
        tested = 0
        for job in self._pending_in_order():
            if tested >= self.settings.bf_max_job_test or len(blocked_partitions) >= partitions:
                break
            if job.eligible_at > now or job.trace.partition in blocked_partitions:
                continue
            tested += 1
            shape = job.shape
            allowed, single_leaf = self._constraints(job, now)
            nodes = None
            if shape in fitting:
                _, gpus_per_node, cpus_per_node, count = shape
                nodes = cluster.choose(cluster.candidates(allowed, gpus_per_node, cpus_per_node), count, single_leaf)
            if nodes is None:
                blocked_partitions.add(job.trace.partition)
                continue
            self._start(job, nodes, now)
            fitting = self._fitting_shapes()
            if not fitting:
                break

    def _backfill_pass(self, now: float) -> None:
        """Slurm's backfill: priority order, blocked jobs get reservations by the running jobs'
        time limits, and a lower job starts only where it delays none of them."""
        fitting = self._ready_to_schedule()
        if not fitting:
            return
        self.stats.backfill_passes += 1
        settings = self.settings
        cluster = self.cluster
        reservations = _Reservations(len(cluster))
        failed: dict[tuple, float] = {}  # shape -> shortest planned end that could not start
        blocked: list[tuple[SimJob, np.ndarray, bool, tuple]] = []
        unplannable: set[tuple] = set()  # shapes no reservation can be found for in this pass
        left = Counter(self.pending_shapes)  # pending jobs not visited yet, by shape
        fitting_left = sum(left[shape] for shape in fitting)
        planned = 0
        tested = 0
        for job in self._pending_in_order():
            if not fitting_left or tested >= settings.bf_max_job_test:
                break  # no job left that could start now
            if job.eligible_at > now:
                continue
            shape = job.shape
            left[shape] -= 1
            if shape in fitting:
                fitting_left -= 1
            tested += 1
            allowed, single_leaf = self._constraints(job, now)
            end = job.limit_end(now)
            _, gpus_per_node, cpus_per_node, count = shape
            key = (id(allowed), gpus_per_node, cpus_per_node, count, single_leaf)
            if shape not in fitting or (key in failed and failed[key] <= end):
                blocked.append((job, allowed, single_leaf, key))
                continue
            candidates = cluster.candidates(allowed, gpus_per_node, cpus_per_node)
            if np.count_nonzero(candidates) < count:
                failed[key] = -INFINITY
                blocked.append((job, allowed, single_leaf, key))
                continue
            # It could start: first promise resources to the blocked jobs above it.
            while planned < len(blocked) and reservations.count < settings.backfill_reservations:
                entry = blocked[planned]
                planned += 1
                # Later reservations only make it harder: a shape that found none never will.
                if entry[3] not in unplannable and not self._reserve(entry, reservations, now):
                    unplannable.add(entry[3])
            if reservations.count:
                candidates = reservations.admits(candidates, gpus_per_node, end)
            nodes = cluster.choose(candidates, count, single_leaf)
            if nodes is None:
                failed[key] = min(failed.get(key, INFINITY), end)
                blocked.append((job, allowed, single_leaf, key))
                continue
            self._start(job, nodes, now)
            reservations.consume(nodes, gpus_per_node, end)
            fitting = self._fitting_shapes()
            fitting_left = sum(left[shape] for shape in fitting)
        self.stats.reservations += reservations.count

    def _reserve(self, entry: tuple[SimJob, np.ndarray, bool, tuple], reservations: _Reservations, now: float) -> bool:
        """Plan a blocked job: the earliest time enough GPUs free up (by the running jobs' time
        limits) on allowed nodes, and hold them; nothing is held past the backfill window or an
        unlimited running job. False when no reservation could be made."""
        job, allowed, single_leaf, _ = entry
        trace = job.trace
        cluster = self.cluster
        gpus_per_node, count = trace.gpus_per_node, trace.num_nodes
        usable = allowed & (cluster.cpus >= trace.cpus_per_node)
        column = gpus_per_node - 1 + reservations.reserved
        width = self.slots.shape[1]
        ready = np.full(len(cluster), INFINITY)
        inside = usable & (column < width)
        rows = np.flatnonzero(inside)
        ready[rows] = self.slots[rows, column[rows]]
        np.maximum(ready, now, out=ready)
        if single_leaf:
            start = INFINITY
            for leaf in np.unique(cluster.leaf_of[rows]).tolist():
                times = ready[rows[cluster.leaf_of[rows] == leaf]]
                if len(times) >= count:
                    start = min(start, float(np.partition(times, count - 1)[count - 1]))
        elif len(rows) >= count:
            start = float(np.partition(ready[rows], count - 1)[count - 1])
        else:
            start = INFINITY
        if start == INFINITY or start > now + self.settings.bf_window_s:
            return False
        nodes = cluster.choose(ready <= start, count, single_leaf)
        if nodes is None:
            return False
        for node in nodes:
            held_by_then = int(np.searchsorted(self.slots[node], start, side="right"))
            spare = held_by_then - int(reservations.reserved[node]) - gpus_per_node
            reservations.by_node.setdefault(node, []).append([start, spare])
            reservations.reserved[node] += gpus_per_node
        reservations.count += 1
        return True
