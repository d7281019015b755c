"""Expected starts: the replay's simulator run forward from a live snapshot.

`expected_starts` seats every running job on its nodes until its expected end, queues the pending
jobs in the order Slurm holds now, and steps the simulator (sim/kernel/simulator.py: the same main
and backfill passes, reservations by time limits and Switches waits the replay runs) up to a
horizon. A pending job's expected start is when the simulation starts it.

- A running job ends at min(its time limit's end, its start + the service prior's expected run
  time) when the prior expects one and that end is still ahead; else at its time limit's end (no
  limit and no expectation: it holds its nodes past the horizon).
- A pending job runs min(the prior's expected run time, its time limit), else its time limit.
- The order is Slurm's now (partition PriorityTier, priority, submit time, job id), kept fixed:
  no job arrives, no priority moves and nobody is preempted in the simulation.
- Backfill plans by the time limits, as Slurm's does; only the ends follow the expectations.

A pending job the simulation cannot place says why instead of a number: held, waiting on a
dependency or on a reason the simulator does not model (limits, reservations, down nodes), beyond
the first `max_pending` jobs of the queue, fitting no node set that is up, or not started within the
horizon. Pure: the snapshot's time is the clock; nothing is read or written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from dike_slurm.domain.model import Job, JobState, Node, Topology
from dike_slurm.policies.multifactor import MultifactorParams, MultifactorPolicy
from dike_slurm.slurm.slurm_conf import ClusterConf, Partition
from dike_slurm.sim.kernel.cluster import SimCluster
from dike_slurm.sim.kernel.job import INFINITY, SimJob
from dike_slurm.sim.kernel.records import SimSettings, Timeline
from dike_slurm.sim.kernel.simulator import Seated, Simulator
from dike_slurm.sim.kernel.trace import TraceJob

HORIZON_S = 7 * 86400.0  # how far ahead the simulation runs
MAX_PENDING = 1000  # pending jobs simulated, the first in Slurm's order; the rest are not predicted
# squeue's REASONs the simulation models: waiting for room or for the jobs ahead, or for a begin time
MODELLED_REASONS = frozenset({"", "None", "Priority", "Resources", "BeginTime"})

# How an end or a run time was known (Forecast.basis)
PRIOR, LIMIT, UNKNOWN = "service prior", "time limit", "unknown"


@dataclass(frozen=True)
class ForwardInputs:
    """A live snapshot as the forward simulation takes it."""

    at: float  # the snapshot's time: the simulation's clock starts here
    jobs: Sequence[Job]  # every active job Slurm shows (outside the engine's scope too)
    nodes: Sequence[Node]
    topology: Topology
    expected_run_s: Mapping[int, float]  # the service prior's expected run time of a job, all its runs
    settings: SimSettings = field(default_factory=SimSettings)  # Slurm's scheduler (the replay's settings)
    tiers: Mapping[str, int] = field(default_factory=dict)  # partition -> PriorityTier (1 when not listed)
    horizon_s: float = HORIZON_S
    max_pending: int = MAX_PENDING


@dataclass(frozen=True)
class ExpectedStart:
    """A pending job's expected start (epoch s), or None and why not."""

    at: float | None
    why: str = ""


@dataclass(frozen=True)
class Forecast:
    """The expected start of each pending job, and what the simulation took."""

    at: float
    horizon_s: float
    starts: Mapping[int, ExpectedStart]
    simulated: int  # pending jobs simulated
    seated: int  # running jobs seated on their nodes
    basis: Mapping[str, int]  # how the simulated jobs' ends were known: PRIOR, LIMIT or UNKNOWN

    def method(self) -> str:
        """One sentence on how the starts were found."""
        known = ", ".join(f"{count} from the {what}" for what, count in self.basis.items() if count and what != UNKNOWN)
        unknown = self.basis.get(UNKNOWN, 0)
        return (f"Dike's simulator run forward up to {_span(self.horizon_s)} from now with {self.seated} running and "
                f"{self.simulated} pending job(s) in Slurm's order; their ends and run times: {known or 'none known'}"
                + (f", {unknown} with neither a time limit nor an expected run time (they never end in it)"
                   if unknown else "")
                + "; no job arrives and no priority moves in it")


