"""Synthetic deep-learning workload generator: who submits what, when, and how it ends.

Installed as ``dike_slurm.sim.tracegen``.  :func:`generate_jobs` samples the job
history of a multi-tenant GPU cluster (:class:`WorkloadModel`, documented with the
published statistics behind each shape in ``docs/workload.md``) on a
:class:`~dike_slurm.sim.synthetic_cluster.ClusterSpec`; :func:`generate_sample`
writes it with ``sim/sacct_writer.py`` (``sacct --parsable2`` text) and the cluster's
``slurm.conf`` and ``topology.conf`` with ``sim/synthetic_cluster.py``.  The replay's
own reader (``dike_slurm.accounting``) reads the dumps back.

It is deterministic: the same arguments and seed give byte-identical output.
Generation is streaming (one submission at a time), so a million jobs need
bounded memory.  Command line: ``dike-slurm trace generate --out DIR``.

About 700 lines, over the project's 500: the model's 60 documented parameters
(170 lines) and the sampler that reads them are one concept and are read together.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterator, NamedTuple, Sequence

from dike_slurm.parsing.hostlists import compress_hostlist
from dike_slurm.sim.sacct_writer import (
    TIMELIMIT_PARTITION,
    TIMELIMIT_UNLIMITED,
    SacctRecord,
    tres_text,
    write_sacct_parsable2,
)
from dike_slurm.sim.synthetic_cluster import ClusterSpec, write_slurm_conf, write_topology_conf

__all__ = ["WorkloadModel", "generate_jobs", "generate_sample"]

_DAY = 86400
_EPOCH = datetime(1970, 1, 1)


# --------------------------------------------------------------------------- model


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
    max_runtime_s: int = 10 * _DAY
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


def _parse_local_time(text: str) -> int:
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is not None:
        raise ValueError("start must be a naive local time such as 2026-01-05T00:00:00")
    return int((dt - _EPOCH).total_seconds())


# --------------------------------------------------------------------------- names

_GPU_JOB_NAMES = (
    "train_resnet50", "train_resnet101", "bert-large-ft", "bert-base-ft",
    "vit_b16_imagenet", "yolov8-train", "detr-coco", "wav2vec2-ft",
    "whisper-small-ft", "t5-base-eval", "lora-llama-7b", "eval_mmlu",
    "sweep_lr", "ppo_atari", "sac-mujoco", "diffusion-unet-ft", "gnn-ogbn",
    "seg_deeplabv3", "mae-pretrain-vitb", "clip-ft", "jupyter", "bash",
    "interactive", "nccl-tests", "profile_dataloader",
)
_LARGE_GPU_JOB_NAMES = (
    "gpt-neox-pretrain", "llama-13b-sft", "bert-large-pretrain",
    "megatron-gpt-1.3b", "moe-8x-pretrain", "vit-h14-pretrain",
    "clip-l14-pretrain", "ddp_resnet152", "fsdp-llama-7b",
)
_CPU_JOB_NAMES = (
    "preprocess_shards", "tokenize_corpus", "eval_metrics", "tar_checkpoints",
    "rsync_dataset", "build_index", "bash", "jupyter-cpu",
)
#: Names that try to break readers.  None contains ``|`` or a newline: sacct
#: does not escape either (it prints the name raw between ``|`` separators), so
#: such a name would make the dump itself unparsable.
_HOSTILE_JOB_NAMES = (
    "exp;rm -rf /",
    "$(shutdown -h now)",
    "`id`",
    "résumé_модель_模型",
    "🚀-launch",
    "<script>alert(1)</script>",
    "quote'\"mix",
    "run name with spaces",
    "tab\tname",
    "a=b,c=d",
    "--format=x",
    " padded ",
)
_ARRAY_JOB_NAMES = ("sweep_lr", "hpo_trial", "seed_sweep", "ablation", "grid_search")

_USER_NAMES = (
    "achen", "bpatel", "cmuller", "dkim", "egarcia", "fnguyen", "gsilva", "hli",
    "iivanova", "jsmith", "kwang", "lrossi", "mtanaka", "nali", "okowalski",
    "pzhang", "qhuang", "rsingh", "sjohnson", "tlee", "ubrown", "vlopez",
    "wchen", "xliu", "ymartin", "zwilson", "aokafor", "bschmidt", "cdubois",
    "dyamamoto", "eandersson", "fcosta", "gmoreau", "hpark", "ijensen",
    "jkowalczyk", "knovak", "lhoffmann", "mfischer", "nsato",
)


# --------------------------------------------------------------------------- sampler


class _User(NamedTuple):
    name: str
    uid: int
    account: str
    tilt: float
    runtime_scale: float
    typed_gpu: bool
    no_timelimit: bool


class _Job(NamedTuple):
    """A job before it is turned into sacct records."""

    name: str
    user: _User
    gpus: int
    nnodes: int
    cpus: int
    mem_mb: int
    typed_request: bool
    timelimit_min: int
    runtime: int          # intended run time, seconds
    fate: str             # COMPLETED / FAILED / CANCELLED / NODE_FAIL / REQUEUED / PENDING_CANCEL
    elapsed: int          # elapsed of the (first) run
    timed_out: bool


def _cap_mem(mb: int, real_memory_mb: int) -> int:
    """A memory request no larger than a node, in whole GB when it is over 1 GB."""
    mb = min(mb, real_memory_mb)
    return mb - mb % 1024 if mb >= 1024 else mb


def _cum(weights: Sequence[float]) -> list[float]:
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("weights must add up to > 0")
    out, acc = [], 0.0
    for w in weights:
        acc += w / total
        out.append(acc)
    out[-1] = 1.0
    return out


class _Sampler:
    """Draws job shapes and outcomes (everything but arrival times)."""

    def __init__(self, model: WorkloadModel, cluster: ClusterSpec, users: list[_User]):
        self.m = model
        self.c = cluster
        self.users = users
        gpn = cluster.gpus_per_node
        sizes = [(g, w) for g, w in model.gpu_count_weights
                 if 1 <= g <= cluster.total_gpus and (g <= gpn or g % gpn == 0) and w > 0]
        if not sizes:
            raise ValueError("no GPU job size in gpu_count_weights fits this cluster")
        self.sizes = [g for g, _ in sizes]
        base = [w for _, w in sizes]
        self.user_size_cum = [_cum([w * g ** u.tilt for g, w in zip(self.sizes, base)])
                              for u in users]
        zipf = [1.0 / (i + 1) ** model.user_zipf_s for i in range(len(users))]
        self.user_cum = _cum(zipf)
        self.rt_cum = _cum([w for w, _, _ in model.runtime_mixture])
        self.rt_comp = [(math.log(med), sig) for _, med, sig in model.runtime_mixture]
        self.mem_opts = [mb for mb, _ in model.mem_per_gpu_mb]
        self.mem_cum = _cum([w for _, w in model.mem_per_gpu_mb])
        self.grid = sorted(model.timelimit_grid_min)
        self.tl_mu = math.log(model.timelimit_factor_median - 1.0)
        self.cpu_opts = [c for c in (1, 2, 4, 8, 16, 32) if c <= cluster.cpus_per_node]
        self.array_size_cum = _cum([0.8, 0.15, 0.05])
        self.array_sizes = [g for g in (1, 2, 4) if g <= cluster.total_gpus
                            and (g <= gpn or g % gpn == 0)] or [1]
        self.hostile_count = 0

    # -- helpers -----------------------------------------------------------------
    def runtime(self, rng: random.Random, user: _User, gpus: int) -> int:
        mu, sig = self.rt_comp[bisect.bisect_left(self.rt_cum, rng.random())]
        t = rng.lognormvariate(mu, sig) * user.runtime_scale * gpus ** self.m.runtime_size_exponent
        return int(min(max(t, self.m.min_runtime_s), self.m.max_runtime_s))

    def gpu_shape(self, rng: random.Random, user_idx: int) -> tuple[int, int, int, int]:
        """(gpus, nnodes, cpus, mem_mb) of a GPU job."""
        g = self.sizes[bisect.bisect_left(self.user_size_cum[user_idx], rng.random())]
        return self._alloc_for(rng, g)

    def _alloc_for(self, rng: random.Random, g: int) -> tuple[int, int, int, int]:
        c = self.c
        gpn = c.gpus_per_node
        if g >= gpn:
            # whole nodes, exclusive: all CPUs, --mem=0 (all of RealMemory)
            n = g // gpn
            return g, n, c.cpus_per_node * n, c.real_memory_mb * n
        per_gpu_cpus = max(1, c.cpus_per_node // gpn)
        if rng.random() < 0.25:
            per_gpu_cpus = max(1, per_gpu_cpus // 2)
        mem = self.mem_opts[bisect.bisect_left(self.mem_cum, rng.random())]
        return (g, 1, min(per_gpu_cpus * g, c.cpus_per_node),
                _cap_mem(mem * g, c.real_memory_mb))

    def timelimit(self, rng: random.Random, user: _User, runtime: int) -> tuple[int, bool]:
        """(limit minutes or TIMELIMIT_UNLIMITED, underestimated)."""
        if user.no_timelimit:
            return TIMELIMIT_UNLIMITED, False
        grid = self.grid
        if rng.random() < self.m.timelimit_underestimate_frac:
            below = [v for v in grid if v * 60 < runtime]
            if below:
                # mostly the largest round value below the real need
                k = len(below) - 1 - min(len(below) - 1, int(rng.expovariate(1.5)))
                return below[k], True
        want = runtime * (1.0 + rng.lognormvariate(self.tl_mu, self.m.timelimit_factor_sigma))
        minutes = int(math.ceil(want / 60.0))
        i = bisect.bisect_left(grid, minutes)
        if i < len(grid):
            return grid[i], False
        return TIMELIMIT_UNLIMITED, False

    def outcome(self, rng: random.Random, runtime: int, limit_min: int,
                can_requeue: bool = True) -> tuple[str, int, bool]:
        """(fate, elapsed of the (first) run, timed_out) for a started job."""
        m = self.m
        u = rng.random()
        if can_requeue and u < m.requeue_frac:
            fate = "REQUEUED"
            elapsed = max(60, int(runtime * rng.uniform(0.05, 0.9)))
        elif u < m.requeue_frac + m.node_fail_frac:
            fate = "NODE_FAIL"
            elapsed = max(1, int(runtime * rng.random()))
        elif u < m.requeue_frac + m.node_fail_frac + m.fail_frac:
            fate = "FAILED"
            elapsed = max(1, int(runtime * rng.random() ** 2))
        elif u < m.requeue_frac + m.node_fail_frac + m.fail_frac + m.cancel_running_frac:
            fate = "CANCELLED"
            elapsed = max(1, int(runtime * rng.uniform(0.05, 1.0)))
        else:
            fate = "COMPLETED"
            elapsed = runtime
        timed_out = False
        if limit_min > 0 and elapsed > limit_min * 60 and fate != "REQUEUED":
            # killed by the time limit; Slurm checks limits periodically, so the
            # recorded end lands shortly after the limit
            elapsed = limit_min * 60 + rng.randint(1, 59)
            fate, timed_out = "TIMEOUT", True
        elif limit_min > 0 and fate == "REQUEUED":
            elapsed = min(elapsed, limit_min * 60)
        return fate, elapsed, timed_out

    def name(self, rng: random.Random, gpus: int, cpu_only: bool) -> str:
        if rng.random() < self.m.hostile_name_frac:
            # cycle through the list so that even a short trace has each kind
            self.hostile_count += 1
            return _HOSTILE_JOB_NAMES[(self.hostile_count - 1) % len(_HOSTILE_JOB_NAMES)]
        if cpu_only:
            return rng.choice(_CPU_JOB_NAMES)
        if gpus > self.c.gpus_per_node or (gpus >= 8 and rng.random() < 0.5):
            return rng.choice(_LARGE_GPU_JOB_NAMES)
        return rng.choice(_GPU_JOB_NAMES)

    # -- a whole submission ----------------------------------------------------------
    def submission(self, rng: random.Random) -> tuple[_User, list[_Job], bool]:
        """(user, jobs, is_array).  An array gives one job per task."""
        m = self.m
        ui = bisect.bisect_left(self.user_cum, rng.random())
        user = self.users[ui]
        if rng.random() < m.cpu_only_frac:
            cpus = rng.choice(self.cpu_opts)
            mem = _cap_mem(cpus * 4096, self.c.real_memory_mb)
            rt = rng.lognormvariate(math.log(m.cpu_runtime_median_s), m.cpu_runtime_sigma)
            rt = int(min(max(rt * user.runtime_scale, m.min_runtime_s), m.max_runtime_s))
            return user, [self._job(rng, user, self.name(rng, 0, True),
                                    (0, 1, cpus, mem), rt, True)], False
        if rng.random() < m.array_frac:
            lo, hi = m.array_tasks
            n = rng.randint(lo, hi)
            g = self.array_sizes[min(len(self.array_sizes) - 1,
                                     bisect.bisect_left(self.array_size_cum, rng.random()))]
            shape = self._alloc_for(rng, g)
            base = self.runtime(rng, user, g)
            name = self.name(rng, g, False)
            if name in _GPU_JOB_NAMES or name in _LARGE_GPU_JOB_NAMES:
                name = rng.choice(_ARRAY_JOB_NAMES)
            limit, _ = self.timelimit(rng, user, int(base * 1.5))
            jobs = []
            for _ in range(n):
                rt = int(min(max(base * rng.lognormvariate(0.0, 0.3), m.min_runtime_s),
                             m.max_runtime_s))
                jobs.append(self._job(rng, user, name, shape, rt, False, limit=limit))
            return user, jobs, True
        shape = self.gpu_shape(rng, ui)
        rt = self.runtime(rng, user, shape[0])
        return user, [self._job(rng, user, self.name(rng, shape[0], False), shape, rt, True)], False

    def _job(self, rng: random.Random, user: _User, name: str,
             shape: tuple[int, int, int, int], runtime: int, may_cancel_pending: bool,
             limit: int | None = None) -> _Job:
        gpus, nnodes, cpus, mem = shape
        if limit is None:
            limit, _ = self.timelimit(rng, user, runtime)
        typed = bool(gpus) and user.typed_gpu
        if may_cancel_pending and rng.random() < self.m.cancel_before_start_frac:
            if limit == TIMELIMIT_UNLIMITED and user.no_timelimit:
                # no --time given and never scheduled: the limit was never
                # resolved from the partition, sacct prints Partition_Limit
                limit = TIMELIMIT_PARTITION
            return _Job(name, user, gpus, nnodes, cpus, mem, typed, limit, runtime,
                        "PENDING_CANCEL", 0, False)
        fate, elapsed, timed_out = self.outcome(rng, runtime, limit)
        return _Job(name, user, gpus, nnodes, cpus, mem, typed, limit, runtime,
                    fate, elapsed, timed_out)


def _make_users(model: WorkloadModel, rng: random.Random) -> list[_User]:
    acc_names = [a for a, _ in model.accounts]
    acc_cum = _cum([w for _, w in model.accounts])
    users = []
    for i in range(model.n_users):
        name = _USER_NAMES[i] if i < len(_USER_NAMES) else f"u{i + 1:05d}"
        users.append(_User(
            name=name,
            uid=20001 + i,
            account=acc_names[bisect.bisect_left(acc_cum, rng.random())],
            tilt=rng.gauss(0.0, model.user_size_tilt_sigma),
            runtime_scale=rng.lognormvariate(0.0, model.user_runtime_sigma),
            typed_gpu=rng.random() < model.user_typed_gpu_frac,
            no_timelimit=rng.random() < model.user_no_timelimit_frac,
        ))
    return users


def _gpu_seconds(job: _Job, sampler: _Sampler) -> float:
    if job.fate == "PENDING_CANCEL":
        return 0.0
    total = job.gpus * job.elapsed
    if job.fate == "REQUEUED":
        total += job.gpus * min(job.runtime, job.timelimit_min * 60
                                if job.timelimit_min > 0 else job.runtime)
    return float(total)


def _calibrate(model: WorkloadModel, sampler: _Sampler, rng: random.Random,
               n: int = 20000) -> float:
    """Mean allocated GPU-seconds per submission, by sampling the model."""
    total = 0.0
    for _ in range(n):
        _, jobs, _ = sampler.submission(rng)
        for job in jobs:
            total += _gpu_seconds(job, sampler)
    return total / n


# --------------------------------------------------------------------------- generator


def _rng(seed: int | str, stream: str) -> random.Random:
    # str seeds are hashed with SHA-512 by random.seed(): stable across runs
    # and independent of PYTHONHASHSEED
    return random.Random(f"dike-tracegen:{seed}:{stream}")


def generate_jobs(model: WorkloadModel, n_jobs: int, cluster: ClusterSpec, seed: int,
                  start: str = "2026-01-05T00:00:00") -> Iterator[SacctRecord]:
    """Stream the sacct records of ``n_jobs`` synthetic jobs.

    A job is one JobIDRaw; an array task is a job.  A requeued job yields two
    records (its ``REQUEUED`` run, then its final run) unless
    ``model.emit_requeue_duplicates`` is false.  Records come in JobIDRaw
    order, like sacct prints them.  ``start`` is the naive local time of the
    first possible submission.  Deterministic in all arguments.
    """
    if n_jobs < 0:
        raise ValueError("n_jobs must be >= 0")
    t0 = _parse_local_time(start)
    users = _make_users(model, _rng(seed, "users"))
    sampler = _Sampler(model, cluster, users)
    mean_gs = _calibrate(model, sampler, _rng(seed, "calibrate"))
    sampler.hostile_count = 0
    rate = model.target_load * cluster.total_gpus / max(mean_gs, 1e-9)  # per second
    week_norm = (5.0 + 2.0 * model.weekend_factor) / 7.0
    max_mult = (1.0 + model.diurnal_amplitude) * max(1.0, model.weekend_factor) / week_norm
    lam_max = rate * max_mult
    amp = model.diurnal_amplitude
    peak = model.diurnal_peak_hour
    two_pi_24 = 2.0 * math.pi / 24.0

    rng = _rng(seed, "jobs")
    t = float(t0)
    next_id = model.first_job_id
    emitted = 0
    while emitted < n_jobs:
        # non-homogeneous Poisson arrivals by thinning
        t += rng.expovariate(lam_max)
        now = int(t)
        day, sod = divmod(now, _DAY)
        mult = 1.0 + amp * math.cos(two_pi_24 * (sod / 3600.0 - peak))
        if (day + 3) % 7 >= 5:  # 1970-01-01 was a Thursday; Mon=0 .. Sun=6
            mult *= model.weekend_factor
        if rng.random() * max_mult > mult / week_norm:
            continue
        user, jobs, is_array = sampler.submission(rng)
        jobs = jobs[: n_jobs - emitted]
        submit = now
        eligible = submit
        if rng.random() < model.deferred_eligible_frac:
            eligible = submit + int(rng.lognormvariate(math.log(1800.0), 1.2))
        priority = rng.randint(1000, 20000)
        base_id = next_id
        next_id += len(jobs)
        if is_array:
            n = len(jobs)
            # the array's own id stays with its last task; the others get the
            # ids after it (see docs/workload.md)
            order = [n - 1] + list(range(n - 1))
            for raw_offset, task in enumerate(order):
                yield from _job_records(rng, model, cluster, sampler, jobs[task],
                                        f"{base_id}_{task}", base_id + raw_offset,
                                        submit, eligible, priority)
        else:
            yield from _job_records(rng, model, cluster, sampler, jobs[0], str(base_id),
                                    base_id, submit, eligible, priority)
        emitted += len(jobs)


def _place(rng: random.Random, model: WorkloadModel, cluster: ClusterSpec, nnodes: int) -> str:
    if nnodes == 1:
        return cluster.node_name(rng.randrange(cluster.nodes))
    if rng.random() < model.fragmented_placement_frac:
        idx = sorted(rng.sample(range(cluster.nodes), nnodes))
    else:
        first = rng.randrange(cluster.nodes - nnodes + 1)
        idx = range(first, first + nnodes)
    return compress_hostlist([cluster.node_name(i) for i in idx])


def _wait(rng: random.Random, model: WorkloadModel, gpus: int) -> int:
    if rng.random() < model.wait_zero_frac:
        return 0
    w = rng.lognormvariate(math.log(model.wait_median_s), model.wait_sigma)
    return int(min(w * math.sqrt(max(gpus, 1)), 3 * _DAY)) + 1


def _sched_flag(rng: random.Random, model: WorkloadModel, wait: int) -> str:
    if wait == 0:
        return "SchedSubmit"
    return "SchedBackfill" if rng.random() < model.backfill_frac else "SchedMain"


def _job_records(rng: random.Random, model: WorkloadModel, cluster: ClusterSpec,
                 sampler: _Sampler, job: _Job, job_id: str, raw: int, submit: int,
                 eligible: int, priority: int) -> Iterator[SacctRecord]:
    user = job.user
    req = tres_text(job.cpus, job.mem_mb, job.nnodes, job.gpus,
                cluster.gpu_type if job.typed_request else None)
    head = (job_id, raw, job.name, user.name, user.account, cluster.partition, model.qos)
    limit = job.timelimit_min

    if job.fate == "PENDING_CANCEL":
        # cancelled while pending: slurmdbd has no start time and reports
        # Start = End (the cancel time), Elapsed 0, no allocation
        end = eligible + int(rng.lognormvariate(math.log(1200.0), 1.3)) + 1
        uid = 0 if rng.random() < model.admin_cancel_frac else user.uid
        yield SacctRecord(*head, f"CANCELLED by {uid}", submit, eligible, end, end, 0,
                          limit, job.nnodes, 0, "None assigned", req, "", priority, "",
                          job.gpus)
        return

    alloc = tres_text(job.cpus, job.mem_mb, job.nnodes, job.gpus,
                  cluster.gpu_type if job.gpus else None)
    wait = _wait(rng, model, job.gpus)
    start = eligible + wait
    flags = _sched_flag(rng, model, wait)

    if job.fate == "REQUEUED":
        end1 = start + job.elapsed
        nodes1 = _place(rng, model, cluster, job.nnodes)
        if model.emit_requeue_duplicates:
            yield SacctRecord(*head, "REQUEUED", submit, eligible, start, end1, job.elapsed,
                              limit, job.nnodes, job.cpus, nodes1, req, alloc, priority,
                              flags, job.gpus)
        # the requeued job gets a new submit time once its epilog is done, and a
        # BeginTime hold of about CredExpire + 1 s before it is eligible again
        submit = end1 + rng.randint(1, 5)
        eligible = end1 + 121
        fate, elapsed, _ = sampler.outcome(rng, job.runtime, limit, can_requeue=False)
        wait = _wait(rng, model, job.gpus)
        start = eligible + wait
        flags = _sched_flag(rng, model, wait)
    else:
        fate, elapsed = job.fate, job.elapsed

    if fate == "CANCELLED":
        uid = 0 if rng.random() < model.admin_cancel_frac else user.uid
        state = f"CANCELLED by {uid}"
    else:
        state = fate
    yield SacctRecord(*head, state, submit, eligible, start, start + elapsed, elapsed,
                      limit, job.nnodes, job.cpus, _place(rng, model, cluster, job.nnodes),
                      req, alloc, priority, flags, job.gpus)


# --------------------------------------------------------------------------- files


def generate_sample(out_dir: str | Path, n_jobs: int, cluster: ClusterSpec,
                    model: WorkloadModel, seed: int,
                    start: str = "2026-01-05T00:00:00") -> None:
    """Write ``sacct.txt``, ``slurm.conf`` and ``topology.conf`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sacct.txt", "w", encoding="utf-8", newline="\n") as fh:
        write_sacct_parsable2(generate_jobs(model, n_jobs, cluster, seed, start), fh)
    with open(out / "slurm.conf", "w", encoding="utf-8", newline="\n") as fh:
        write_slurm_conf(cluster, fh)
    with open(out / "topology.conf", "w", encoding="utf-8", newline="\n") as fh:
        write_topology_conf(cluster, fh)
