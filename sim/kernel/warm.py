"""A replay's warm start: the jobs of an earlier dump that ended by the window's first submission,
as the live engine's accounting holds them on the window's first day.

They seed what the live engine reads from accounting: the finished jobs' GPU service (Dike's
derived thresholds), the service prior learned from them, and the decayed usage behind fair share
(Dike's, and Slurm's own in the replayed multifactor order). They are never replayed, and nothing
later than the window's first submission is read from them: no lookahead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from dike_slurm.errors import InputError
from dike_slurm.slurm.accounting import AccountingRecord
from dike_slurm.slurm.accounting_json import read_sacct_file
from dike_slurm.slurm.slurm_conf import ClusterConf
from dike_slurm.sim.kernel.trace import TraceBuild, TraceJob, build_trace

ENDED_AFTER = "had not ended by the window's first submission"
IN_WINDOW = "in the window's dump too"


@dataclass(frozen=True)
class PastRun:
    """One run of a past job: when it held its GPUs, and the GPU types it held (what Slurm bills)."""

    start: float
    end: float
    gpu_types: tuple[str, ...] = ()


@dataclass(frozen=True)
class PastJob:
    """A job that finished before the window: what the replay would have made of it, and its runs."""

    trace: TraceJob
    runs: tuple[PastRun, ...]

    @property
    def end(self) -> float:
        return self.runs[-1].end


@dataclass(frozen=True)
class History:
    """The warm start of one window: its past jobs in end order, and what was left out and why."""

    dump: Path
    window_start: float
    jobs: tuple[PastJob, ...]
    left_out: dict[str, int] = field(default_factory=dict)

    def summary(self) -> dict:
        """The `history` section of summary.json."""
        return {
            "dump": self.dump.name,
            "window_start": self.window_start,
            "jobs_seeded": len(self.jobs),
            "first_end": self.jobs[0].end if self.jobs else None,
            "last_end": self.jobs[-1].end if self.jobs else None,
            "jobs_left_out": dict(self.left_out),
        }


def read_history(dump: Path, conf: ClusterConf, window: TraceBuild) -> History:
    """The past jobs of `dump` for the window `window` (a built trace): the GPU jobs of the
    cluster whose every run ended by the window's first submission, in end order. Jobs the window
    replays (the same job id), jobs still running then, and whatever the trace would not replay
    (CPU-only, never started, too large) are left out, each counted by reason."""
    if not window.jobs:
        raise InputError("the window has no job to replay, so it has no start to cut a history at", source=str(dump))
    read = read_sacct_file(dump)
    built = build_trace(read.records, conf)
    window_start = window.jobs[0].submit
    replayed = {job.job_id for job in window.jobs}
    runs: dict[int, list[AccountingRecord]] = {}
    for record in read.records:
        if record.start is not None:
            runs.setdefault(record.job_id, []).append(record)
    left_out: Counter[str] = Counter(read.skipped)
    left_out.update(built.excluded)
    jobs: list[PastJob] = []
    for trace in built.jobs:
        if trace.job_id in replayed:
            left_out[IN_WINDOW] += 1
            continue
        records = sorted(runs.get(trace.job_id, ()), key=lambda r: (r.start or 0.0, r.end or 0.0))
        if not records or any(r.end is None or r.end > window_start for r in records):
            left_out[ENDED_AFTER] += 1
            continue
        jobs.append(PastJob(trace, tuple(
            PastRun(r.start, r.end, r.alloc_gpu_types) for r in records  # type: ignore[arg-type]
        )))
    jobs.sort(key=lambda job: (job.end, job.trace.job_id))
    return History(dump, window_start, tuple(jobs), dict(sorted(left_out.items())))


def start_sentence(history: dict | None) -> str:
    """How the replay started, for the console and the report, from summary.json's `history`."""
    if history is None:
        return ("Cold start: no --history, so the service prior and the fair-share usage start empty, as on a new "
                "cluster; the live engine would know the jobs its accounting holds (replay with --history "
                "EARLIER_DUMP, docs/replay.md).")
    seeded = history["jobs_seeded"]
    left = ", ".join(f"{reason}: {count}" for reason, count in history["jobs_left_out"].items())
    if seeded:
        span = (history["window_start"] - history["first_end"]) / 86400.0
        told = (f"Warm start: {seeded} jobs of {history['dump']}, ended within the {span:.1f} days before the "
                f"window's first submission, seed the service prior and the fair-share usage")
    else:
        told = f"Warm start asked, but no job of {history['dump']} had ended by the window's first submission"
    return f"{told}{f' (left out: {left})' if left else ''}."
