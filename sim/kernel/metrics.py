"""Per-policy metrics from the finished jobs of a replay (docs/replay.md defines each)."""

from __future__ import annotations

import csv
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TextIO

import numpy as np

from dike_slurm.parsing.durations import format_timestamp
from dike_slurm.sim.kernel.records import JobResult, SimStats, Timeline

# The metric keys of summary.json, in order (the issue fixes the first thirteen).
METRIC_KEYS = (
    "jobs",
    "avg_jct_s",
    "p50_jct_s",
    "p95_jct_s",
    "p99_jct_s",
    "avg_wait_s",
    "makespan_s",
    "gpu_utilization",
    "avg_slowdown",
    "user_jain_index",
    "worst_user_slowdown",
    "preemptions",
    "heavy_consolidated_fraction",
    "p95_slowdown",
    "heavy_jobs",
    "avg_jct_heavy_s",
    "avg_jct_light_s",
    "worst_user",
    "preemption_lost_gpu_h",
    "lost_gpu_fraction",
    "max_preemptions_per_job",
    "p99_preemptions_per_job",
    "wasted_preemptions",
    "landed_preemptions",
    "useful_gpu_h",
    "slowed_gpu_h",
    "max_wait_s",
)

JOB_CSV_COLUMNS = (
    "job_id", "user", "gpus", "submit", "start", "end", "wait_s", "jct_s", "run_s", "slowdown",
    "level", "leaves", "preemptions", "heavy", "lost_gpu_s",
)

# GPU-count buckets of the "wait by job size" plot.
SIZE_BUCKETS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 10**9))


def size_label(low: int, high: int) -> str:
    if low == high:
        return str(low)
    if high >= 10**9:
        return f"{low}+"
    return f"{low}-{high}"


@dataclass
class MetricsCollector:
    """Takes every JobResult of one replay: keeps compact columns, writes the CSV row."""

    csv_file: TextIO | None = None
    jct: array = field(default_factory=lambda: array("d"))
    wait: array = field(default_factory=lambda: array("d"))
    slowdown: array = field(default_factory=lambda: array("d"))
    gpus: array = field(default_factory=lambda: array("l"))
    user_index: array = field(default_factory=lambda: array("l"))
    heavy: array = field(default_factory=lambda: array("b"))
    consolidated: array = field(default_factory=lambda: array("b"))
    end: array = field(default_factory=lambda: array("d"))  # in finish order
    service_gpu_s: array = field(default_factory=lambda: array("d"))  # the GPU service a finished job leaves in the history
    users: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    preemptions_per_job: array = field(default_factory=lambda: array("l"))
    gpu_seconds: float = 0.0
    lost_gpu_s: float = 0.0
    useful_gpu_s: float = 0.0  # each job's work once, at full speed: GPUs x its run time alone and consolidated
    _writer: object | None = None

    def __post_init__(self) -> None:
        if self.csv_file is not None:
            self._writer = csv.writer(self.csv_file, lineterminator="\n")
            self._writer.writerow(JOB_CSV_COLUMNS)

    def __call__(self, result: JobResult) -> None:
        slowdown = result.jct_s / result.duration_s if result.duration_s > 0 else 1.0
        self.jct.append(result.jct_s)
        self.wait.append(result.wait_s)
        self.slowdown.append(slowdown)
        self.gpus.append(result.gpus)
        self.user_index.append(self.users.setdefault(result.user, len(self.users)))
        self.heavy.append(result.heavy)
        self.consolidated.append(result.consolidated)
        self.end.append(result.end)
        self.service_gpu_s.append(result.gpu_seconds)
        self.preemptions += result.preemptions
        self.preemptions_per_job.append(result.preemptions)
        self.gpu_seconds += result.gpu_seconds
        self.lost_gpu_s += result.lost_gpu_s
        self.useful_gpu_s += result.gpus * result.duration_s
        if self._writer is not None:
            self._writer.writerow(
                (
                    result.display_id, result.user, result.gpus, format_timestamp(result.submit),
                    format_timestamp(result.start), format_timestamp(result.end), _num(result.wait_s),
                    _num(result.jct_s), _num(result.duration_s), f"{slowdown:.4f}", result.level, result.leaves,
                    result.preemptions, int(result.heavy), _num(result.lost_gpu_s),
                )
            )


