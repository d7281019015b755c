"""A cycle's figures as a Prometheus textfile (node_exporter's textfile collector).

Labels are bounded: queue levels, partitions, phases, outcomes, quantiles; never a job id or a
user. `MetricsWatch` is what the writer keeps between cycles of one process (counters, failures,
how long writes have been held back); each meaning is in docs/engine.md, "Metrics".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dike_slurm.domain.freed_rooms import GONE, LANDED, WASTED, requeues_by_outcome
from dike_slurm.domain.fields import JobField
from dike_slurm.domain.model import EXEMPT_KINDS, JobState

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Gauge

    from dike_slurm.cycle.apply import CycleReport
    from dike_slurm.cycle.plan import CyclePlan

PREFIX = "dike_slurm_"
PHASES = ("read", "decide", "diff", "write")
WAIT_QUANTILES = (0.5, 0.95)
PRIOR_QUANTILES = (0.5, 0.9)


@dataclass
class MetricsWatch:
    """What the metrics keep from one cycle to the next, in this process: the counters (they start
    at 0 when the process starts, as Prometheus counters may), failed cycles, the last report, and
    since when each job has had a write held back, cycle after cycle."""

    report: CycleReport | None = None
    cycles: int = 0
    failures: int = 0
    failures_in_a_row: int = 0
    last_failure_at: float = 0.0  # epoch seconds; 0: none since the process started
    requeues: int = 0
    signals: int = 0
    write_errors: int = 0
    gpu_hours_lost: float = 0.0
    left_alone: int = 0
    held_since: dict[int, float] = field(default_factory=dict)  # job id -> cycle time its write was first held

    def cycled(self, report: CycleReport) -> None:
        """An applied cycle ran (paused, tripped or writing)."""
        self.report = report
        self.cycles += 1
        self.failures_in_a_row = 0
        self.requeues += sum(1 for _, outcome in report.requeued if outcome.ok)
        self.signals += report.signals
        self.write_errors += report.errors
        self.gpu_hours_lost += requeue_gpu_hours_lost(report)
        self.left_alone += report.left_alone
        held = held_job_ids(report)
        now = report.plan.time
        self.held_since = {job_id: self.held_since.get(job_id, now) for job_id in held}

    def failed(self, now: float) -> None:
        """A cycle failed (Slurm unreachable, the state store unwritable, a bad site setting)."""
        self.failures += 1
        self.failures_in_a_row += 1
        self.last_failure_at = now

    def oldest_held_s(self) -> float:
        """Seconds since the first of the consecutive cycles that held back the longest-waiting write; 0: none."""
        if self.report is None or not self.held_since:
            return 0.0
        return max(0.0, self.report.plan.time - min(self.held_since.values()))


def held_job_ids(report: CycleReport) -> set[int]:
    """The jobs whose planned write waits for a later cycle: the write budget's tail, and what
    max_changes_per_cycle or the mass-rewrite breaker held back."""
    attempted = len(report.outcomes)
    budget_tail = report.plan.writes[attempted:attempted + report.budget_held]
    return {w.job_id for w in budget_tail} | {w.job_id for w in report.plan.held_back}


def requeue_gpu_hours_lost(report: CycleReport) -> float:
    """GPU-hours of the current runs of the jobs requeued this cycle: what they lose if they
    checkpoint never (an upper bound; the engine cannot see checkpoints)."""
    lost = 0.0
    now = report.plan.time
    for requeue, outcome in report.requeued:
        job_plan = report.plan.job(requeue.job_id)
        if outcome.ok and job_plan is not None and job_plan.job.start_time is not None:
            lost += job_plan.job.gpus * max(0.0, now - job_plan.job.start_time) / 3600.0
    return lost


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank quantile of sorted `values` (not empty)."""
    return values[max(0, math.ceil(q * len(values)) - 1)]


def _label(value: float) -> str:
    return f"{value:g}"


