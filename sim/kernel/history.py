"""The GPU service of recently finished jobs, sorted, cheap both to change and to hand over.

Every policy cycle hands the snapshot the sorted service of the jobs finished in the history
window (Dike derives its thresholds from its quantiles). A sorted list copied into a tuple per
cycle costs O(window) per cycle: in a million-job replay the 30-day window holds ~290,000 jobs
and that copy, with the list's O(window) inserts and deletes, took most of Dike's replay time.
Here the values sit in immutable sorted blocks of at most 2 x BLOCK: a change copies one block,
and a view copies only the list of blocks; a view never changes after it is taken.

`FinishedService` keeps the finished jobs of the window: their sorted service, and the service
prior learned from the same jobs, each for a policy that reads it.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Iterator, Sequence
from typing import overload

from dike_slurm.domain.service_prior import FinishedJob, PriorLearner, never_ran
from dike_slurm.sim.kernel.trace import TraceJob

BLOCK = 512


class SortedView(Sequence[float]):
    """An immutable ascending sequence over blocks (what `Snapshot.completed_service_gpu_s` holds in
    the simulator: an `AscendingValues`)."""

    __slots__ = ("_blocks", "_starts", "_maxes", "_length")

    def __init__(self, blocks: tuple[tuple[float, ...], ...]) -> None:
        self._blocks = blocks
        starts, total = [], 0
        for block in blocks:
            starts.append(total)
            total += len(block)
        self._starts = starts
        self._maxes = [block[-1] for block in blocks]
        self._length = total

    def count_at_most(self, value: float) -> int:
        """How many values are <= value: two C-level bisections, the blocks' last values then one block."""
        index = bisect.bisect_right(self._maxes, value)  # every block before it is <= value
        if index == len(self._blocks):
            return self._length
        return self._starts[index] + bisect.bisect_right(self._blocks[index], value)

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> float: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[float, ...]: ...

    def __getitem__(self, index: int | slice) -> float | tuple[float, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("SortedView index out of range")
        block = bisect.bisect_right(self._starts, index) - 1
        return self._blocks[block][index - self._starts[block]]

    def __iter__(self) -> Iterator[float]:
        return itertools.chain.from_iterable(self._blocks)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == self._length and tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to tuples, so not hashable like them

    def __repr__(self) -> str:
        return f"SortedView({list(self)!r})"


class SortedBlocks:
    """A sorted multiset of floats with O(BLOCK + log n) add and remove, and O(n / BLOCK) views."""

    def __init__(self) -> None:
        self._blocks: list[tuple[float, ...]] = []
        self._maxes: list[float] = []  # the last value of each block
        self._view: SortedView | None = SortedView(())

    def __len__(self) -> int:
        return sum(len(block) for block in self._blocks)

    def add(self, value: float) -> None:
        self._view = None
        if not self._blocks:
            self._blocks.append((value,))
            self._maxes.append(value)
            return
        index = min(bisect.bisect_left(self._maxes, value), len(self._blocks) - 1)
        block = self._blocks[index]
        at = bisect.bisect_right(block, value)
        grown = block[:at] + (value,) + block[at:]
        if len(grown) > 2 * BLOCK:
            self._blocks[index: index + 1] = [grown[:BLOCK], grown[BLOCK:]]
            self._maxes[index: index + 1] = [grown[BLOCK - 1], grown[-1]]
        else:
            self._blocks[index] = grown
            self._maxes[index] = grown[-1]

    def remove(self, value: float) -> None:
        """Remove one occurrence of `value` (ValueError when there is none)."""
        index = bisect.bisect_left(self._maxes, value)
        if index == len(self._blocks):
            raise ValueError(f"{value!r} is not in the history")
        block = self._blocks[index]
        at = bisect.bisect_left(block, value)
        if at == len(block) or block[at] != value:
            raise ValueError(f"{value!r} is not in the history")
        self._view = None
        shrunk = block[:at] + block[at + 1:]
        if len(shrunk) < BLOCK // 4 and index + 1 < len(self._blocks):  # keep blocks from dwindling
            merged = shrunk + self._blocks[index + 1]
            if len(merged) <= 2 * BLOCK:
                del self._blocks[index + 1]
                del self._maxes[index + 1]
                shrunk = merged
        if shrunk:
            self._blocks[index] = shrunk
            self._maxes[index] = shrunk[-1]
        else:
            del self._blocks[index]
            del self._maxes[index]

    def view(self) -> SortedView:
        """The values now, ascending; later changes do not show in it."""
        if self._view is None:
            self._view = SortedView(tuple(self._blocks))
        return self._view


class FinishedService:
    """The jobs finished within the history window: their GPU service, sorted (`keeps_service`:
    for a policy that reads it), and the service prior learned from them (`prior`: for a policy
    that reads one)."""

    def __init__(self, window_s: float, keeps_service: bool, prior: PriorLearner | None) -> None:
        self.window_s = window_s
        self.keeps_service = keeps_service
        self.prior = prior
        self.service = SortedBlocks()
        self.ends: deque[tuple[float, float]] = deque()  # (end, GPU service) in end order
        self.prior_jobs: deque[FinishedJob] = deque()  # in end order

    def add(self, end: float, trace: TraceJob, attained: float) -> None:
        """A job finished at `end` with `attained` GPU service."""
        if self.keeps_service:
            self.ends.append((end, attained))
            self.service.add(attained)
        if self.prior is not None:
            run_s = attained / trace.gpus if trace.gpus else 0.0
            finished = FinishedJob(trace.user, trace.name, trace.gpus, run_s, end, never_ran(trace.final_state, run_s))
            self.prior.add(finished)
            self.prior_jobs.append(finished)

    def forget(self, now: float) -> None:
        """Jobs that ended more than the window ago leave it."""
        horizon = now - self.window_s
        while self.ends and self.ends[0][0] < horizon:
            _, oldest = self.ends.popleft()
            self.service.remove(oldest)
        if self.prior is not None:
            while self.prior_jobs and self.prior_jobs[0].end < horizon:
                self.prior.remove(self.prior_jobs.popleft())
