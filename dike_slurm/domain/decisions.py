"""Typed decisions a policy returns; backends translate them into Slurm changes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import NamedTuple, Union

from dike_slurm.domain.model import Placement
from dike_slurm.domain.service_prior import Prediction


class _PriorityFields(NamedTuple):
    job_id: int
    level: int
    score: float
    made_reason: str | Callable[[], str]  # the reason, or a function that makes it
    promoted: bool = False  # starvation promotion: attained service counted so far is forgiven


class SetPriority(_PriorityFields):
    """Put a job in a queue level with a score: higher scores run first, levels dominate.

    The reason may be given as a function that makes it, called when `reason` is read: a replay
    decides for every active job every cycle and reads no reason, and making their text was about a
    third of Dike's decide. Equal, and hashed, by what it shows (the reason made)."""

    __slots__ = ()

    @property
    def reason(self) -> str:
        made = self.made_reason
        return made if made.__class__ is str else made()  # type: ignore[operator,return-value]

    def _shown(self) -> tuple[int, int, float, str, bool]:
        return self.job_id, self.level, self.score, self.reason, self.promoted

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SetPriority) and self._shown() == other._shown()

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self._shown())

    def __repr__(self) -> str:
        return (f"SetPriority(job_id={self.job_id!r}, level={self.level!r}, score={self.score!r}, "
                f"reason={self.reason!r}, promoted={self.promoted!r})")


def service_forgiven(before_gpu_s: float, promoted: bool, attained_gpu_s: float) -> float:
    """The attained service that no longer counts towards the job's level after this cycle.

    A promotion forgives all the service attained so far; otherwise what an earlier promotion
    forgave stays forgiven. The engine (what it remembers) and the simulator both record it so.
    """
    return attained_gpu_s if promoted else before_gpu_s


@dataclass(frozen=True)
class SetPlacement:
    """Ask Slurm to place a pending job under this constraint."""

    job_id: int
    placement: Placement
    reason: str


@dataclass(frozen=True)
class ClearPlacement:
    """Remove the constraint the engine set earlier on a pending job."""

    job_id: int
    reason: str


@dataclass(frozen=True)
class Requeue:
    """Preempt a running job by requeueing it, to make room for the pending job `for_job`.

    The requeues of one `for_job` are a group: a guard keeps all of them or none (half of the
    room a blocked job needs frees nothing it can use).
    """

    job_id: int
    reason: str
    for_job: int | None = None


Decision = Union[SetPriority, SetPlacement, ClearPlacement, Requeue]


@dataclass(frozen=True)
class PriorInForce:
    """The service prior as one cycle used it: its measured power, how far its run times were
    trusted, and the weight its expected service had in the order (0: it moved nothing)."""

    power: float
    trust: float
    weight: float
    jobs: int  # finished jobs it learned from that really ran
    not_run: int = 0  # and that never really ran (service_prior.never_ran): their users' own groups only

    def describe(self) -> str:
        not_run = f" (and {self.not_run} that never really ran, for their users only)" if self.not_run else ""
        return (f"service prior: power {self.power:.2f} from {self.jobs} finished jobs{not_run}, run times trusted "
                f"x{self.trust:.2f}, weight {self.weight:g}")


@dataclass(frozen=True)
class Decisions:
    """The whole output of one `decide` call."""

    priorities: tuple[SetPriority, ...] = ()
    placements: tuple[SetPlacement | ClearPlacement, ...] = ()
    requeues: tuple[Requeue, ...] = ()
    # Pending jobs a preemption freed (or is freeing) nodes for: they run before every other job
    # of their tier (the engine writes them the top of its span), so the room goes to them.
    protected: tuple[int, ...] = ()
    # What the policy expected of a job's GPU service and where that came from (the service
    # prior; explain and queue show it); only jobs with a prediction
    expected: Mapping[int, Prediction] = field(default_factory=dict)
    prior: PriorInForce | None = None  # the service prior in force (None: the policy read none)

    def ranked(self) -> list[SetPriority]:
        """The priorities from the first job to run to the last: protected jobs first, then score
        descending, then id."""
        # Two stable sorts by one attribute each, cheaper than one by a (-score, id) tuple per job;
        # a reversed sort keeps equal scores in id order (the sort stays stable).
        ranked = sorted(self.priorities, key=attrgetter("job_id"))
        ranked.sort(key=attrgetter("score"), reverse=True)
        if self.protected:
            protected = frozenset(self.protected)
            ranked.sort(key=lambda p: p.job_id not in protected)
        return ranked

    def order(self) -> tuple[int, ...]:
        """Job ids from the first to run to the last (score descending, then id)."""
        return tuple(p.job_id for p in self.ranked())

    def priority_of(self, job_id: int) -> SetPriority | None:
        for decision in self.priorities:
            if decision.job_id == job_id:
                return decision
        return None

    def placement_of(self, job_id: int) -> SetPlacement | ClearPlacement | None:
        for decision in self.placements:
            if decision.job_id == job_id:
                return decision
        return None

    def __iter__(self):
        yield from self.priorities
        yield from self.placements
        yield from self.requeues
