"""The synthetic workload's model: the parameters of a heavy-tailed multi-tenant deep-learning
workload (who submits, what, when, and how it ends), each documented with the published statistics
behind its shape in ``docs/workload.md``. ``sim/tracegen/workload_sampler.py`` draws jobs from it and
``sim/tracegen/generate.py`` turns them into sacct records."""

from __future__ import annotations

from dataclasses import dataclass

DAY_S = 86400


@dataclass(frozen=True)
class WorkloadModel:
    """Parameters of a heavy-tailed multi-tenant deep-learning workload.

    Every field has a default; ``docs/workload.md`` explains each one and the
    published statistics its shape follows.  Probabilities are per job (an array
    task is a job) unless said otherwise.

    Users and accounts
        n_users: number of users submitting.
        user_zipf_s: user *i* (1-based) submits with weight ``1 / i**s``.
        accounts: ``(name, weight)``; each user belongs to one account.
        user_size_tilt_sigma: per-user preference for larger or smaller jobs:
            user weights for GPU count ``g`` are multiplied by ``g**tilt``,
            ``tilt ~ Normal(0, sigma)``.
        user_runtime_sigma: per-user run-time scale, ``LogNormal(0, sigma)``.
        user_typed_gpu_frac: fraction of users who request the GPU type
            (``--gres=gpu:a100:N``), so their ReqTRES carries ``gres/gpu:a100``.
        user_no_timelimit_frac: fraction of users who never pass ``--time``.

    Job shapes
        gpu_count_weights: ``(gpus, weight)`` for GPU jobs; sizes larger than the
            cluster, or multi-node sizes that are not a multiple of
            ``gpus_per_node``, are dropped and the rest renormalised.
        runtime_mixture: ``(weight, median_seconds, sigma)`` lognormal components
            of the intended run time of a 1-GPU job.
        runtime_size_exponent: a job with ``g`` GPUs has its run time multiplied
            by ``g**exponent`` (larger jobs run longer).
        min_runtime_s, max_runtime_s: clamp of the intended run time.
        cpu_only_frac: fraction of submissions that request no GPU.
        cpu_runtime_median_s, cpu_runtime_sigma: lognormal run time of CPU jobs.
        array_frac: fraction of GPU submissions that are job arrays
            (hyper-parameter sweeps); each task is a separate job.
        array_tasks: inclusive range of the number of tasks of an array.
        mem_per_gpu_mb: ``(MB, weight)`` memory requested per GPU (single node).

    Arrivals
        target_load: offered GPU load as a fraction of the cluster's GPUs;
            the mean arrival rate is ``target_load * total_gpus / E[GPU-seconds
            per submission]``, estimated by sampling the model itself.
        diurnal_amplitude: arrivals follow ``1 + A*cos(2*pi*(hour-peak)/24)``.
        diurnal_peak_hour: hour of the day with most submissions.
        weekend_factor: arrival-rate multiplier on Saturdays and Sundays.
        deferred_eligible_frac: jobs that become eligible later than submitted
            (``--begin`` or a dependency).

    User time limits
        timelimit_grid_min: the round values users type for ``--time``
            (minutes); an estimate is rounded up to the next one.
        timelimit_factor_median, timelimit_factor_sigma: the estimate is
            ``runtime * (1 + LogNormal(ln(median - 1), sigma))``.
        timelimit_underestimate_frac: jobs whose limit is below their run time
            (they end in ``TIMEOUT``).

    Outcomes
        cancel_before_start_frac: cancelled while pending (never started).
        cancel_running_frac: cancelled by the user while running.
        admin_cancel_frac: share of running cancellations done by root (uid 0).
        fail_frac: jobs that end ``FAILED`` (early failures are most common).
        node_fail_frac: jobs killed by a node failure (``NODE_FAIL``).
        requeue_frac: jobs requeued once after a partial run (two records).
        emit_requeue_duplicates: print every run of a requeued job, as
            ``sacct --duplicates`` does; ``False`` prints only the last run.

    Original schedule (synthetic, not a feasible schedule; replay ignores it)
        wait_zero_frac: jobs started at submit time (``Flags=SchedSubmit``).
        wait_median_s, wait_sigma: lognormal wait of the others, times
            ``sqrt(gpus)``.
        backfill_frac: share of the waiting jobs started by the backfill
            scheduler (``SchedBackfill``; the others ``SchedMain``).
        fragmented_placement_frac: multi-node jobs placed on scattered nodes
            instead of a contiguous block.

    Naming and ids
        hostile_name_frac: jobs given a hostile name (shell metacharacters,
            unicode, HTML, tabs) to exercise readers; the names are taken in
            turn from a fixed list so that a short trace still has each kind.
        first_job_id: the first JobIDRaw.
        qos: the QOS of every job.
    """

    # users and accounts
    n_users: int = 30
    user_zipf_s: float = 1.1
    accounts: tuple[tuple[str, float], ...] = (
        ("vision", 0.30), ("nlp", 0.30), ("speech", 0.10),
        ("rl", 0.10), ("systems", 0.08), ("genai", 0.12),
    )
    user_size_tilt_sigma: float = 0.3
    user_runtime_sigma: float = 0.4
    user_typed_gpu_frac: float = 0.3
    user_no_timelimit_frac: float = 0.15

    # job shapes
    gpu_count_weights: tuple[tuple[int, float], ...] = (
        (1, 0.62), (2, 0.11), (4, 0.11), (8, 0.10),
        (16, 0.03), (32, 0.013), (64, 0.006),
    )
    runtime_mixture: tuple[tuple[float, float, float], ...] = (
        (0.52, 600.0, 1.2),      # debugging, failed starts, short evals: ~10 min
        (0.38, 3600.0, 1.0),     # fine-tuning and medium training: ~1 h
        (0.10, 28800.0, 0.9),    # long training: ~8 h, multi-day tail
    )
    runtime_size_exponent: float = 0.2
    min_runtime_s: int = 30
    max_runtime_s: int = 10 * DAY_S
    cpu_only_frac: float = 0.08
    cpu_runtime_median_s: float = 900.0
    cpu_runtime_sigma: float = 1.3
    array_frac: float = 0.02
    array_tasks: tuple[int, int] = (2, 16)
    mem_per_gpu_mb: tuple[tuple[int, float], ...] = (
        (16384, 0.3), (32768, 0.5), (61440, 0.2),
    )

    # arrivals
    target_load: float = 1.0
    diurnal_amplitude: float = 0.5
    diurnal_peak_hour: float = 14.0
    weekend_factor: float = 0.6
    deferred_eligible_frac: float = 0.02

    # user time limits
    timelimit_grid_min: tuple[int, ...] = (
        10, 15, 30, 60, 90, 120, 180, 240, 360, 480, 720, 1080, 1440,
        2160, 2880, 4320, 5760, 7200, 10080, 14400, 20160,
    )
    timelimit_factor_median: float = 3.0
    timelimit_factor_sigma: float = 0.8
    timelimit_underestimate_frac: float = 0.05

    # outcomes
    cancel_before_start_frac: float = 0.05
    cancel_running_frac: float = 0.07
    admin_cancel_frac: float = 0.1
    fail_frac: float = 0.10
    node_fail_frac: float = 0.003
    requeue_frac: float = 0.01
    emit_requeue_duplicates: bool = True

    # original schedule (synthetic)
    wait_zero_frac: float = 0.3
    wait_median_s: float = 600.0
    wait_sigma: float = 1.6
    backfill_frac: float = 0.35
    fragmented_placement_frac: float = 0.25

    # naming and ids
    hostile_name_frac: float = 0.004
    first_job_id: int = 1001
    qos: str = "normal"

    def __post_init__(self) -> None:
        if self.n_users < 1:
            raise ValueError("WorkloadModel.n_users must be >= 1")
        if not self.target_load > 0:
            raise ValueError("WorkloadModel.target_load must be > 0")
        if not 0 <= self.diurnal_amplitude < 1:
            raise ValueError("WorkloadModel.diurnal_amplitude must be in [0, 1)")
        if not 0 < self.weekend_factor:
            raise ValueError("WorkloadModel.weekend_factor must be > 0")
        lo, hi = self.array_tasks
        if not 2 <= lo <= hi:
            raise ValueError("WorkloadModel.array_tasks must be (lo, hi), 2 <= lo <= hi")
        if self.timelimit_factor_median <= 1:
            raise ValueError("WorkloadModel.timelimit_factor_median must be > 1")
        outcome = (self.cancel_running_frac + self.fail_frac + self.node_fail_frac
                   + self.requeue_frac)
        if outcome >= 1:
            raise ValueError("WorkloadModel outcome fractions must add up to < 1")
        if not self.runtime_mixture or not self.gpu_count_weights:
            raise ValueError("WorkloadModel distributions must not be empty")