# (name, help, labels) of every gauge, in the textfile's order
GAUGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("cycle_failures_in_a_row", "failed cycles since the last one that ran", ()),
    ("last_failure_timestamp_seconds", "when the last cycle failed (0: none since the process started)", ()),
    ("cycle_seconds", "wall time of the last cycle", ()),
    ("cycle_timestamp_seconds", "when the last cycle that ran read the cluster", ()),
    ("slurm_calls", "Slurm calls in the last cycle", ()),
    ("changes_written", "job updates written in the last cycle", ()),
    ("errors", "failed writes, requeues and signals in the last cycle", ()),
    ("applied", "1: the last cycle ran with --apply (a dry run writes no textfile)", ()),
    ("paused", "1: an operator paused the writes (dike-slurm pause)", ()),
    ("breaker_latched", "1: the circuit breaker is latched (dike-slurm breaker reset)", ()),
    ("policy_info", "the policy and priority strategy of the last cycle (value 1)", ("policy", "strategy")),
    ("writes_planned", "job updates the last cycle planned (held back ones included)", ()),
    ("writes_held_back", "planned job updates left for a later cycle, by why", ("reason",)),
    ("writes_skipped", "planned job updates not attempted: paused, breaker, deadline, missing rights", ()),
    ("oldest_held_write_age_seconds", "how long the longest-waiting held-back write has waited, "
     "over consecutive cycles of this process (0: none)", ()),
    ("head_window_jobs", "pending jobs per partition the engine orders (0: every one)", ()),
    ("pending_jobs_beyond_head_window", "managed pending jobs beyond the head window: Slurm's own "
     "factors order them, the engine writes them nothing new", ()),
    ("cycle_phase_seconds", "wall time of each phase of the last cycle", ("phase",)),
    ("requeues_last_cycle", "jobs requeued by the last cycle", ()),
    ("grace_signals_last_cycle", "grace signals sent by the last cycle", ()),
    ("requeue_gpu_hours_lost_last_cycle", "GPU-hours of the current runs of the jobs the last cycle "
     "requeued (an upper bound)", ()),
    ("preemptions", "requeues settled in the last cycle: landed (the job they were for started "
     "on the freed nodes), wasted, gone", ("outcome",)),
    ("preemptions_total", "requeues settled since the state file was made", ("outcome",)),
    ("jobs", "managed active jobs per queue level", ("level",)),
    ("jobs_exempt", "active jobs in scope the engine never writes, by why: the site lists their qos, partition or "
     "account, the admin tag is in their admin_comment, or the user's tag in their comment", ("reason",)),
    ("jobs_left_alone", "managed active jobs with a field the engine leaves to someone else: site (a SiteFactor "
     "set outside the engine), user (a constraint or Nice the user changed)", ("reason",)),
    ("pending_jobs", "managed pending jobs per queue level and partition (a job of several "
     "partitions counts in each)", ("level", "partition")),
    ("pending_wait_seconds", "wait of the managed pending jobs per level since their submit or last "
     "requeue: nearest-rank quantiles", ("level", "quantile")),
    ("prior_jobs_judged", "jobs finished since the last cycle whose service the prior had predicted", ()),
    ("prior_ratio", "attained / predicted GPU service of those jobs: quantiles (1: exact)", ("quantile",)),
    ("prior_error_factor", "how many times off the prior was for those jobs, either way: "
     "quantiles (1: exact)", ("quantile",)),
)


def _counters(watch: MetricsWatch) -> tuple[tuple[str, str, float], ...]:
    """(name, help, value) of every counter, in the textfile's order."""
    return (
        ("cycles", "applied cycles since the engine process started", watch.cycles),
        ("cycle_failures", "failed cycles since the engine process started", watch.failures),
        ("requeues", "jobs requeued by a preemption since the engine process started", watch.requeues),
        ("grace_signals", "grace signals sent before a requeue since the engine process started", watch.signals),
        ("write_errors", "failed writes, requeues and signals since the engine process started",
         watch.write_errors),
        ("requeue_gpu_hours_lost", "GPU-hours of the current runs of the jobs requeued since the process "
         "started (an upper bound: as if none checkpointed)", watch.gpu_hours_lost),
        ("left_alone", "jobs found with a field someone else set (audited left-alone) since the engine process "
         "started", watch.left_alone),
    )


def registry_of(watch: MetricsWatch) -> CollectorRegistry:
    """Every metric the engine exports, filled from the watch; a family with nothing to say (no
    cycle yet, no pending job) has no samples but is still declared."""
    from prometheus_client import CollectorRegistry, Gauge  # only when metrics are written
    from prometheus_client.core import CounterMetricFamily

    registry = CollectorRegistry()
    # counters as families rather than Counters: no `_created` series beside each; a sample is NAME_total
    registry.register(_Families([CounterMetricFamily(PREFIX + name, doc, value=value)
                                 for name, doc, value in _counters(watch)]))
    gauges = {name: Gauge(PREFIX + name, doc, list(labels), registry=registry) for name, doc, labels in GAUGES}
    gauges["cycle_failures_in_a_row"].set(watch.failures_in_a_row)
    gauges["last_failure_timestamp_seconds"].set(watch.last_failure_at)
    gauges["oldest_held_write_age_seconds"].set(watch.oldest_held_s())
    if watch.report is not None:
        _set_cycle(gauges, watch.report)
        _set_jobs(gauges, watch.report.plan)
        _set_prior(gauges, watch.report.plan)
    return registry