def expected_starts(inputs: ForwardInputs) -> Forecast:
    """Every pending job's expected start (module docstring)."""
    at, horizon = inputs.at, inputs.horizon_s
    cluster = SimCluster(_conf(inputs.nodes, inputs.jobs), inputs.topology)
    settings = _forward_settings(inputs.settings, horizon)
    starts: dict[int, ExpectedStart] = {}
    basis = {PRIOR: 0, LIMIT: 0, UNKNOWN: 0}
    seated = []
    free = (cluster.free_gpus.copy(), cluster.free_cpus.copy())  # what the seats leave, as they are made
    for job in inputs.jobs:
        if job.state is JobState.RUNNING:
            seat = _seat(job, cluster, free, settings, inputs.expected_run_s.get(job.job_id), at, basis)
            if seat is not None:
                seated.append(seat)
    queue = []
    for job in sorted((j for j in inputs.jobs if j.state is JobState.PENDING), key=lambda j: _order(j, inputs.tiers)):
        why = _not_modelled(job)
        if why:
            starts[job.job_id] = ExpectedStart(None, why)
        elif len(queue) >= inputs.max_pending:
            starts[job.job_id] = ExpectedStart(None, f"further down Slurm's queue than the first {inputs.max_pending} "
                                                     "pending jobs the simulation takes")
        else:
            queue.append(job)
    pending = []
    for rank, job in enumerate(queue):
        sim_job = SimJob.from_trace(_pending_trace(job, inputs.expected_run_s.get(job.job_id), basis), settings, cluster)
        sim_job.written, sim_job.owned = len(queue) - rank, True  # Slurm's order, pinned (priority strategy)
        pending.append((sim_job, job.placement))
    simulator = Simulator((), cluster, MultifactorPolicy(), MultifactorParams(), settings,
                          Timeline(origin=at, width=max(horizon / 200, 1.0)), lambda _result: None)
    simulator.resume(at, seated, pending)
    simulator.run(until=at + horizon)
    for (sim_job, _), job in zip(pending, queue, strict=True):
        started = sim_job.first_start
        starts[job.job_id] = ExpectedStart(started) if started is not None else ExpectedStart(
            None, _why_not_started(job, cluster, horizon, basis[UNKNOWN]))
    return Forecast(at, horizon, starts, len(queue), len(seated), basis)


def _forward_settings(settings: SimSettings, horizon_s: float) -> SimSettings:
    """The site's scheduler settings, with the engine out of the way: Slurm's order pinned on each
    job (`priority` strategy, no weights), no policy cycle after the first, no preemption, and run
    times as the prior learned them (no communication slow-down on top)."""
    return replace(settings, interval_s=2 * horizon_s + 1.0, cycle_latency_s=0.0, comm_penalty=0.0, preemptible=0.0,
                   preemption_opt_in=None, priority_model=None, priority_strategy="priority", head_window=0,
                   writes_per_cycle=None, admin_comment=False)


def _conf(nodes: Sequence[Node], jobs: Sequence[Job]) -> ClusterConf:
    """The nodes as a cluster, each partition with the nodes that list it; a job of several
    partitions (`a,b`) may use the nodes of any of them."""
    members: dict[str, list[str]] = {}
    for node in nodes:
        for partition in node.partitions:
            members.setdefault(partition, []).append(node.name)
    for name in {j.partition for j in jobs if "," in j.partition} - members.keys():
        members[name] = sorted({n for p in name.split(",") for n in members.get(p, ())})
    return ClusterConf(tuple(nodes), tuple(Partition(name, tuple(names)) for name, names in members.items()), {})


def _order(job: Job, tiers: Mapping[str, int]) -> tuple:
    """Where Slurm tries the job: tier and priority descending, then submit time and id."""
    tier = max(tiers.get(p, 1) for p in job.partition.split(","))
    return (-tier, -(job.priority or 0), job.submit_time, job.job_id)


def _not_modelled(job: Job) -> str:
    """Why the simulation cannot place a pending job ("" when it can)."""
    reason = job.slurm_reason
    if "held" in reason.lower():
        return f"held ({reason}): it starts only once released"
    if reason.startswith("Dependency"):
        return f"waits on a dependency ({reason}), which the simulation does not follow"
    if reason not in MODELLED_REASONS:
        return f"Slurm keeps it waiting for {reason}, which the simulation does not model"
    return ""


