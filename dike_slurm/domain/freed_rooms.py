"""Whether a preemption landed: the job its victims were requeued for started on the freed nodes.

A preemption *lands* when its job starts on the nodes the engine pinned it to. It is *wasted*
when the job starts elsewhere, or still waits `WASTED_AFTER_CYCLES` cycles after the cycle that
first saw every victim off those nodes (the victims lost their work for nothing). A job that
leaves the queue between two cycles before the engine saw it run is *gone*: not judged. The
replay counts the same way (sim/kernel/simulator.py, `landed_preemptions` and `wasted_preemptions`).
Pure: the engine reads the open rooms from the state store and stores what this returns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from dike_slurm.domain.model import Job, JobState

WASTED_AFTER_CYCLES = 2
LANDED, WASTED, GONE = "landed", "wasted", "gone"


@dataclass(frozen=True)
class FreedRoom:
    """The nodes a preemption freed, and for which job."""

    job_id: int  # the job the room was freed for
    nodes: tuple[str, ...]
    victims: tuple[int, ...]
    requeued_at: float
    cycles_since_end: int = 0  # cycles that saw every victim off the nodes while the job waited


@dataclass(frozen=True)
class RoomOutcome:
    room: FreedRoom
    outcome: str  # LANDED | WASTED | GONE
    why: str


def requeues_by_outcome(settled: Iterable[RoomOutcome]) -> Counter[str]:
    """Settled preemptions counted in requeues (a room's victims), as the replay counts them."""
    counts: Counter[str] = Counter()
    for outcome in settled:
        counts[outcome.outcome] += len(outcome.room.victims)
    return counts


def follow_rooms(rooms: Iterable[FreedRoom], jobs: Mapping[int, Job]) -> tuple[list[FreedRoom], list[RoomOutcome]]:
    """The rooms still open after this cycle's look at the queue, and the outcomes settled now."""
    still_open: list[FreedRoom] = []
    settled: list[RoomOutcome] = []
    for room in rooms:
        job = jobs.get(room.job_id)
        freed = ",".join(room.nodes)
        if job is None:
            settled.append(RoomOutcome(room, GONE, f"job {room.job_id} left the queue before a cycle saw it run"))
        elif job.state is JobState.RUNNING:
            if set(job.nodes) <= set(room.nodes):
                settled.append(RoomOutcome(room, LANDED, f"job {room.job_id} started on {freed}, freed for it"))
            else:
                settled.append(RoomOutcome(room, WASTED, f"job {room.job_id} started on {','.join(job.nodes)}, "
                                                         f"not on {freed}, freed for it"))
        elif not job.state.is_active:
            settled.append(RoomOutcome(room, GONE, f"job {room.job_id} ended ({job.state.value}) without starting"))
        elif _victims_hold(room, jobs):
            still_open.append(replace(room, cycles_since_end=0))
        elif room.cycles_since_end + 1 > WASTED_AFTER_CYCLES:
            settled.append(RoomOutcome(room, WASTED, f"job {room.job_id} still waits {WASTED_AFTER_CYCLES} cycles "
                                                     f"after its victims left {freed}"))
        else:
            still_open.append(replace(room, cycles_since_end=room.cycles_since_end + 1))
    return still_open, settled


def _victims_hold(room: FreedRoom, jobs: Mapping[int, Job]) -> bool:
    """Whether a victim still runs on the freed nodes (a grace signal, or its epilog)."""
    nodes = set(room.nodes)
    for victim in room.victims:
        job = jobs.get(victim)
        if job is not None and job.state is JobState.RUNNING and nodes & set(job.nodes):
            return True
    return False
