"""The rooms preemptions free in the replay, followed until they land or are wasted, by the rule
the live engine follows (dike_slurm/domain/freed_rooms.py): a room lands when the job it was freed for
starts on its nodes, and is wasted when that job starts elsewhere or still waits
`WASTED_AFTER_CYCLES` cycles after the victims' end (here the requeue itself; the live engine
first sees it at its next cycle, hence the +1)."""

from __future__ import annotations

from collections.abc import Sequence

from dike_slurm.domain.decisions import Decisions, SetPlacement
from dike_slurm.domain.freed_rooms import WASTED_AFTER_CYCLES
from dike_slurm.sim.kernel.job import SimJob
from dike_slurm.sim.kernel.records import SimStats


class FreedRooms:
    """beneficiary -> (the nodes freed for it, victims, the cycle by which it must have started)."""

    def __init__(self, names: Sequence[str], stats: SimStats) -> None:
        self.names = names  # node index -> name
        self.stats = stats
        self.rooms: dict[int, tuple[frozenset[str], int, int]] = {}

    def __bool__(self) -> bool:
        return bool(self.rooms)

    def freed(self, beneficiary: int, decisions: Decisions) -> None:
        """One more victim was requeued for `beneficiary`, on the nodes the decisions pin it to."""
        pin = decisions.placement_of(beneficiary)
        nodes = frozenset(pin.placement.require_nodes) if isinstance(pin, SetPlacement) else frozenset()
        _, victims, _ = self.rooms.get(beneficiary, (None, 0, 0))
        self.rooms[beneficiary] = (nodes, victims + 1, self.stats.cycles + 1 + WASTED_AFTER_CYCLES)

    def pinned(self, job: SimJob) -> bool:
        """A preemption freed nodes for the job, it has not started, and it is pinned to them."""
        room = self.rooms.get(job.trace.job_id)
        return room is not None and room[0] == frozenset(job.placement.require_nodes)

    def settle(self, job: SimJob, nodes: list[int]) -> None:
        """The job starts on `nodes`: its room, if any, landed or was wasted."""
        room = self.rooms.pop(job.trace.job_id, None)
        if room is None:
            return
        names = {self.names[n] for n in nodes}
        if room[0] and names <= room[0]:
            self.stats.landed_preemptions += room[1]
        else:
            self.stats.wasted_preemptions += room[1]

    def expire(self) -> list[int]:
        """The rooms whose job did not start in time are wasted; returns those jobs."""
        cycles = self.stats.cycles
        expired = [j for j, (_, _, due) in self.rooms.items() if due <= cycles]
        for job_id in expired:
            self.stats.wasted_preemptions += self.rooms.pop(job_id)[1]
        return expired
