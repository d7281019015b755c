"""`trace stats`: a quick look at a sacct dump before replaying it."""

from __future__ import annotations

from collections import Counter, defaultdict

from dike_slurm.domain.model import JobState
from dike_slurm.slurm.accounting import AccountingRecord, ReadResult
from dike_slurm.policies.common import quantile
from dike_slurm.sim.kernel.metrics import SIZE_BUCKETS, size_label

QUANTILES = (0.1, 0.5, 0.9, 0.99)
TOP_USERS = 10


def trace_stats(read: ReadResult, total_gpus: int | None = None) -> dict:
    """Jobs, GPU jobs, users, GPU-hours, size and duration distributions, skipped rows (JSON-able).

    With the cluster's `total_gpus`, also the offered load: GPU-hours over the GPU-hours of the
    submission window (first to last submit).
    """
    runs: dict[int, list[AccountingRecord]] = defaultdict(list)
    for record in read.records:
        runs[record.job_id].append(record)
    states: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    user_gpu_s: Counter[str] = Counter()
    durations: list[float] = []
    services: list[float] = []
    users: set[str] = set()
    accounts: set[str] = set()
    never_started = cpu_only = requeued = array_tasks = one_gpu = 0
    multi_node_gpu_s = 0.0
    first_submit, last_submit, last_end = _window(read.records)
    for job_runs in runs.values():
        last = job_runs[-1]
        states[last.state.value] += 1
        users.add(last.user)
        accounts.add(last.account)
        if last.array_job_id is not None:
            array_tasks += 1
        started = [r for r in job_runs if r.start is not None]
        if len(started) > 1 or any(r.state is JobState.REQUEUED for r in job_runs):
            requeued += 1  # several runs, or a REQUEUED state (pending again; a dump without --duplicates)
        if not started:
            never_started += 1
            continue
        gpus = started[-1].gpus
        if gpus <= 0:
            cpu_only += 1
            continue
        service = float(sum(r.gpus * r.elapsed_s for r in started))
        multi_node_gpu_s += sum(r.gpus * r.elapsed_s for r in started if r.num_nodes > 1)
        one_gpu += gpus == 1
        durations.append(float(sum(r.elapsed_s for r in started)))
        services.append(service)
        user_gpu_s[last.user] += service
        for low, high in SIZE_BUCKETS:
            if low <= gpus <= high:
                sizes[size_label(low, high)] += 1
                break
    durations.sort()
    services.sort()
    total_gpu_s = sum(services)
    submit_span_s = last_submit - first_submit if first_submit is not None and last_submit is not None else 0.0
    return {
        "source": read.source,
        "rows": read.rows,
        "records": len(read.records),
        "skipped_rows": dict(read.skipped),
        "jobs": len(runs),
        "gpu_jobs": len(services),
        "cpu_only_jobs": cpu_only,
        "never_started": never_started,
        "requeued_jobs": requeued,
        "array_tasks": array_tasks,
        "users": len(users),
        "accounts": len(accounts),
        "gpu_hours": round(total_gpu_s / 3600.0, 1),
        "span_days": round((last_end - first_submit) / 86400.0, 2) if first_submit is not None and last_end is not None else 0.0,
        "submit_span_days": round(submit_span_s / 86400.0, 2),
        "one_gpu_job_share": round(one_gpu / len(services), 3) if services else 0.0,
        "multi_node_gpu_hour_share": round(multi_node_gpu_s / total_gpu_s, 3) if total_gpu_s else 0.0,
        "offered_load": round(total_gpu_s / (total_gpus * submit_span_s), 3) if total_gpus and submit_span_s else None,
        "final_states": dict(states.most_common()),
        "gpus_per_job": {label: sizes[label] for label in (size_label(lo, hi) for lo, hi in SIZE_BUCKETS) if sizes[label]},
        "run_time_hours": _quantiles(durations, 3600.0),
        "gpu_hours_per_job": _quantiles(services, 3600.0),
        "top_users_by_gpu_hours": [
            {"user": user, "gpu_hours": round(gpu_s / 3600.0, 1), "share": round(gpu_s / total_gpu_s, 3) if total_gpu_s else 0.0}
            for user, gpu_s in sorted(user_gpu_s.items(), key=lambda item: (-item[1], item[0]))[:TOP_USERS]
        ],
    }


def _window(records: tuple[AccountingRecord, ...]) -> tuple[float | None, float | None, float | None]:
    """The first and last submit and the last end over every record (None: no record has one)."""
    submits = [r.submit for r in records if r.submit is not None]
    ends = [r.end for r in records if r.end is not None]
    return min(submits, default=None), max(submits, default=None), max(ends, default=None)


def _quantiles(sorted_values: list[float], unit: float) -> dict[str, float]:
    if not sorted_values:
        return {}
    values = {f"p{round(q * 100)}": round(quantile(sorted_values, q) / unit, 3) for q in QUANTILES}
    values["max"] = round(sorted_values[-1] / unit, 3)
    values["mean"] = round(sum(sorted_values) / len(sorted_values) / unit, 3)
    return values
