"""A cycle's figures as a Prometheus textfile (node_exporter's textfile collector)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dike_slurm.freed_rooms import GONE, LANDED, WASTED, requeues_by_outcome

if TYPE_CHECKING:
    from dike_slurm.apply import CycleReport


def write_metrics(report: CycleReport, path: Path) -> None:
    """Rewrite the textfile at `path` with this cycle's figures."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile  # only when metrics are written

    registry = CollectorRegistry()
    Gauge("dike_slurm_cycle_seconds", "wall time of the last cycle", registry=registry).set(report.seconds)
    Gauge("dike_slurm_cycle_timestamp_seconds", "when the last cycle read the cluster", registry=registry).set(
        report.plan.time
    )
    Gauge("dike_slurm_slurm_calls", "Slurm calls in the last cycle", registry=registry).set(report.slurm_calls)
    Gauge("dike_slurm_changes_written", "job updates written in the last cycle", registry=registry).set(
        sum(1 for _, outcome in report.outcomes if outcome.ok)
    )
    Gauge("dike_slurm_errors", "failed writes in the last cycle", registry=registry).set(report.errors)
    Gauge("dike_slurm_applied", "1 if the last cycle wrote (--apply), 0 for a dry run", registry=registry).set(
        int(report.applied)
    )
    settled = Gauge("dike_slurm_preemptions", "requeues settled in the last cycle: landed (the job they were "
                    "for started on the freed nodes), wasted, gone", ["outcome"], registry=registry)
    totals = Gauge("dike_slurm_preemptions_total", "requeues settled since the state file was made",
                   ["outcome"], registry=registry)
    counts = requeues_by_outcome(report.plan.room_outcomes)
    for outcome in (LANDED, WASTED, GONE):
        settled.labels(outcome=outcome).set(counts[outcome])
        totals.labels(outcome=outcome).set(report.preemption_totals.get(outcome, 0))
    jobs = Gauge("dike_slurm_jobs", "managed active jobs per queue level", ["level"], registry=registry)
    for level in sorted({p.level for p in report.plan.jobs if p.managed and p.level is not None}):
        jobs.labels(level=str(level)).set(
            sum(1 for p in report.plan.jobs if p.managed and p.level == level)
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry)