def _set_cycle(gauges: dict[str, Gauge], report: CycleReport) -> None:
    """The last cycle's figures: its time, calls, writes, phases and preemptions."""
    plan = report.plan
    gauges["cycle_seconds"].set(report.seconds)
    gauges["cycle_timestamp_seconds"].set(plan.time)
    gauges["slurm_calls"].set(report.slurm_calls)
    gauges["changes_written"].set(sum(1 for _, outcome in report.outcomes if outcome.ok))
    gauges["errors"].set(report.errors)
    gauges["applied"].set(int(report.applied))
    gauges["paused"].set(int(report.paused))
    gauges["breaker_latched"].set(int(report.breaker_latched))
    gauges["policy_info"].labels(policy=plan.policy, strategy=plan.strategy).set(1)
    gauges["writes_planned"].set(len(plan.writes) + len(plan.held_back))
    held = gauges["writes_held_back"]
    held.labels(reason="write_budget").set(report.budget_held)
    held.labels(reason="max_changes").set(0 if plan.breaker else len(plan.held_back))
    held.labels(reason="breaker").set(len(plan.held_back) if plan.breaker else 0)
    gauges["writes_skipped"].set(max(0, len(plan.writes) - len(report.outcomes) - report.budget_held))
    gauges["head_window_jobs"].set(plan.window)
    for name in PHASES:
        seconds = report.write_seconds if name == "write" else plan.phase_seconds.get(name)
        if seconds is not None:
            gauges["cycle_phase_seconds"].labels(phase=name).set(seconds)
    gauges["requeues_last_cycle"].set(sum(1 for _, outcome in report.requeued if outcome.ok))
    gauges["grace_signals_last_cycle"].set(report.signals)
    gauges["requeue_gpu_hours_lost_last_cycle"].set(requeue_gpu_hours_lost(report))
    counts = requeues_by_outcome(plan.room_outcomes)
    for outcome in (LANDED, WASTED, GONE):
        gauges["preemptions"].labels(outcome=outcome).set(counts[outcome])
        gauges["preemptions_total"].labels(outcome=outcome).set(report.preemption_totals.get(outcome, 0))


def _set_jobs(gauges: dict[str, Gauge], plan: CyclePlan) -> None:
    """The managed jobs per level, the pending ones per level and partition, and their waits."""
    # one pass over the jobs (50,000 at a big site), partition lists split once per distinct list
    by_level: dict[int, int] = {}
    waits: dict[int, list[float]] = {}
    per_list: dict[tuple[int, str], int] = {}
    outside = 0
    exempt = dict.fromkeys(EXEMPT_KINDS, 0)
    left_to_site = left_to_user = 0
    site_factor = JobField.SITE_FACTOR
    now, pending_state = plan.time, JobState.PENDING
    for job_plan in plan.jobs:
        level = job_plan.level
        if not job_plan.managed or level is None:
            if job_plan.exempt:
                exempt[job_plan.exempt] += 1
            continue
        by_level[level] = by_level.get(level, 0) + 1
        if job_plan.hands_off:
            left_to_site += site_factor in job_plan.hands_off
            left_to_user += any(f is not site_factor for f in job_plan.hands_off)
        job = job_plan.job
        if job.state is pending_state:
            since = job.pending_since if job.pending_since is not None else job.submit_time
            waits.setdefault(level, []).append(max(0.0, now - since))  # Job.waiting_s, inlined
            key = (level, job.partition)
            per_list[key] = per_list.get(key, 0) + 1
            outside += job_plan.outside_window
    per_partition: dict[tuple[int, str], int] = {}
    for (level, partitions), count in per_list.items():
        for partition in {p for p in partitions.split(",") if p}:
            per_partition[level, partition] = per_partition.get((level, partition), 0) + count
    gauges["pending_jobs_beyond_head_window"].set(outside)
    for kind, count in exempt.items():
        gauges["jobs_exempt"].labels(reason=kind).set(count)
    gauges["jobs_left_alone"].labels(reason="site").set(left_to_site)
    gauges["jobs_left_alone"].labels(reason="user").set(left_to_user)
    for level in sorted(by_level):
        gauges["jobs"].labels(level=str(level)).set(by_level[level])
    for (level, partition), count in sorted(per_partition.items()):
        gauges["pending_jobs"].labels(level=str(level), partition=partition).set(count)
    for level, values in sorted(waits.items()):
        values.sort()
        for q in WAIT_QUANTILES:
            gauges["pending_wait_seconds"].labels(level=str(level), quantile=_label(q)).set(quantile(values, q))


def _set_prior(gauges: dict[str, Gauge], plan: CyclePlan) -> None:
    """How far off the service prior was for the jobs judged this cycle."""
    ratios = sorted(attained / predicted for predicted, attained in plan.prior_judged
                    if predicted > 0 and attained > 0)
    gauges["prior_jobs_judged"].set(len(ratios))
    if ratios:
        factors = sorted(max(r, 1.0 / r) for r in ratios)
        for q in PRIOR_QUANTILES:
            gauges["prior_ratio"].labels(quantile=_label(q)).set(quantile(ratios, q))
            gauges["prior_error_factor"].labels(quantile=_label(q)).set(quantile(factors, q))


class _Families:
    """A collector of ready-made metric families."""

    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> list:
        return self.families


def exported_names() -> frozenset[str]:
    """The name of every series the textfile can hold (a counter's with its `_total`)."""
    names = set()
    for family in registry_of(MetricsWatch()).collect():
        names.add(family.name + "_total" if family.type == "counter" else family.name)
    return frozenset(names)


def write_metrics(watch: MetricsWatch, path: Path) -> None:
    """Rewrite the textfile at `path` (atomically: node_exporter never reads half a file)."""
    from prometheus_client import write_to_textfile

    path.parent.mkdir(parents=True, exist_ok=True)
    write_to_textfile(str(path), registry_of(watch))