def _num(value: float) -> str:
    """Seconds with at most three decimals, no trailing zeros (stable across platforms)."""
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _round(value: float, digits: int = 3) -> float:
    return float(round(float(value), digits))


@dataclass(frozen=True)
class PolicyMetrics:
    """Everything the report needs about one policy's replay."""

    summary: dict
    jct_sorted: np.ndarray
    wait_by_size: dict[str, float]
    user_slowdown: dict[str, float]
    utilization_series: list[float]
    level_series: dict[int, list[float]]
    bin_width_s: float
    origin: float
    # Per time bin, the policy cycles that ran in it (0: none; the level series is NaN there).
    cycles_per_bin: list[int] = field(default_factory=list)
    # The finished jobs in finish order: when each ended and its GPU service (what the simulator
    # hands a policy as `completed_service_gpu_s`), for the thresholds a history-derived policy used.
    finished_end: np.ndarray = field(default_factory=lambda: np.zeros(0))
    finished_service_gpu_s: np.ndarray = field(default_factory=lambda: np.zeros(0))


def summarise(collector: MetricsCollector, stats: SimStats, timeline: Timeline, total_gpus: int) -> PolicyMetrics:
    """The metrics of one replay; slowdown = JCT / the job's run time alone and consolidated."""
    jct = np.frombuffer(collector.jct, dtype=np.float64) if len(collector.jct) else np.zeros(0)
    wait = np.frombuffer(collector.wait, dtype=np.float64) if len(collector.wait) else np.zeros(0)
    slowdown = np.frombuffer(collector.slowdown, dtype=np.float64) if len(collector.slowdown) else np.zeros(0)
    gpus = np.array(collector.gpus, dtype=np.int64)
    users = np.array(collector.user_index, dtype=np.int64)
    heavy = np.array(collector.heavy, dtype=bool)
    consolidated = np.array(collector.consolidated, dtype=bool)
    count = len(jct)
    makespan = (stats.last_end - stats.first_submit) if count else 0.0
    per_user = _user_slowdown(list(collector.users), users, slowdown) if count else {}
    user_values = np.array(list(per_user.values())) if per_user else np.zeros(0)
    jain = float(user_values.sum() ** 2 / (len(user_values) * (user_values**2).sum())) if len(user_values) else 1.0
    worst_user = max(sorted(per_user), key=lambda u: per_user[u]) if per_user else ""
    heavy_count = int(heavy.sum())
    summary = {
        "jobs": count,
        "avg_jct_s": _round(jct.mean()) if count else 0.0,
        "p50_jct_s": _round(np.percentile(jct, 50)) if count else 0.0,
        "p95_jct_s": _round(np.percentile(jct, 95)) if count else 0.0,
        "p99_jct_s": _round(np.percentile(jct, 99)) if count else 0.0,
        "avg_wait_s": _round(wait.mean()) if count else 0.0,
        "makespan_s": _round(makespan),
        # Useful work only: rework after a requeue and the slow-down of spread jobs keep GPUs busy
        # without finishing anything sooner (they are useful_gpu_h's neighbours below).
        "gpu_utilization": _round(collector.useful_gpu_s / (total_gpus * makespan), 4) if makespan > 0 else 0.0,
        "avg_slowdown": _round(slowdown.mean(), 4) if count else 0.0,
        "user_jain_index": _round(jain, 4),
        "worst_user_slowdown": _round(per_user[worst_user], 4) if worst_user else 0.0,
        "preemptions": collector.preemptions,
        "heavy_consolidated_fraction": _round(consolidated[heavy].mean(), 4) if heavy_count else 1.0,
        "p95_slowdown": _round(np.percentile(slowdown, 95), 4) if count else 0.0,
        "heavy_jobs": heavy_count,
        "avg_jct_heavy_s": _round(jct[heavy].mean()) if heavy_count else 0.0,
        "avg_jct_light_s": _round(jct[~heavy].mean()) if count - heavy_count else 0.0,
        "worst_user": worst_user,
        "preemption_lost_gpu_h": _round(collector.lost_gpu_s / 3600.0),
        "lost_gpu_fraction": _round(collector.lost_gpu_s / collector.gpu_seconds, 4) if collector.gpu_seconds else 0.0,
        "max_preemptions_per_job": max(collector.preemptions_per_job, default=0),
        "p99_preemptions_per_job": (
            _round(np.percentile(np.array(collector.preemptions_per_job), 99), 2) if count else 0.0
        ),
        "wasted_preemptions": stats.wasted_preemptions,
        "landed_preemptions": stats.landed_preemptions,
        "useful_gpu_h": _round(collector.useful_gpu_s / 3600.0),
        # busy GPU-hours that were neither useful nor lost: the communication slow-down (and each
        # run's launch and exit, replay.run_overhead_s)
        "slowed_gpu_h": _round(max(0.0, collector.gpu_seconds - collector.useful_gpu_s - collector.lost_gpu_s) / 3600.0),
        # the longest any job waited (all its pending spells): what a starving job sees
        "max_wait_s": _round(wait.max()) if count else 0.0,
    }
    return PolicyMetrics(
        summary=summary,
        jct_sorted=np.sort(jct),
        wait_by_size=_wait_by_size(gpus, wait),
        user_slowdown=per_user,
        utilization_series=[busy / (total_gpus * timeline.width) for busy in timeline.busy_gpu_s],
        level_series=_level_series(timeline),
        bin_width_s=timeline.width,
        origin=timeline.origin,
        cycles_per_bin=list(timeline.level_samples),
        finished_end=np.array(collector.end, dtype=np.float64),
        finished_service_gpu_s=np.array(collector.service_gpu_s, dtype=np.float64),
    )


