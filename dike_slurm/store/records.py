"""The records the state store (dike_slurm/store/state.py) keeps and hands out: a job's memory, the
fields the engine owns, audit entries, cycle summaries, the site's priority span, and what a
retention pass pruned."""

from __future__ import annotations

from dataclasses import dataclass

from dike_slurm.domain.fields import FieldValue, JobField


@dataclass(frozen=True)
class SiteSpan:
    """The span the engine writes, as last read from the site: kept for a cycle whose read fails."""

    mode: str  # engine.priority_mode
    configured: int  # engine.priority_span
    span: int
    source: str  # the commands read
    read_at: float
    reserve: int = 0  # the top values kept for protected jobs (slurm_priority.protection_reserve)


@dataclass(frozen=True)
class JobMemory:
    """What the engine remembers of one job between cycles."""

    job_id: int
    last_seen: float
    level: int | None = None  # the level the policy gave it last
    written_level: int | None = None  # the level its priority was last written for
    attained_gpu_s: float = 0.0
    attained_at_promotion_gpu_s: float = 0.0
    promotions: int = 0
    requeues: int = 0  # preemptions by the engine
    hands_off: tuple[JobField, ...] = ()  # fields the engine leaves alone: a user changed what it set
    hands_off_reason: str = ""
    reason: str = ""  # the policy's last reason


@dataclass(frozen=True)
class OwnedField:
    """A job field the engine changed: the value it replaced and the value it wrote."""

    job_id: int
    field: JobField
    original: FieldValue
    written: FieldValue
    written_at: float


@dataclass(frozen=True)
class AuditEntry:
    """One engine action, with the exact command and the command that undoes it."""

    at: float
    cycle: int
    job_id: int
    action: str  # update | requeue | revert
    change: str  # "SiteFactor 0 -> 5000; AdminComment '' -> 'dike:level=0 ...'"
    command: str
    undo: str
    ok: bool
    message: str = ""
    reason: str = ""
    id: int | None = None
    user: str = ""  # the job's owner; for engine-wide rows (job 0), who ran the command


@dataclass(frozen=True)
class CycleSummary:
    started: float
    seconds: float
    policy: str
    applied: bool
    jobs: int
    managed: int
    writes: int
    errors: int
    slurm_calls: int
    note: str = ""


@dataclass(frozen=True)
class Pruned:
    """What one retention pass did to one table."""

    table: str
    deleted: int
    more: bool  # older rows are left for the next cycles (at most `limit` go per cycle)
    exported: int = 0
