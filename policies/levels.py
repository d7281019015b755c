"""Queue levels from attained GPU service, and the starvation promotion back to level 0 (Dike's and
Tiresias' multi-level feedback queues)."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from dike_slurm.domain.model import Job, JobState


def level_of(service_gpu_s: float, thresholds_gpu_s: Sequence[float]) -> int:
    """Queue level: how many ascending thresholds the service has reached."""
    return bisect.bisect_right(list(thresholds_gpu_s), service_gpu_s)


def levels_with_promotion(
    job: Job, now: float, thresholds: list[float], promote_knob: float | None, max_wait_s: float | None,
    expected_gpu_s: float = 0.0,
) -> tuple[int, bool, str]:
    """(level, promoted, reason) for an active job: the level of its attained (or, when larger,
    expected) service unless it starves."""
    service = job.counted_gpu_s
    level = level_of(max(service, expected_gpu_s), thresholds)
    reason = f"attained={service / 3600:.2f}gpuh"
    if job.state is JobState.PENDING and level > 0:
        waited = job.waiting_s(now)
        if promote_knob is not None and job.last_run_s > 0 and waited >= promote_knob * job.last_run_s:
            return 0, True, f"{reason}; promoted: waited {waited:.0f}s >= {promote_knob:g} x last run {job.last_run_s:.0f}s"
        expected_run_s = expected_gpu_s / job.gpus if job.gpus > 0 else 0.0
        if (promote_knob is not None and job.last_run_s <= 0 and expected_run_s > 0
                and waited >= promote_knob * expected_run_s):
            return 0, True, f"{reason}; promoted: waited {waited:.0f}s >= {promote_knob:g} x expected run {expected_run_s:.0f}s"
        if max_wait_s is not None and waited >= max_wait_s:
            return 0, True, f"{reason}; promoted: waited {waited:.0f}s >= max_wait {max_wait_s:.0f}s"
    return level, False, reason


def promotion_time(job: Job, promote_knob: float | None, max_wait_s: float | None) -> float | None:
    """When levels_with_promotion promotes this pending job for waiting: `promote_knob` x its last
    run or `max_wait_s` after it began to wait, whichever comes first (None: never)."""
    since = job.pending_since if job.pending_since is not None else job.submit_time
    times = [since + promote_knob * job.last_run_s] if promote_knob is not None and job.last_run_s > 0 else []
    if max_wait_s is not None:
        times.append(since + max_wait_s)
    return min(times) if times else None
