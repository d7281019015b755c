"""A job's mutable state during the replay, shared by the event loop and the scheduler model."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable

import numpy as np

from dike_slurm.domain.model import NO_PLACEMENT, Job, JobState, Placement
from dike_slurm.policies.common import is_comm_heavy
from dike_slurm.sim.kernel.cluster import SimCluster
from dike_slurm.sim.kernel.records import SimSettings
from dike_slurm.sim.kernel.trace import TraceJob

PENDING, RUNNING, DONE = 0, 1, 2
INFINITY = math.inf


class SimJob:
    """A job's mutable state during the replay."""

    __slots__ = (
        "trace", "heavy", "state", "eligible_at", "pending_since", "attained", "promoted_at",
        "run_count", "preemptions", "last_run_s", "work_left", "restart_due", "start", "nodes",
        "leaves", "slowdown", "planned_end", "finish_token", "level", "order_epoch",
        "placement", "allowed", "switch_wait_start", "pending_view",
        "running_base", "first_start", "pending_total", "all_consolidated", "gpu_seconds",
        "shape", "fewest_leaves", "preemptible", "lost_gpu_s",
        "written", "written_level", "owned", "comment_level", "order_key", "association", "billing",
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
        # What the engine wrote to the strategy field (SiteFactor, Nice or Priority; 0: nothing),
        # the level it wrote it for, and whether it ever wrote it; Slurm keeps it across requeues.
        self.written = 0
        self.written_level: int | None = None
        self.owned = False
        self.comment_level: int | None = None  # the level in the AdminComment the engine wrote
        self.order_key: tuple = ()
        self.association = (trace.account, trace.user)
        self.billing = 1.0  # what a GPU-second of its current run is charged (TRESBillingWeights)

    @classmethod
    def from_trace(cls, trace: TraceJob, settings: SimSettings, cluster: SimCluster) -> SimJob:
        """A job of the trace as it arrives, with its communication class and whether it may be preempted."""
        job = cls(trace, _is_heavy(trace, settings), cluster.fewest_leaves(trace.gpus), _is_preemptible(trace, settings))
        if trace.gpu_types:  # a typed job runs only on nodes of its types, whatever its placement
            job.allowed = cluster.allowed_mask(trace.partition, NO_PLACEMENT, trace.gpu_types)
        return job

    def limit_end(self, start: float) -> float:
        """When a run starting at `start` reaches the time limit (infinity: unlimited)."""
        limit = self.trace.time_limit_s
        return start + limit if limit is not None else INFINITY


def _is_preemptible(trace: TraceJob, settings: SimSettings) -> bool:
    """The engine's opt-in rule when the replay follows it; else `preemptible` as a share, each
    job's draw depending only on the seed and its id."""
    if settings.preemption_opt_in is not None:
        return settings.preemption_opt_in.admits(trace.partition, trace.qos, trace.comment)
    share = settings.preemptible
    if share >= 1.0 or share <= 0.0:
        return share >= 1.0
    return random.Random(f"{settings.seed}/{trace.job_id}").random() < share


def _is_heavy(trace: TraceJob, settings: SimSettings) -> bool:
    probe = Job(
        job_id=trace.job_id, user=trace.user, state=JobState.PENDING, submit_time=trace.submit,
        gpus=trace.gpus, num_nodes=trace.num_nodes, account=trace.account,
        partition=trace.partition, name=trace.name, comment=trace.comment,
    )
    return is_comm_heavy(probe, settings.comm_gpus, settings.comm_rules)


def count_preemptible(trace: Iterable[TraceJob], settings: SimSettings) -> int:
    """How many of the trace's jobs may be preempted under the settings."""
    return sum(_is_preemptible(job, settings) for job in trace)
