"""Attained service and decayed usage: pure functions over job runs (no I/O, no clock)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from dike_slurm.domain.model import AscendingTuple, Job, JobState
from dike_slurm.domain.service_prior import FinishedJob, never_ran
from dike_slurm.slurm.accounting import AccountingRecord

if TYPE_CHECKING:
    from dike_slurm.domain.slurm_priority import SlurmPriorityModel

# States of a run that did not end the job: the job is back in the queue.
_NOT_FINAL = frozenset({JobState.REQUEUED, JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED})


@dataclass(frozen=True)
class Run:
    """One run of a job on its GPUs; `end` None while it still runs."""

    job_id: int
    user: str
    account: str
    gpus: int
    start: float
    end: float | None
    final: bool  # the job ended with this run (it was not requeued)
    name: str = ""  # the job's name (the service prior's groups)
    weight: float = 1.0  # what a GPU-second of this run is charged: the site's TRESBillingWeights for its GPU type
    state: JobState = JobState.COMPLETED  # how the run ended, as sacct says (RUNNING while it runs)

    def gpu_s(self, now: float) -> float:
        """Its GPU service: GPUs x seconds x the weight of its GPU type."""
        return self.gpus * self.weight * max(0.0, (self.end if self.end is not None else now) - self.start)


@dataclass(frozen=True)
class JobService:
    """What a job has received so far, over all its runs."""

    attained_gpu_s: float = 0.0
    run_count: int = 0
    last_run_s: float = 0.0
    last_end: float | None = None  # end of the latest finished run


def runs_from_records(records: Iterable[AccountingRecord], billing: SlurmPriorityModel | None = None) -> list[Run]:
    """Runs of the records that started; never-started rows carry no service. With the site's
    priority model, each run weighs its GPU type (AllocTRES) by the partition's TRESBillingWeights."""
    runs = []
    for record in records:
        if record.start is None:
            continue
        final = record.state not in _NOT_FINAL and record.end is not None
        weight = billing.gpu_weight(record.partition, record.alloc_gpu_types) if billing is not None else 1.0
        runs.append(Run(record.job_id, record.user, record.account, record.gpus, record.start, record.end, final,
                        record.name, weight, record.state))
    return runs


def current_runs(jobs: Iterable[Job], billing: SlurmPriorityModel | None = None,
                 node_types: Mapping[str, tuple[str, ...]] | None = None) -> list[Run]:
    """The run each running job is in now, from the queue (fresher than accounting); with the
    site's priority model and the nodes' GPU types, weighed as `runs_from_records` weighs them."""
    runs = []
    for j in jobs:
        if j.state is not JobState.RUNNING or j.start_time is None:
            continue
        weight = 1.0
        if billing is not None:
            weight = billing.gpu_weight(j.partition, run_gpu_types(j.nodes, node_types or {}))
        runs.append(Run(j.job_id, j.user, j.account, j.gpus, j.start_time, None, False, j.name, weight))
    return runs


def run_gpu_types(nodes: Iterable[str], node_types: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The GPU types of a run's nodes, in order, once each."""
    types: list[str] = []
    for node in nodes:
        for gpu_type in node_types.get(node, ()):
            if gpu_type not in types:
                types.append(gpu_type)
    return tuple(types)


def merge_runs(*sources: Iterable[Run]) -> list[Run]:
    """One run per (job, start); a later source wins (a finished run replaces the running one)."""
    merged: dict[tuple[int, float], Run] = {}
    for source in sources:
        for run in source:
            merged[(run.job_id, run.start)] = run
    return sorted(merged.values(), key=lambda r: (r.job_id, r.start))


def job_service(runs: Iterable[Run], now: float) -> dict[int, JobService]:
    """Attained GPU-seconds, runs and last run length per job."""
    by_job: dict[int, list[Run]] = {}
    for run in runs:
        by_job.setdefault(run.job_id, []).append(run)
    service = {}
    for job_id, job_runs in by_job.items():
        job_runs.sort(key=lambda r: r.start)
        finished = [r for r in job_runs if r.end is not None]
        last = job_runs[-1]
        service[job_id] = JobService(
            attained_gpu_s=sum(r.gpu_s(now) for r in job_runs),
            run_count=len(job_runs),
            last_run_s=max(0.0, (last.end if last.end is not None else now) - last.start),
            last_end=max((r.end for r in finished), default=None),  # type: ignore[type-var]
        )
    return service


def decayed_usage(
    runs: Iterable[Run],
    now: float,
    half_life_s: float,
    by: Literal["user", "account"] = "user",
) -> dict[str, float]:
    """GPU-seconds per owner, each second weighted by 2^(-age / half_life).

    A run on g GPUs from s to e contributes exactly g * H/ln2 * (2^-(now-e)/H - 2^-(now-s)/H).
    """
    scale = half_life_s / math.log(2)
    usage: dict[str, float] = {}
    for run in runs:
        end = min(run.end if run.end is not None else now, now)
        if end <= run.start or run.gpus <= 0:
            continue
        weight = 2.0 ** (-(now - end) / half_life_s) - 2.0 ** (-(now - run.start) / half_life_s)
        owner = run.account if by == "account" else run.user
        usage[owner] = usage.get(owner, 0.0) + run.gpus * run.weight * scale * weight
    return usage


def finished_totals(runs: Iterable[Run], now: float) -> dict[int, tuple[float, Run]]:
    """Every job whose last run ended it: its GPU service over all its runs, and that final run."""
    total: dict[int, float] = {}
    final: dict[int, Run] = {}
    for run in runs:
        total[run.job_id] = total.get(run.job_id, 0.0) + run.gpu_s(now)
        if run.final:
            final[run.job_id] = run
    return {job_id: (total[job_id], run) for job_id, run in final.items()}


def completed_service(runs: Iterable[Run], now: float) -> AscendingTuple:
    """Sorted total GPU service of every job whose last run ended it (for derived thresholds), as
    the snapshot holds it (sorted once here, not again by Snapshot)."""
    return AscendingTuple(sorted(service for service, _ in finished_totals(runs, now).values()))


def finished_jobs(runs: Iterable[Run], now: float) -> list[FinishedJob]:
    """Every job whose last run ended it, as the service prior learns from it: its GPU service over
    all its runs, per GPU of its final run; one that never really ran is for its user's groups only
    (service_prior.never_ran)."""
    return [
        FinishedJob(run.user, run.name, run.gpus, service / run.gpus, run.end,  # type: ignore[arg-type]
                    never_ran(run.state.value, service / run.gpus))
        for service, run in finished_totals(runs, now).values()
        if run.gpus > 0
    ]