def _seat(job: Job, cluster: SimCluster, free: tuple[np.ndarray, np.ndarray], settings: SimSettings,
          expected: float | None, at: float, basis: dict[str, int]) -> Seated | None:
    """A running job on the nodes it holds that are up (None: none is), until its expected end.
    `free`: the GPUs and CPUs per node the seats made so far leave (updated)."""
    nodes = [cluster.index[name] for name in job.nodes if name in cluster.index]
    if not nodes:
        return None  # its nodes are down or drained: nothing starts on them anyway
    free_gpus, free_cpus = free
    # its share of each node, never more than a node has left (Slurm may spread it unevenly)
    gpus = min(-(-job.gpus // max(job.num_nodes, 1)), *(int(free_gpus[n]) for n in nodes))
    cpus = min(-(-job.cpus // max(job.num_nodes, 1)), *(int(free_cpus[n]) for n in nodes))
    free_gpus[nodes] -= gpus
    free_cpus[nodes] -= cpus
    started = job.start_time if job.start_time is not None else at
    limit_end = started + job.time_limit_s if job.time_limit_s is not None else INFINITY
    expected_end = started + expected if expected is not None else -INFINITY
    if expected_end > at:
        ends, how = min(limit_end, expected_end), PRIOR if expected_end < limit_end else LIMIT
    else:  # no expectation, or the job overran it: its time limit, as Slurm's backfill plans
        ends, how = limit_end, LIMIT if limit_end < INFINITY else UNKNOWN
    basis[how] += 1
    trace = _trace(job, duration_s=max(0.0, ends - at), gpus=gpus * len(nodes), num_nodes=len(nodes),
                   cpus=cpus * len(nodes))
    return Seated(SimJob.from_trace(trace, settings, cluster), nodes, started, ends)


def _pending_trace(job: Job, expected: float | None, basis: dict[str, int]) -> TraceJob:
    limit = float(job.time_limit_s) if job.time_limit_s is not None else INFINITY
    if expected is not None and expected < limit:
        run, how = expected, PRIOR
    else:
        run, how = limit, LIMIT if limit < INFINITY else UNKNOWN
    basis[how] += 1
    return _trace(job, duration_s=run, gpus=job.gpus, num_nodes=max(job.num_nodes, 1), cpus=max(job.cpus, 1))


def _trace(job: Job, *, duration_s: float, gpus: int, num_nodes: int, cpus: int) -> TraceJob:
    eligible = job.eligible_time if job.eligible_time is not None else job.submit_time
    return TraceJob(
        job_id=job.job_id, display_id=job.display_id, user=job.user, account=job.account, partition=job.partition,
        qos=job.qos, name=job.name, comment=job.comment, submit=job.submit_time,
        eligible_delay_s=max(0.0, eligible - job.submit_time), duration_s=duration_s, time_limit_s=job.time_limit_s,
        gpus=gpus, num_nodes=num_nodes, cpus=cpus, array_job_id=job.array_job_id,
        array_task_id=job.array_task_id, gpu_types=job.gpu_types,
    )


def _span(seconds: float) -> str:
    """`7 days`, `12 hours`, `30 minutes`."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = seconds / size
            return f"{count:g} {unit}{'' if count == 1 else 's'}"
    return f"{seconds:g} s"


def _why_not_started(job: Job, cluster: SimCluster, horizon_s: float, unknown_ends: int) -> str:
    """Why a simulated pending job did not start within the horizon."""
    mask = cluster.allowed_mask(job.partition, job.placement, job.gpu_types)
    per_node = -(-job.gpus // max(job.num_nodes, 1))
    cpus = -(-max(job.cpus, 1) // max(job.num_nodes, 1))
    fitting = int((mask & (cluster.gpus >= per_node) & (cluster.cpus >= cpus)).sum())
    if fitting < max(job.num_nodes, 1):
        return (f"fits no set of the nodes up now ({per_node} GPU(s) and {cpus} CPU(s) on each of "
                f"{max(job.num_nodes, 1)} node(s) of partition {job.partition or 'any'}, with its constraint)")
    never = (f"; {unknown_ends} simulated job(s) have neither a time limit nor an expected run time, "
             "so the simulation never frees their room" if unknown_ends else "")
    return f"not within the {_span(horizon_s)} simulated: the jobs ahead and the running jobs leave no room for it by then{never}"
