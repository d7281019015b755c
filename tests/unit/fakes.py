"""An in-memory cluster behind the backend interface, for the unit tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from types import MappingProxyType

from dike_slurm.domain.fields import JobField, JobUpdate, with_placement_field
from dike_slurm.domain.model import Job, JobState, Node, Placement, Topology
from dike_slurm.domain.slurm_priority import SlurmPriorityModel
from dike_slurm.slurm.accounting import AccountingRecord, ReadResult
from dike_slurm.slurm.backends.base import Backend, ClusterState, WriteOutcome


class FakeBackend(Backend):
    """An in-memory cluster for unit tests: applies updates to its jobs and counts calls."""

    name = "fake"

    def __init__(
        self,
        jobs: Iterable[Job],
        nodes: Iterable[Node],
        topology: Topology | None = None,
        *,
        time: float = 1_000_000.0,
        records: Iterable[AccountingRecord] = (),
        admin_comments: Mapping[int, str] | None = None,
        priority: SlurmPriorityModel | None = None,
    ) -> None:
        self.time = time
        self.priority = priority  # what priority_model() hands out (None: the site's weights are unknown)
        self.priority_reads = 0
        self.jobs: dict[int, Job] = {j.job_id: j for j in jobs}
        self.nodes = tuple(nodes)
        self.topology = topology or Topology()
        self.records = list(records)
        self.site_factors: dict[int, int] = {}
        self.admin_comments: dict[int, str] = dict(admin_comments or {})
        self.applied: list[JobUpdate] = []
        self.requeued: list[int] = []
        self.signalled: list[tuple[int, str]] = []
        self.failing_jobs: set[int] = set()

    def read_cluster(self) -> ClusterState:
        self.calls += 1
        active = tuple(j for j in self.jobs.values() if j.state.is_active)
        visible = {
            j.job_id: self.site_factors.get(j.job_id, 0) for j in active if j.state is JobState.PENDING
        }
        return ClusterState(
            self.time,
            active,
            self.nodes,
            self.topology,
            MappingProxyType(visible),
            MappingProxyType({j.job_id: self.admin_comments.get(j.job_id, "") for j in active}),
        )

    def priority_model(self) -> SlurmPriorityModel | None:
        self.priority_reads += 1
        return self.priority

    def accounting(self, start: float, end: float) -> ReadResult:
        self.calls += 1
        chosen = tuple(
            r for r in self.records
            if (r.end is None or r.end >= start) and (r.start is None or r.start <= end)
        )
        return ReadResult(records=chosen, rows=len(chosen), skipped={}, source="fake")

    def apply(self, update: JobUpdate) -> WriteOutcome:
        self.calls += 1
        command = self.describe(update)
        job = self.jobs.get(update.job_id)
        if job is None or not job.state.is_active or update.job_id in self.failing_jobs:
            return WriteOutcome(False, command, "Invalid job id specified", job_gone=job is None)
        if any(f.is_placement for f in update.fields) and job.state is not JobState.PENDING:
            return WriteOutcome(False, command, "Job is no longer pending execution", job_gone=True)
        self.applied.append(update)
        placement = job.placement
        for key, value in update.values:
            if key is JobField.SITE_FACTOR:
                self.site_factors[job.job_id] = int(value)  # type: ignore[arg-type]
            elif key is JobField.PRIORITY:
                job = replace(job, priority=value)  # type: ignore[arg-type]
            elif key is JobField.NICE:
                job = replace(job, nice=int(value))  # type: ignore[arg-type]
            elif key is JobField.ADMIN_COMMENT:
                self.admin_comments[job.job_id] = str(value)
            else:
                placement = with_placement_field(placement, key, value)
        self.jobs[job.job_id] = replace(job, placement=placement)
        return WriteOutcome(True, command)

    def signal(self, job_id: int, signal: str) -> WriteOutcome:
        self.calls += 1
        self.signalled.append((job_id, signal))
        return WriteOutcome(True, f"signal {job_id} {signal}")

    def requeue(self, job_id: int) -> WriteOutcome:
        self.calls += 1
        self.requeued.append(job_id)
        job = self.jobs[job_id]
        self.jobs[job_id] = replace(job, state=JobState.PENDING, start_time=None, nodes=())
        return WriteOutcome(True, f"requeue {job_id}")

    def describe(self, update: JobUpdate) -> str:
        parts = " ".join(f"{key.value}={value!r}" for key, value in update.values)
        return f"update {update.job_id} {parts}"

    def user_sets(self, job_id: int, placement: Placement) -> None:
        """What a user's own `scontrol update` of their pending job does."""
        self.jobs[job_id] = replace(self.jobs[job_id], placement=placement)
