"""Slurm's scheduler as the replay models it: the pending queue in priority order, the main pass,
the backfill pass with its reservations, and the Switches wait. docs/replay.md describes the
semantics and the simplifications."""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter

import numpy as np

from dike_slurm.domain.model import Placement
from dike_slurm.sim.kernel.cluster import SimCluster
from dike_slurm.sim.kernel.job import INFINITY, PENDING, SimJob
from dike_slurm.sim.kernel.priority import SlurmOrder
from dike_slurm.sim.kernel.records import SimSettings, SimStats

Shape = tuple[str, int, int, int]  # partition, GPUs per node, CPUs per node, nodes

# GPU slot table values: a slot of a job without time limit, and a GPU the node does not have.
SLOT_UNLIMITED = 1e300
SLOT_ABSENT = INFINITY


def next_tick(origin: float, period: float, after: float) -> float:
    """The first multiple of `period` after `origin` that is not before `after`."""
    return origin + math.ceil((after - origin) / period) * period


def main_pass_time(settings: SimSettings, origin: float, last_pass: float, now: float) -> float:
    """When Slurm's main scheduler runs after a change at `now` (22.05 controller.c): a change
    asks for a pass, which runs once `batch_sched_delay` has passed since the last pass, or at
    the periodic full pass (every `sched_interval`) if that comes first. With a delay of 0 (the
    SimSettings default) the pass runs at once."""
    delay = settings.batch_sched_delay_s
    if delay <= 0:
        return now
    period = settings.sched_interval_s
    previous_full = origin + math.floor((now - origin) / period) * period
    if previous_full == now:
        return now
    last = max(last_pass, previous_full)
    return min(max(now, last + delay), previous_full + period)


class Reservations:
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

    def hold(self, slots: np.ndarray, nodes: Iterable[int], gpus_per_node: int, start: float) -> None:
        """Promise a blocked job these nodes' GPUs from `start` (`slots`: the scheduler's table of
        each GPU's planned end), each entry with what the node has to spare at that time."""
        for node in nodes:
            held_by_then = int(np.searchsorted(slots[node], start, side="right"))
            spare = held_by_then - int(self.reserved[node]) - gpus_per_node
            self.by_node.setdefault(node, []).append([start, spare])
            self.reserved[node] += gpus_per_node
        self.count += 1

    def consume(self, nodes: Iterable[int], gpus_per_node: int, end: float) -> None:
        for node in nodes:
            for entry in self.by_node.get(node, ()):
                if entry[0] < end:
                    entry[1] -= gpus_per_node


