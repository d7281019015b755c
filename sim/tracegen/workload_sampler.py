"""Draws the synthetic workload's users, job shapes and outcomes from its model
(``sim/tracegen/workload_model.py``): everything but the arrival times, which ``sim/tracegen/generate.py`` draws."""

from __future__ import annotations

import bisect
import math
import random
from typing import NamedTuple, Sequence

from dike_slurm.sim.tracegen.sacct_writer import (
    TIMELIMIT_PARTITION,
    TIMELIMIT_UNLIMITED,
)
from dike_slurm.sim.tracegen.synthetic_cluster import ClusterSpec
from dike_slurm.sim.tracegen.workload_model import WorkloadModel

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


class User(NamedTuple):
    name: str
    uid: int
    account: str
    tilt: float
    runtime_scale: float
    typed_gpu: bool
    no_timelimit: bool


class SampledJob(NamedTuple):
    """A job before it is turned into sacct records."""

    name: str
    user: User
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


class Sampler:
    """Draws job shapes and outcomes (everything but arrival times)."""

    def __init__(self, model: WorkloadModel, cluster: ClusterSpec, users: list[User]):
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
    def runtime(self, rng: random.Random, user: User, gpus: int) -> int:
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

    def timelimit(self, rng: random.Random, user: User, runtime: int) -> tuple[int, bool]:
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
    def submission(self, rng: random.Random) -> tuple[User, list[SampledJob], bool]:
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

    def _job(self, rng: random.Random, user: User, name: str,
             shape: tuple[int, int, int, int], runtime: int, may_cancel_pending: bool,
             limit: int | None = None) -> SampledJob:
        gpus, nnodes, cpus, mem = shape
        if limit is None:
            limit, _ = self.timelimit(rng, user, runtime)
        typed = bool(gpus) and user.typed_gpu
        if may_cancel_pending and rng.random() < self.m.cancel_before_start_frac:
            if limit == TIMELIMIT_UNLIMITED and user.no_timelimit:
                # no --time given and never scheduled: the limit was never
                # resolved from the partition, sacct prints Partition_Limit
                limit = TIMELIMIT_PARTITION
            return SampledJob(name, user, gpus, nnodes, cpus, mem, typed, limit, runtime,
                        "PENDING_CANCEL", 0, False)
        fate, elapsed, timed_out = self.outcome(rng, runtime, limit)
        return SampledJob(name, user, gpus, nnodes, cpus, mem, typed, limit, runtime,
                    fate, elapsed, timed_out)


def make_users(model: WorkloadModel, rng: random.Random) -> list[User]:
    acc_names = [a for a, _ in model.accounts]
    acc_cum = _cum([w for _, w in model.accounts])
    users = []
    for i in range(model.n_users):
        name = _USER_NAMES[i] if i < len(_USER_NAMES) else f"u{i + 1:05d}"
        users.append(User(
            name=name,
            uid=20001 + i,
            account=acc_names[bisect.bisect_left(acc_cum, rng.random())],
            tilt=rng.gauss(0.0, model.user_size_tilt_sigma),
            runtime_scale=rng.lognormvariate(0.0, model.user_runtime_sigma),
            typed_gpu=rng.random() < model.user_typed_gpu_frac,
            no_timelimit=rng.random() < model.user_no_timelimit_frac,
        ))
    return users


def _gpu_seconds(job: SampledJob, sampler: Sampler) -> float:
    if job.fate == "PENDING_CANCEL":
        return 0.0
    total = job.gpus * job.elapsed
    if job.fate == "REQUEUED":
        total += job.gpus * min(job.runtime, job.timelimit_min * 60
                                if job.timelimit_min > 0 else job.runtime)
    return float(total)


def calibrate(model: WorkloadModel, sampler: Sampler, rng: random.Random,
               n: int = 20000) -> float:
    """Mean allocated GPU-seconds per submission, by sampling the model."""
    total = 0.0
    for _ in range(n):
        _, jobs, _ = sampler.submission(rng)
        for job in jobs:
            total += _gpu_seconds(job, sampler)
    return total / n
