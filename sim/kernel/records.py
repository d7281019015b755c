"""What the simulator takes and gives besides the trace and the policy: its settings, the finished
jobs, the timeline of GPU use and queue levels, and its counters."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from dike_slurm.domain.model import PreemptionOptIn
from dike_slurm.policies.common import CommRule
from dike_slurm.domain.slurm_priority import SlurmPriorityModel


@dataclass(frozen=True)
class SimSettings:
    """Everything the simulator needs besides the trace, the cluster and the policy."""

    interval_s: float = 60.0
    cycle_latency_s: float = 0.0  # from a cycle's snapshot to its decisions reaching Slurm (below interval_s)
    run_overhead_s: float = 0.0  # a run ends this long after its work (Slurm's launch and exit)
    comm_penalty: float = 1.0
    restart_cost_s: float = 120.0  # a requeued job's restart (reload, warm-up) before it progresses
    checkpoint_interval_s: float = 1800.0  # jobs checkpoint every this much work; 0: nothing is lost
    preemptible: float = 1.0  # share of jobs that may be preempted, drawn per job from the seed
    preemption_opt_in: PreemptionOptIn | None = None  # instead of the share: the engine's opt-in rule
    max_requeues_per_cycle: int = 2  # engine.max_requeues_per_cycle: the live engine's rate limit
    seed: int = 0
    usage_half_life_s: float = 168 * 3600.0
    user_shares: Mapping[str, float] = field(default_factory=dict)
    history_window_s: float = 30 * 86400.0  # finished jobs whose GPU service the snapshot carries
    max_switch_wait_s: int = 300  # SchedulerParameters=max_switch_wait (Slurm's default 300)
    bf_max_job_test: int = 500  # SchedulerParameters=bf_max_job_test
    bf_window_s: float = 86400.0  # SchedulerParameters=bf_window (1440 minutes)
    bf_interval_s: float = 30.0  # SchedulerParameters=bf_interval
    # The main scheduler: a full pass every sched_interval (Slurm's default 60 s); a change (a
    # submission, an end, an update) asks for a pass at least batch_sched_delay after the last one
    # (Slurm's default 3 s, which sim_settings sets). 0 here: a pass at every change, at once.
    sched_interval_s: float = 60.0
    batch_sched_delay_s: float = 0.0
    backfill_reservations: int = 16  # blocked jobs planned per pass (Slurm plans every tested job)
    requeueable: bool = True  # slurm.conf JobRequeue (default 1: batch jobs may be requeued)
    requeue_hold_s: float = 121.0  # a requeued job may start again this long after (cred_expire + 1)
    comm_gpus: int = 8  # communication-heavy threshold (the Dike policy's comm_gpus)
    comm_rules: tuple[CommRule, ...] = ()
    # Slurm's priority (sim/kernel/priority.py): the site's weights, and how the engine writes into it
    # (engine.priority_strategy, the span engine.priority_mode gives, engine.priority_tolerance).
    # No model: Slurm's default weights (all 0), so only the written values order the queue.
    priority_model: SlurmPriorityModel | None = None
    priority_strategy: str = "site_factor"
    priority_span: int = 1_000_000
    priority_reserve: int = 0  # the top values kept for protected jobs (slurm_priority.protection_reserve)
    priority_tolerance: float = 0.01
    # What the engine writes per cycle (dike_slurm/domain/head_window.py, engine.write_budget_s): the
    # pending jobs per partition it orders (0: every one), and the writes one cycle makes (None: all).
    head_window: int = 0
    writes_per_cycle: int | None = None
    admin_comment: bool = True  # engine.admin_comment: a level change is a write of its own

    @property
    def preemptible_choice(self) -> float | str:
        """Which jobs may be preempted, as configured: "live" (the opt-in rule), or the share."""
        return "live" if self.preemption_opt_in is not None else self.preemptible


@dataclass(frozen=True, slots=True)
class JobResult:
    """One finished job as the metrics and jobs-NAME.csv see it."""

    job_id: int
    display_id: str
    user: str
    gpus: int
    submit: float
    start: float  # first start
    end: float
    wait_s: float  # time pending, every pending period summed
    jct_s: float
    duration_s: float  # trace run time, consolidated and alone
    level: int  # last level the policy gave the job
    leaves: int  # leaf switches spanned by the last run
    preemptions: int
    heavy: bool
    consolidated: bool  # every run within the fewest leaves that can hold the job
    gpu_seconds: float  # GPUs x wall time of every run (restart and slow-down included)
    lost_gpu_s: float = 0.0  # GPU-seconds of runs whose work was lost to preemption, restarts included
    partition: str = ""
    gpu_types: tuple[str, ...] = ()  # the GPU types of its last run's nodes (what sacct's AllocTRES shows)


@dataclass
class Timeline:
    """GPU use and queue levels over simulated time, in fixed-width bins."""

    origin: float
    width: float
    busy_gpu_s: list[float] = field(default_factory=list)
    level_sums: list[Counter] = field(default_factory=list)  # per bin: level -> sum of job counts
    level_samples: list[int] = field(default_factory=list)  # per bin: cycles sampled

    def _grow(self, index: int) -> None:
        while len(self.busy_gpu_s) <= index:
            self.busy_gpu_s.append(0.0)
            self.level_sums.append(Counter())
            self.level_samples.append(0)

    def add_busy(self, start: float, end: float, gpus: int) -> None:
        if end <= start:
            return
        first = max(0, int((start - self.origin) // self.width))
        last = max(0, int((end - self.origin) // self.width))
        self._grow(last)
        for index in range(first, last + 1):
            low = self.origin + index * self.width
            overlap = min(end, low + self.width) - max(start, low)
            if overlap > 0:
                self.busy_gpu_s[index] += overlap * gpus

    def add_levels(self, time: float, counts: Mapping[int, int]) -> None:
        index = max(0, int((time - self.origin) // self.width))
        self._grow(index)
        self.level_sums[index].update(counts)
        self.level_samples[index] += 1


@dataclass
class SimStats:
    """Counters of one replay (deterministic: no wall-clock time in here)."""

    events: int = 0
    passes: int = 0  # main scheduler passes (on events)
    backfill_passes: int = 0  # backfill passes (every bf_interval when something changed)
    cycles: int = 0  # policy cycles due (every interval while jobs wait)
    decide_calls: int = 0
    postponed_cycles: int = 0  # cycles at which no waiting job could start (evaluated later)
    starts: int = 0
    typed_starts: int = 0  # starts of jobs that asked for GPU types, each checked against its nodes' types
    preemptions: int = 0
    requeues_refused: int = 0  # requeues the guard refused (dike_slurm.cycle.requeue_guard)
    # preemptions whose beneficiary started on the freed nodes (landed) or did not within 2 cycles
    # of the victims' end, or started elsewhere (wasted)
    landed_preemptions: int = 0
    wasted_preemptions: int = 0
    reservations: int = 0
    # the engine's writes the replay worked out (sim/kernel/priority.py; not when the live engine drives it):
    # landed, and left for a later cycle by the cap and the write budget
    engine_writes: int = 0
    writes_held: int = 0
    most_pending: int = 0  # the longest the queue got, at a policy cycle
    first_submit: float = math.inf
    last_end: float = -math.inf
