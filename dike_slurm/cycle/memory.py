"""What a running engine keeps from one cycle to the next, in one object the engine owns.

Everything here rests on one rule: **the same Job object stands for the same record.** A read
hands out last read's Job for a job whose record Slurm printed exactly as then (the lean read,
by the record's text; the simulated backend, by equality); the engine's enrichment then hands
out last cycle's enriched copy for that Job with equal `EnrichInputs`; and the diff reuses a
job's side and plan for that copy with equal owned fields, memory, SiteFactor and PlanInputs
reuse key (reconcile.DiffMemory). Each step compares its real inputs, so a cycle with the memory
plans what a new engine would (tests/unit/test_engine_simulated.py checks every cycle of a
replay; test_cycle_equivalence.py and test_lean_read.py each step with hypothesis).

The service prior is kept with the finished jobs it was learned from, and learned again when
they differ (LearnedPrior).

The state store keeps its own read of its tables between cycles (StateStore._kept_read): that is
the file's content, keyed by the store's own write counters, and the same for any reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from dike_slurm.cycle.reconcile import DiffMemory
from dike_slurm.domain.model import Job
from dike_slurm.domain.service_prior import FinishedJob, ServicePrior
from dike_slurm.slurm.backends.base import ReadMemory
from dike_slurm.slurm.usage import JobService
from dike_slurm.store.state import SiteSpan


class EnrichInputs(NamedTuple):
    """What Engine._enrich adds to a job read from Slurm; equal inputs and the same Job object
    read give last cycle's enriched copy."""

    service: JobService  # over all runs, from accounting and the engine's runs
    attained_at_promotion_gpu_s: float
    requeues: int
    site_factor: int | None
    pinned: bool  # a preemption freed nodes for it, and it has not started yet


class Enriched(NamedTuple):
    """One job as Engine._enrich kept it for the next cycle."""

    read: Job  # the Job object the backend's read handed out
    inputs: EnrichInputs
    copy: Job  # the enriched Job the cycle used


class LearnedPrior(NamedTuple):
    """The service prior a cycle learned, and the finished jobs, in order, it learned it from: the
    next cycle with the same finished jobs uses it (and the predictions it keeps) again."""

    finished: list[FinishedJob]
    prior: ServicePrior


@dataclass
class CycleMemory:
    """Everything a running engine keeps between cycles; a new engine starts with an empty one
    (a reload makes a new engine) and plans the same."""

    reads: ReadMemory = field(default_factory=ReadMemory)
    enriched: dict[int, Enriched] = field(default_factory=dict)  # by job id, the last cycle's
    diff: DiffMemory = field(default_factory=DiffMemory)
    # The site's span, read on the first plan (Engine.priority_span), and what an applied cycle keeps.
    span: SiteSpan | None = None
    # The service prior's last prediction (GPU-s) of each active job, and (prediction, when it
    # left the queue) of the jobs that left and whose final run is not in accounting yet.
    predicted: dict[int, float] = field(default_factory=dict)
    left: dict[int, tuple[float, float]] = field(default_factory=dict)
    prior: LearnedPrior | None = None