def _user_slowdown(names: list[str], users: np.ndarray, slowdown: np.ndarray) -> dict[str, float]:
    """Each user's mean slowdown over their jobs (users with none left out)."""
    per_user: dict[str, float] = {}
    sums = np.bincount(users, weights=slowdown, minlength=len(names))
    jobs_per_user = np.bincount(users, minlength=len(names))
    for index, name in enumerate(names):
        if jobs_per_user[index]:
            per_user[name] = float(sums[index] / jobs_per_user[index])
    return per_user


def _wait_by_size(gpus: np.ndarray, wait: np.ndarray) -> dict[str, float]:
    """The mean wait per job-size bucket (buckets without a job left out)."""
    wait_by_size = {}
    for low, high in SIZE_BUCKETS:
        chosen = (gpus >= low) & (gpus <= high)
        if chosen.any():
            wait_by_size[size_label(low, high)] = float(wait[chosen].mean())
    return wait_by_size


def _level_series(timeline: Timeline) -> dict[int, list[float]]:
    """Per queue level, its mean job count per cycle in each time bin (NaN in a bin without a cycle)."""
    levels = sorted({level for sums in timeline.level_sums for level in sums})
    return {
        level: [
            (timeline.level_sums[i][level] / timeline.level_samples[i]) if timeline.level_samples[i] else float("nan")
            for i in range(len(timeline.busy_gpu_s))
        ]
        for level in levels
    }


def comparison_rows(metrics: Iterable[tuple[str, dict]]) -> list[list[str]]:
    """The comparison table (policy per row) as text cells, shared by terminal and HTML."""
    rows = []
    for name, summary in metrics:
        rows.append(
            [
                name,
                str(summary["jobs"]),
                _hours(summary["avg_jct_s"]),
                _hours(summary["p50_jct_s"]),
                _hours(summary["p95_jct_s"]),
                _hours(summary["p99_jct_s"]),
                _hours(summary["avg_wait_s"]),
                _hours(summary["max_wait_s"]),
                _hours(summary["makespan_s"]),
                f"{summary['gpu_utilization']:.1%}",
                f"{summary['avg_slowdown']:.2f}",
                f"{summary['user_jain_index']:.3f}",
                f"{summary['worst_user_slowdown']:.2f}",
                str(summary["preemptions"]),
                f"{summary['heavy_consolidated_fraction']:.1%}",
            ]
        )
    return rows


COMPARISON_HEADERS = (
    "policy", "jobs", "avg JCT (h)", "p50 JCT (h)", "p95 JCT (h)", "p99 JCT (h)", "avg wait (h)",
    "longest wait (h)", "makespan (h)", "useful GPU util", "avg slowdown", "user Jain", "worst user slowdown", "preemptions",
    "heavy consolidated",
)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"
