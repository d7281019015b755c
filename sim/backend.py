"""The replay simulator behind the backend interface: `dike-slurm run` driving a simulated cluster.

The simulator runs as it does for `dike-slurm replay`, but does not decide: `read_cluster` steps
it to its next policy cycle (every `replay.interval_s` simulated seconds while jobs wait) and
returns that instant as Slurm would show it; the engine decides and writes, and the next
`read_cluster` hands the simulator, as its decisions, exactly what the engine wrote:
SiteFactor/Priority/Nice as the queue order, constraints, requeues. Jobs without a value keep
submit order. Accounting comes from the runs the simulation finished or preempted. Only the
simulator's public surface is used (its constructor, `run`, `awaiting`, `decide` and the finish
callback), so the replay and the engine share one scheduling model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dike_slurm.slurm.accounting import AccountingRecord, ReadResult
from dike_slurm.domain.admin_comment import comment_level
from dike_slurm.slurm.backends.base import Backend, ClusterState, ReadMemory, WriteOutcome
from dike_slurm.domain.fields import JobField, JobUpdate, with_placement_field
from dike_slurm.config import Config
from dike_slurm.domain.decisions import Decisions, Requeue, SetPlacement, SetPriority
from dike_slurm.errors import ConfigError, DikeError
from dike_slurm.domain.model import Job, JobState, Placement, Snapshot
from dike_slurm.cycle.reconcile import STRATEGY_FIELD
from dike_slurm.registry import default_registry
from dike_slurm.sim.kernel.cluster import SimCluster
from dike_slurm.sim.kernel.metrics import MetricsCollector, summarise
from dike_slurm.sim.kernel.replay import load_input, sim_settings
from dike_slurm.sim.kernel.records import JobResult, Timeline
from dike_slurm.sim.kernel.simulator import Simulator
from dike_slurm.slurm.usage import run_gpu_types

_TIMELINE_BINS = 200


class SimulatedBackend(Backend):
    """A simulated Slurm cluster replaying a sacct dump; one read per simulator cycle."""

    name = "simulated"
    realtime = False

    def __init__(self, config: Config, dump: Path, slurm_conf: Path, topology_conf: Path | None) -> None:
        replay_input = load_input(dump, slurm_conf, topology_conf)
        settings = sim_settings(config, replay_input.conf, source=str(slurm_conf))
        trace = replay_input.trace.jobs
        self.cluster = SimCluster(replay_input.conf, replay_input.topology)
        span = trace[-1].submit - trace[0].submit
        self.timeline = Timeline(origin=trace[0].submit, width=max(settings.interval_s, span / _TIMELINE_BINS, 1.0))
        self.collector = MetricsCollector()
        self.accounts = {t.job_id: t.account for t in trace}
        self.final_states = {t.job_id: JobState(t.final_state) for t in trace}  # how each job's dump ended it
        self.names = {t.job_id: t.name for t in trace}
        self.partitions = {t.job_id: t.partition for t in trace}
        self.strategy_field = STRATEGY_FIELD[config.engine.priority_strategy]
        self.model = settings.priority_model
        self.raw: dict[int, dict[JobField, Any]] = {}  # every field as written, as Slurm would show it
        self.placements: dict[int, Placement] = {}
        self.requeues: list[int] = []
        self.records: list[AccountingRecord] = []
        self.recorded_gpu_s: dict[int, float] = {}
        self.snapshot: Snapshot | None = None  # the instant the engine is looking at
        self.kept = ReadMemory()  # the engine's, once it asks (keep_reads_in)
        self.ended = False
        self.error: DikeError | None = None
        # The engine's policy sits in the simulator's slot only to say what it declares (its
        # requeue minimum, its usage owner); the decisions are what the engine writes.
        self.simulator = Simulator(
            trace, self.cluster, default_registry().create(config.engine.policy),
            config.policy_params(config.engine.policy), settings, self.timeline, self._finished, decides=False,
        )

    def priority_model(self):
        """Slurm's priority on the simulated cluster: what the replay orders its queue by."""
        return self.model

    @classmethod
    def from_config(cls, config: Config) -> SimulatedBackend:
        slurm = config.slurm
        if slurm.simulated_trace is None or slurm.slurm_conf is None:
            raise ConfigError(
                "slurm.backend = 'simulated' needs slurm.simulated_trace (a sacct dump) and slurm.slurm_conf "
                "(the cluster; topology.conf from slurm.topology_conf or beside it)"
            )
        return cls(config, slurm.simulated_trace, slurm.slurm_conf, slurm.topology_conf)

    # ---------------------------------------------------------------- time

    def finished(self) -> bool:
        return self.ended

    def summary(self) -> Mapping[str, Any]:
        """The replay metrics of the outcome (docs/replay.md defines them)."""
        if not self.ended or self.error is not None:
            raise DikeError("the simulation has not ended yet")
        return summarise(self.collector, self.simulator.stats, self.timeline, self.cluster.total_gpus).summary

    def _decisions(self, snapshot: Snapshot) -> Decisions:
        """What the engine wrote, as the simulator takes decisions."""
        priorities = []
        for job in snapshot.jobs:
            raw = self.raw.get(job.job_id, {})
            level = comment_level(str(raw.get(JobField.ADMIN_COMMENT, "")))
            score = raw.get(JobField.SITE_FACTOR) or raw.get(JobField.PRIORITY) or -int(raw.get(JobField.NICE, 0))
            priorities.append(SetPriority(job.job_id, level if level is not None else 0, float(score), "engine"))
        placements = tuple(SetPlacement(job_id, p, "engine") for job_id, p in self.placements.items())
        # the job each victim's room is for: the one the engine pinned to the victim's nodes (the
        # engine's Requeue says so; Slurm only sees the pin)
        waiting = {job.job_id for job in snapshot.jobs if job.state is JobState.PENDING}
        pins = sorted((job_id, set(p.require_nodes)) for job_id, p in self.placements.items()
                      if p.require_nodes and job_id in waiting)
        nodes_of = {job.job_id: set(job.nodes) for job in snapshot.jobs}
        requeues = tuple(
            Requeue(job_id, "engine", for_job=next((j for j, pinned in pins if pinned & nodes_of.get(job_id, set())), None))
            for job_id in self.requeues
        )
        self.requeues = []
        return Decisions(tuple(priorities), placements, requeues)

    def _written(self) -> dict[int, int]:
        """What the engine wrote to each job's priority strategy field (SiteFactor, Nice or Priority)."""
        key = self.strategy_field
        return {job_id: int(raw[key]) for job_id, raw in self.raw.items() if key in raw}

    def _advance(self) -> None:
        """Hand the simulator what the engine wrote for the last instant, and step it to the next
        policy cycle (the instant the engine looks at next) or to the end of the trace."""
        simulator = self.simulator
        try:
            if self.snapshot is not None:
                simulator.decide(self._decisions(self.snapshot), self._written())
            simulator.run()
        except DikeError as exc:
            self.error = exc
        awaiting = simulator.awaiting
        self.snapshot = awaiting.snapshot if awaiting is not None and self.error is None else None
        self.ended = self.snapshot is None

    # ---------------------------------------------------------------- reads

    def keep_reads_in(self, memory: ReadMemory) -> None:
        self.kept = memory

    def read_cluster(self) -> ClusterState:
        self.calls += 1
        if not self.ended:
            self._advance()
        if self.ended:
            if self.error is not None:
                raise DikeError(f"the simulation failed: {self.error}") from self.error
            last = max((r.end for r in self.records if r.end is not None), default=0.0)
            return ClusterState(last, (), self.cluster.nodes, self.cluster.topology)
        snapshot = self.snapshot
        assert snapshot is not None
        served: dict[int, Job] = {}
        last_served, self.kept.jobs = self.kept.jobs, served
        for job in snapshot.jobs:
            shown = replace(
                job,
                true_duration_s=None,  # Slurm does not know it
                priority=self.raw.get(job.job_id, {}).get(JobField.PRIORITY),
                nice=int(self.raw.get(job.job_id, {}).get(JobField.NICE, 0)),
            )
            last = last_served.get(job.job_id)
            # an unchanged job is last read's Job, as the lean read hands it out (Engine keeps
            # its work for such jobs)
            served[job.job_id] = last if last == shown else shown
        jobs = tuple(served.values())
        pending = [j.job_id for j in jobs if j.state is JobState.PENDING]
        return ClusterState(
            time=snapshot.time,
            jobs=jobs,
            nodes=snapshot.nodes,
            topology=snapshot.topology,
            site_factors=MappingProxyType({
                j: int(self.raw[j][JobField.SITE_FACTOR]) for j in pending if JobField.SITE_FACTOR in self.raw.get(j, {})
            }),
            admin_comments=MappingProxyType({
                j.job_id: str(self.raw.get(j.job_id, {}).get(JobField.ADMIN_COMMENT, "")) for j in jobs
            }),
        )

    def accounting(self, start: float, end: float) -> ReadResult:
        self.calls += 1
        chosen = tuple(r for r in self.records if r.end is not None and start <= r.end <= end)
        return ReadResult(chosen, len(chosen), {}, "simulation")

    def _record(self, job_id: int, user: str, gpus: int, start: float, end: float, state: JobState,
                gpu_types: tuple[str, ...]) -> None:
        """One run as sacct shows it: its partition and the GPU types it held (AllocTRES), which
        the engine weighs by the site's TRESBillingWeights."""
        self.records.append(AccountingRecord(
            job_id=job_id, display_id=str(job_id), user=user, account=self.accounts.get(job_id, ""), state=state,
            state_text=state.value, submit=start, start=start, end=end, elapsed_s=int(end - start), gpus=gpus,
            name=self.names.get(job_id, ""), partition=self.partitions.get(job_id, ""), alloc_gpu_types=gpu_types,
        ))

    def _finished(self, result: JobResult) -> None:
        """The simulator's finish callback."""
        self.collector(result)
        earlier_runs_gpu_s = self.recorded_gpu_s.pop(result.job_id, 0.0)  # a finished job is not requeued again
        last_run_s = (result.gpu_seconds - earlier_runs_gpu_s) / max(result.gpus, 1)
        self._record(result.job_id, result.user, result.gpus, result.end - last_run_s, result.end,
                     self.final_states.get(result.job_id, JobState.COMPLETED), result.gpu_types)
        self.raw.pop(result.job_id, None)
        self.placements.pop(result.job_id, None)

    # ---------------------------------------------------------------- writes

    def _job(self, job_id: int):
        if self.snapshot is None:
            return None
        return next((j for j in self.snapshot.jobs if j.job_id == job_id), None)

    def describe(self, update: JobUpdate) -> str:
        fields = " ".join(f"{k.value}={v!r}" for k, v in update.values)
        return f"simulated update JobId={update.job_id} {fields}"

    def apply(self, update: JobUpdate) -> WriteOutcome:
        self.calls += 1
        text = self.describe(update)
        job = self._job(update.job_id)
        if job is None:
            return WriteOutcome(False, text, "Invalid job id specified", job_gone=True)
        if any(f.is_placement for f in update.fields) and job.state is not JobState.PENDING:
            return WriteOutcome(False, text, "Job is no longer pending execution", job_gone=True)
        raw = self.raw.setdefault(update.job_id, {})
        placement = self.placements.get(update.job_id, job.placement)
        for key, value in update.values:
            raw[key] = value
            if key.is_placement:
                placement = with_placement_field(placement, key, value)
        if any(f.is_placement for f in update.fields):
            if placement.is_empty:
                self.placements.pop(update.job_id, None)
            else:
                self.placements[update.job_id] = placement
        return WriteOutcome(True, text)

    def signal(self, job_id: int, signal: str) -> WriteOutcome:
        """Accepted and forgotten: the replay models checkpoints by interval, not by signal."""
        self.calls += 1
        text = f"simulated signal {job_id} {signal}"
        job = self._job(job_id)
        if job is None or job.state is not JobState.RUNNING:
            return WriteOutcome(False, text, "Job is not running", job_gone=True)
        return WriteOutcome(True, text)

    def requeue(self, job_id: int) -> WriteOutcome:
        self.calls += 1
        text = f"simulated requeue {job_id}"
        job = self._job(job_id)
        if job is None or job.state is not JobState.RUNNING or job.start_time is None or self.snapshot is None:
            return WriteOutcome(False, text, "Job is not running", job_gone=True)
        node_types = {node.name: node.gpu_types for node in self.snapshot.nodes}
        self._record(job_id, job.user, job.gpus, job.start_time, self.snapshot.time, JobState.REQUEUED,
                     run_gpu_types(job.nodes, node_types))
        self.recorded_gpu_s[job_id] = self.recorded_gpu_s.get(job_id, 0.0) + job.gpus * (self.snapshot.time - job.start_time)
        self.requeues.append(job_id)
        return WriteOutcome(True, text)