class SlurmScheduler:
    """The pending queue and Slurm's two passes over it; jobs start through `start`."""

    def __init__(
        self,
        cluster: SimCluster,
        settings: SimSettings,
        stats: SimStats,
        origin: float,
        start: Callable[[SimJob, list[int], float], None],
        wake: Callable[[float], None],
        priority: SlurmOrder,
    ) -> None:
        self.cluster = cluster
        self.settings = settings
        self.stats = stats
        self.origin = origin  # policy cycles fall on multiples of the interval after it
        self.start = start
        self.wake = wake  # a scheduling pass is due then (a Switches wait runs out)
        self.single_leaf_possible = bool(cluster.topology.switches) and cluster.leaf_count < len(cluster)
        self.pending_shapes: Counter[Shape] = Counter()  # eligible pending jobs
        self.priority = priority  # Slurm's priority of a pending job (sim/kernel/priority.py)
        self.order: list[SimJob] = []  # pending jobs in Slurm's order, as of the last recalculation
        self.tail: list[SimJob] = []  # jobs that became pending since, each with its priority then
        self.tail_sorted = True
        self.order_epoch = 0
        self.slots = self._slot_table()
        self.fit_cache: dict[Shape, bool] = {}
        self.cpus_at_least: dict[int, np.ndarray] = {}  # _cpus_at_least's masks

    # ------------------------------------------------------------------ the queue

    def enqueue(self, job: SimJob, now: float) -> None:
        """A job becomes pending: Slurm gives it a priority at once (its SiteFactor, if any, kept
        from an earlier run); it joins the order at that priority until the next recalculation."""
        job.order_epoch = -1
        job.order_key = self.priority.key(job, now)
        self.tail.append(job)
        self.tail_sorted = False
        if job.eligible_at <= now:
            self.count_eligible(job)

    def count_eligible(self, job: SimJob) -> None:
        """Count an eligible pending job under its shape (what `fitting_shapes` looks at)."""
        self.pending_shapes[job.shape] += 1

    def _dequeue(self, job: SimJob) -> None:
        """A pending job starts (it was eligible, so its shape was counted)."""
        self.pending_shapes[job.shape] -= 1
        if not self.pending_shapes[job.shape]:
            del self.pending_shapes[job.shape]

    def set_order(self, pending: list[SimJob], now: float) -> None:
        """Slurm recalculates every pending job's priority: the queue in Slurm's order
        (partition PriorityTier, priority, submit time, job id; sim/kernel/priority.py)."""
        self.order_epoch += 1
        epoch = self.order_epoch
        key = self.priority.key
        for job in pending:
            job.order_epoch = epoch
            job.order_key = key(job, now)
        pending.sort(key=attrgetter("order_key"))
        self.order = pending
        self.tail = []

    def pending_in_order(self) -> Iterator[SimJob]:
        epoch = self.order_epoch
        if not self.tail:
            for job in self.order:
                if job.state == PENDING and job.order_epoch == epoch:
                    yield job
            return
        if not self.tail_sorted:
            self.tail.sort(key=attrgetter("order_key"))
            self.tail_sorted = True
        ordered = (j for j in self.order if j.state == PENDING and j.order_epoch == epoch)
        arrived = (j for j in self.tail if j.state == PENDING and j.order_epoch != epoch)
        yield from heapq.merge(ordered, arrived, key=attrgetter("order_key"))

    def fitting_shapes(self) -> set[Shape]:
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

    # ------------------------------------------------------------------ resources

    def occupy(self, job: SimJob) -> None:
        """A pending job starts on `job.nodes`, planned to end at `job.planned_end`."""
        trace = job.trace
        self._dequeue(job)
        self.cluster.allocate(job.nodes, trace.gpus_per_node, trace.cpus_per_node)
        value = min(job.planned_end, SLOT_UNLIMITED)
        for node in job.nodes:
            row = self.slots[node]
            row[:trace.gpus_per_node] = value  # free slots (-inf) sort first
            row.sort()
        self.fit_cache.clear()

    def vacate(self, job: SimJob) -> None:
        """A run ends (finished or requeued): its nodes' GPUs and CPUs are free again."""
        trace = job.trace
        self.cluster.release(job.nodes, trace.gpus_per_node, trace.cpus_per_node)
        value = min(job.planned_end, SLOT_UNLIMITED)
        for node in job.nodes:
            row = self.slots[node]
            held = np.flatnonzero(row == value)[:trace.gpus_per_node]
            row[held] = -INFINITY
            row.sort()
        self.fit_cache.clear()

    def _cpus_at_least(self, cpus: int) -> np.ndarray:
        """The nodes with at least this many CPUs (the cluster's, which never change)."""
        mask = self.cpus_at_least.get(cpus)
        if mask is None:
            mask = self.cpus_at_least[cpus] = self.cluster.cpus >= cpus
        return mask

    def _slot_table(self) -> np.ndarray:
        """Per node, the planned end of each GPU's current job (-inf free, +inf no such GPU), sorted."""
        widest = int(self.cluster.gpus.max()) if len(self.cluster) else 0
        table = np.full((len(self.cluster), max(widest, 1)), -INFINITY)
        for node, gpus in enumerate(self.cluster.gpus.tolist()):
            table[node, gpus:] = SLOT_ABSENT
        return table

    # ------------------------------------------------------------------ placement constraints

    def constrain(self, job: SimJob, placement: Placement, now: float) -> None:
        """Set a job's placement constraint. Its Switches clock, once started, is never restarted:
        Slurm 22.05 keeps `wait4switch_start` through `scontrol update` and requeues, so a new wait
        counts from the first start (tests/integration/test_fidelity_lab.py)."""
        job.placement = placement
        types = job.trace.gpu_types
        job.allowed = None if placement.is_empty and not types else self.cluster.allowed_mask(
            job.trace.partition, placement, types)
        if placement.max_switches == 1 and self.single_leaf_possible and job.state == PENDING:
            if job.switch_wait_start is not None:
                self._start_switch_clock(job, job.switch_wait_start, now)  # the new wait's end, if ahead
                return
            # Measured on Slurm 22.05 (tests/integration/test_switches_clock_lab.py): the wait
            # runs from when the job carries the constraint, also while it fits nowhere. A live
            # engine sets it at the first cycle that sees the job; a cycle postponed here (nothing
            # could start) would have set it then, so the clock starts at that cycle.
            waiting_since = max(job.pending_since, job.eligible_at)
            first_cycle = next_tick(self.origin, self.settings.interval_s, waiting_since)
            self._start_switch_clock(job, min(now, first_cycle), now)

    def _switch_wait(self, placement: Placement) -> int:
        """Seconds a Switches=1@W job waits for one leaf: W capped by max_switch_wait."""
        wait = self.settings.max_switch_wait_s
        return wait if placement.switches_wait_s is None else min(wait, placement.switches_wait_s)

    def _start_switch_clock(self, job: SimJob, at: float, now: float) -> None:
        job.switch_wait_start = at
        wait = self._switch_wait(job.placement)
        if at + wait > now:  # an earlier end (a clock started at a postponed cycle) is due now
            self.wake(at + wait)  # the pass that lets it run spread

    def _constraints(self, job: SimJob, now: float) -> tuple[np.ndarray, bool]:
        """(allowed nodes, must stay within one leaf) for a pending job now."""
        cluster = self.cluster
        allowed = job.allowed if job.allowed is not None else cluster.partition_masks.get(job.trace.partition, cluster.all_nodes)
        placement = job.placement
        if placement.max_switches != 1 or not self.single_leaf_possible:
            return allowed, False  # Slurm's cons_tres ignores Switches > 1
        if job.switch_wait_start is None:  # never started yet: from this first try
            self._start_switch_clock(job, now, now)
        return allowed, now - job.switch_wait_start < self._switch_wait(placement)

    # ------------------------------------------------------------------ the passes

    def main_pass(self, now: float, fitting: set[Shape]) -> None:
        """Slurm's main scheduler, run on events: priority order, and the first job that cannot
        start blocks everything below it in its partition (only backfill may pass it)."""
        if not fitting:
            return
        self.stats.passes += 1
        cluster = self.cluster
        blocked_partitions: set[str] = set()
        partitions = len({shape[0] for shape in self.pending_shapes})
        tested = 0
        for job in self.pending_in_order():
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
            self.start(job, nodes, now)
            fitting = self.fitting_shapes()
            if not fitting:
                break

    def backfill_pass(self, now: float, fitting: set[Shape]) -> None:
        """Slurm's backfill: priority order, blocked jobs get reservations by the running jobs'
        time limits, and a lower job starts only where it delays none of them."""
        if not fitting:
            return
        self.stats.backfill_passes += 1
        settings = self.settings
        cluster = self.cluster
        reservations = Reservations(len(cluster))
        failed: dict[tuple, float] = {}  # shape -> shortest planned end that could not start
        blocked: list[tuple[SimJob, np.ndarray, bool, tuple]] = []
        unplannable: set[tuple] = set()  # shapes no reservation can be found for in this pass
        left = Counter(self.pending_shapes)  # pending jobs not visited yet, by shape
        fitting_left = sum(left[shape] for shape in fitting)
        planned = 0
        tested = 0
        for job in self.pending_in_order():
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
            self.start(job, nodes, now)
            reservations.consume(nodes, gpus_per_node, end)
            fitting = self.fitting_shapes()
            fitting_left = sum(left[shape] for shape in fitting)
        self.stats.reservations += reservations.count

    def _reserve(self, entry: tuple[SimJob, np.ndarray, bool, tuple], reservations: Reservations, now: float) -> bool:
        """Plan a blocked job: the earliest time enough GPUs free up (by the running jobs' time
        limits) on allowed nodes, and hold them; nothing is held past the backfill window or an
        unlimited running job. False when no reservation could be made."""
        job, allowed, single_leaf, _ = entry
        trace = job.trace
        cluster = self.cluster
        gpus_per_node, count = trace.gpus_per_node, trace.num_nodes
        usable = allowed & self._cpus_at_least(trace.cpus_per_node)
        column = gpus_per_node - 1 + reservations.reserved
        rows = np.flatnonzero(usable & (column < self.slots.shape[1]))
        # when each of those nodes has the job's GPUs (past what is promised) free, by the running
        # jobs' limits, and not before now; every other node never
        ready = np.maximum(self.slots[rows, column[rows]], now)
        if single_leaf:
            start = INFINITY
            leaves = cluster.leaf_of[rows]
            for leaf in np.unique(leaves).tolist():
                times = ready[leaves == leaf]
                if len(times) >= count:
                    start = min(start, float(np.partition(times, count - 1)[count - 1]))
        elif len(rows) >= count:
            start = float(np.partition(ready, count - 1)[count - 1])
        else:
            start = INFINITY
        if start == INFINITY or start > now + self.settings.bf_window_s:
            return False
        in_time = np.zeros(len(cluster), dtype=bool)
        in_time[rows[ready <= start]] = True
        nodes = cluster.choose(in_time, count, single_leaf)
        if nodes is None:
            return False
        reservations.hold(self.slots, nodes, gpus_per_node, start)
        return True
