"""The policy's view of the replay: the frozen `Job` and `Node` records a snapshot holds, built
from the simulated jobs and nodes. A record is kept until what it shows changes: the job
lifecycle drops a job's cached view (`SimJob.pending_view`, `SimJob.running_base`), and a node
whose allocation changed is marked in `dirty_nodes`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from dike_slurm.frozen import frozen_record
from dike_slurm.domain.model import Job, JobState, Node
from dike_slurm.sim.kernel.cluster import SimCluster
from dike_slurm.sim.kernel.job import PENDING, SimJob
from dike_slurm.sim.kernel.records import SimSettings


class SnapshotViews:
    """The views of the jobs and nodes, rebuilt only where something changed."""

    def __init__(self, cluster: SimCluster, settings: SimSettings) -> None:
        self.cluster = cluster
        self.settings = settings
        self.node_views: list[Node] = list(cluster.nodes)
        self.dirty_nodes: set[int] = set()

    def jobs(self, active: Mapping[int, SimJob], at: float, pinned: Callable[[SimJob], bool]) -> dict[int, Job]:
        """Each active job as the policy sees it at `at`; `pinned`: whether a pending job is pinned
        to the room a preemption freed for it."""
        views: dict[int, Job] = {}
        for job_id, job in active.items():
            if job.state == PENDING:
                views[job_id] = job.pending_view or self._pending_view(job, pinned(job))
                continue
            # A running job: a copy of its frozen per-run view with the two fields that move
            # with time (dataclasses.replace re-runs __init__ over every field, which would
            # dominate the cycle at scale).
            fields = (job.running_base or self._running_base(job)).__dict__.copy()
            reported = math.floor(job.start)  # Slurm reports StartTime in whole seconds
            elapsed = at - reported if at > reported else 0.0
            fields["attained_gpu_s"] = job.attained + job.trace.gpus * job.billing * elapsed
            fields["last_run_s"] = elapsed
            views[job_id] = frozen_record(Job, fields)
        return views

    def nodes(self) -> tuple[Node, ...]:
        """Every node as the policy sees it (the changed ones rebuilt)."""
        for node in self.dirty_nodes:
            self.node_views[node] = self._node_view(node)
        self.dirty_nodes.clear()
        return tuple(self.node_views)

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

    def _pending_view(self, job: SimJob, pinned: bool) -> Job:
        view = Job(
            state=JobState.PENDING, attained_gpu_s=job.attained, last_run_s=job.last_run_s,
            placement=job.placement,
            pinned_for_preemption=pinned,
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
