"""The narrow interface between the engine and a cluster, in domain terms.

A backend reads the cluster (`read_cluster`), the job accounting (`accounting`), the site's own
priority settings (`priority_model`) and writes typed job updates (`apply`, `requeue`).
Everything Slurm-specific (commands, JSON shapes, pyslurm objects, the simulator) stays behind it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dike_slurm.domain.fields import JobUpdate
from dike_slurm.domain.model import Job, Node, Topology, with_constraint_gpu_types
from dike_slurm.slurm.accounting import ReadResult

if TYPE_CHECKING:
    from dike_slurm.domain.slurm_priority import SlurmPriorityModel


# What Slurm answers while slurmctld is asking slurmdbd for a job's database index
# (ESLURM_JOB_SETTING_DB_INX, "Job update not available right now, the DB index is being set, try
# again in a bit"). Its index thread asks for every job without one, a job that already ended
# included, as after a controller restart; and job_mgr.c checks the index before it checks whether
# the job finished (Slurm 22.05 source; seen on the 22.05 lab, tests/integration/test_faults.py).
RETRY_LATER = "try again in a bit"


@dataclass(frozen=True)
class WriteOutcome:
    """What happened to one write."""

    ok: bool
    command: str  # the exact command line, for the audit log
    message: str = ""
    job_gone: bool = False  # the job ended or started meanwhile: not an engine error

    @property
    def retry_later(self) -> bool:
        """Slurm asked for the write again later (RETRY_LATER): not an engine error; the next
        cycle plans it again, as it did not land."""
        return not self.ok and RETRY_LATER in self.message


def started(outcome: WriteOutcome) -> bool:
    """A write refused because the job is no longer pending (it started): the job is still there."""
    return not outcome.ok and "no longer pending" in outcome.message


@dataclass
class ReadMemory:
    """What a backend's read keeps for its next read (Backend.keep_reads_in)."""

    # The Job handed out for each record, by what it was read from: the lean read's record text
    # (squeue_format.read_jobs), the simulated backend's job id (reused while equal).
    jobs: dict[Hashable, Job] = field(default_factory=dict)
    # Each parsed text with its value, by kind (sprio, the topology): the same text gives the same value.
    parsed: dict[str, tuple[str, object]] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterState:
    """The cluster as one backend read sees it.

    Jobs are the active (pending, running, suspended) jobs with what Slurm holds now:
    placement, priority, nice, comment. `site_factors` has the SiteFactor of each job the
    backend can see it for (Slurm 22.05: eligible pending jobs only, through sprio).
    A job whose feature constraint names the nodes' GPU types carries those types in `gpu_types`
    (set here, for every backend), as a typed GRES request does.
    """

    time: float
    jobs: tuple[Job, ...]
    nodes: tuple[Node, ...]
    topology: Topology
    site_factors: Mapping[int, int] = field(default_factory=dict)
    admin_comments: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "jobs", with_constraint_gpu_types(self.jobs, self.nodes))


class Backend(ABC):
    """Reads and writes one cluster; the engine never sees anything else of it."""

    name: str
    calls: int = 0  # Slurm calls (commands, API requests) made so far, reads and writes
    realtime: bool = True  # cycles are engine.interval_s of wall time apart (a simulation runs flat out)

    def finished(self) -> bool:
        """Nothing is left to manage (a simulation at the end of its trace); a real cluster never is."""
        return False

    def keep_reads_in(self, memory: ReadMemory) -> None:
        """Keep what reads carry to the next read in `memory` (the engine's CycleMemory.reads,
        dike_slurm/cycle/memory.py); a backend whose reads keep nothing ignores it."""

    def limit_reads(self, seconds: float | None) -> None:
        """Bound all reads from now on by `seconds` in total, on top of each call's own timeout
        (the cycle deadline); None lifts the bound. Backends without slow reads ignore it."""

    @abstractmethod
    def read_cluster(self) -> ClusterState:
        """Active jobs, nodes, topology and what Slurm holds for each job now."""

    @abstractmethod
    def accounting(self, start: float, end: float) -> ReadResult:
        """Every run (requeued jobs: each run) active between start and end, epoch seconds."""

    def priority_model(self) -> SlurmPriorityModel | None:
        """The site's own priority: Slurm's PriorityWeight* settings, the QOS priorities and the
        partitions' PriorityJobFactor/PriorityTier, which size the SiteFactor span the engine writes
        (`slurm_priority.effective_span`). None when this backend cannot tell (the engine then
        writes `engine.priority_span`); a backend that can read them raises when the read fails.
        The engine asks when it starts and again after a reload, not every cycle."""
        return None

    @abstractmethod
    def apply(self, update: JobUpdate) -> WriteOutcome:
        """Write the fields of one job in one call."""

    def apply_many(self, updates: Sequence[JobUpdate], timeout: float | None = None) -> list[WriteOutcome]:
        """Write several updates, each job's in the given order; one outcome per update, in order.
        `timeout` bounds the whole call where the backend writes them together (the cycle deadline)."""
        return [self.apply(update) for update in updates]

    @abstractmethod
    def signal(self, job_id: int, signal: str) -> WriteOutcome:
        """Send `signal` (e.g. USR1) to the batch shell of a running job: the grace signal that
        lets it checkpoint before it is requeued."""

    @abstractmethod
    def requeue(self, job_id: int) -> WriteOutcome:
        """Preempt a running job by requeueing it."""

    @abstractmethod
    def describe(self, update: JobUpdate) -> str:
        """The command (or call) `apply` would make for this update, for humans and the audit."""

    def close(self) -> None:
        """Release whatever the backend holds (nothing by default)."""
