"""Building blocks shared by the policies: submit order, fairness, communication class, placement."""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Literal

from pydantic import BaseModel, ConfigDict

from dike_slurm.domain.decisions import ClearPlacement, SetPlacement
from dike_slurm.domain.model import Job, JobState, Placement, Snapshot

COMMENT_TAG = re.compile(r"dike:comm=(high|low)\b", re.IGNORECASE)
JOB_ID = attrgetter("job_id")
SUBMIT_TIME = attrgetter("submit_time")


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of an ascending sequence (q in [0, 1])."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def usage_fractions(usage: Mapping[str, float], owners: Sequence[str]) -> dict[str, float]:
    """Each owner's share of the total decayed usage (0 for owners with none)."""
    total = sum(max(0.0, usage.get(o, 0.0)) for o in set(owners) | set(usage))
    unique = dict.fromkeys(owners)  # the same keys in the same order, each worked out once
    if total <= 0:
        return {o: 0.0 for o in unique}
    return {o: max(0.0, usage.get(o, 0.0)) / total for o in unique}


def share_fractions(shares: Mapping[str, float], owners: Sequence[str]) -> dict[str, float]:
    """Each owner's normalised fair share among the given owners (default share 1)."""
    unique = sorted(set(owners))
    raw = {o: max(0.0, shares.get(o, 1.0)) for o in unique}
    total = sum(raw.values()) or 1.0
    return {o: raw[o] / total for o in unique}


def submit_order(jobs: Iterable[Job]) -> list[Job]:
    """The jobs sorted by (submit_time, job_id): two stable sorts on one key each, which is the
    same order as one sort on the pair (job ids are unique) and about 3x faster than building a
    tuple per job."""
    ordered = sorted(jobs, key=JOB_ID)
    ordered.sort(key=SUBMIT_TIME)
    return ordered


def split_active(snapshot: Snapshot) -> tuple[tuple[Job, ...], tuple[Job, ...]]:
    """(pending, running) in snapshot order: `snapshot.pending` and `.running` in one pass."""
    jobs, pending_state, running_state = snapshot.jobs, JobState.PENDING, JobState.RUNNING
    # two comprehensions are about twice as fast as one loop that appends to either list
    return tuple([j for j in jobs if j.state is pending_state]), tuple([j for j in jobs if j.state is running_state])


def owners_of(jobs: Sequence[Job], by: str) -> list[str]:
    """Each job's fair-share owner: its account when `by` is "account", else its user."""
    return [j.account for j in jobs] if by == "account" else [j.user for j in jobs]


class CommRule(BaseModel):
    """Tags jobs as communication-heavy or light by partition, account or job-name glob."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    comm: Literal["high", "low"]
    partition: str | None = None
    account: str | None = None
    name_pattern: str | None = None

    def matches(self, job: Job) -> bool:
        if self.partition is None and self.account is None and self.name_pattern is None:
            return False
        return (
            (self.partition is None or job.partition == self.partition)
            and (self.account is None or job.account == self.account)
            and (self.name_pattern is None or fnmatch.fnmatchcase(job.name, self.name_pattern))
        )


def is_comm_heavy(job: Job, comm_gpus: int, rules: Sequence[CommRule]) -> bool:
    """Comment tag first, then the first matching rule, then size (several nodes or many GPUs)."""
    comment = job.comment
    if comment:  # most jobs have none: skip the regex (an empty comment never matches)
        tag = COMMENT_TAG.search(comment)
        if tag:
            return tag.group(1).lower() == "high"
    for rule in rules:
        if rule.matches(job):
            return rule.comm == "high"
    return job.num_nodes > 1 or job.gpus >= comm_gpus


def leaf_capacity_and_free(snapshot: Snapshot) -> tuple[dict[str, int], dict[str, int]]:
    """(GPUs under each available leaf's nodes, free GPUs under each leaf) from one pass over the nodes.

    Nodes outside the switch tree are a leaf of their own (`Topology.leaf_of`)."""
    leaf_of = snapshot.topology.leaf_of
    capacity: dict[str, int] = {}
    free_by_leaf: dict[str, int] = {}
    for node in snapshot.nodes:
        leaf = leaf_of(node.name)
        free = 0
        if node.available:
            capacity[leaf] = capacity.get(leaf, 0) + node.gpus
            free = node.gpus - node.gpus_alloc
            if free < 0:
                free = 0
        free_by_leaf[leaf] = free_by_leaf.get(leaf, 0) + free
    return capacity, free_by_leaf


class ClusterView:
    """What the placement helpers read from the nodes, from one pass over them.

    `capacity` and `free_by_leaf` are `leaf_capacity_and_free`; `excluded` (empty unless `steer`)
    are the nodes of entirely idle leaves, which light jobs are steered away from to keep whole
    leaves for heavy jobs; `largest_free` is, per partition ("" = any), the most free GPUs on one
    node outside those. tests/unit/test_policy_views.py checks it against plain per-question walks.
    """

    __slots__ = ("capacity", "free_by_leaf", "excluded", "largest_free", "_nodes", "_typed")

    def __init__(self, snapshot: Snapshot, steer: bool) -> None:
        self._nodes = snapshot.nodes
        self._typed: dict[tuple[str, str], int] | None = None  # built on the first typed job's question
        leaf_of = snapshot.topology.leaf_of
        capacity: dict[str, int] = {}
        free_by_leaf: dict[str, int] = {}
        members: dict[str, list[str]] = {}
        idle_leaf: dict[str, bool] = {}
        best_by_leaf: dict[str, dict[str, int]] = {}  # leaf -> partition ("" = any) -> most free GPUs on a node
        for node in snapshot.nodes:
            leaf = leaf_of(node.name)
            available = node.available
            free = 0
            if available:
                capacity[leaf] = capacity.get(leaf, 0) + node.gpus
                free = node.gpus - node.gpus_alloc
                if free < 0:
                    free = 0
            free_by_leaf[leaf] = free_by_leaf.get(leaf, 0) + free
            if leaf in members:
                members[leaf].append(node.name)
                idle_leaf[leaf] = idle_leaf[leaf] and available and node.gpus_alloc == 0
                best = best_by_leaf[leaf]
            else:
                members[leaf] = [node.name]
                idle_leaf[leaf] = available and node.gpus_alloc == 0
                best = best_by_leaf[leaf] = {"": 0}
            if free > best[""]:
                best[""] = free
            for partition in node.partitions:
                if free > best.get(partition, 0):
                    best[partition] = free
                elif partition not in best:
                    best[partition] = 0
        excluded: list[str] = []
        excluded_leaves: set[str] = set()
        if steer:
            for leaf, idle in sorted(idle_leaf.items()):
                if idle and not leaf.startswith("~"):
                    excluded.extend(sorted(members[leaf]))
                    excluded_leaves.add(leaf)
        largest_free: dict[str, int] = {"": 0}
        for leaf, best in best_by_leaf.items():
            if leaf in excluded_leaves:
                continue
            for partition, free in best.items():
                if free > largest_free.get(partition, 0):
                    largest_free[partition] = free
                elif partition not in largest_free:
                    largest_free[partition] = 0
        self.capacity = capacity
        self.free_by_leaf = free_by_leaf
        self.excluded = tuple(excluded)
        self.largest_free = largest_free

    def fits_fragmented(self, job: Job) -> bool:
        """Whether a one-node job fits now on some node outside the excluded set; a typed job on a
        node of its types (steering never sends it where its type is not)."""
        if not fits_fragmented(job, self.largest_free):
            return False
        if not job.gpu_types:
            return True
        typed = self._typed
        if typed is None:
            typed = self._typed = {}
            excluded = frozenset(self.excluded)
            for node in self._nodes:
                if node.name in excluded or not node.available:
                    continue
                free = max(0, node.gpus - node.gpus_alloc)
                for gpu_type in node.gpu_types:
                    for partition in ("", *node.partitions):
                        if free > typed.get((partition, gpu_type), -1):
                            typed[(partition, gpu_type)] = free
        partition = job.partition if job.partition in self.largest_free else ""
        return any(job.gpus_per_node <= typed.get((partition, t), -1) for t in job.gpu_types)


def switches_needed(job: Job, capacity: Mapping[str, int], biggest: int | None = None) -> int:
    """The fewest leaf switches that could hold the job (`biggest`: the largest capacity, if known)."""
    if biggest is None:
        biggest = max(capacity.values(), default=0)
    if biggest <= 0:
        return 1
    return max(1, math.ceil(job.gpus / biggest))


class Consolidator:
    """Consolidate heavy pending jobs under as few leaves as possible, relaxed after `wait_s`.

    `switches` mode writes Slurm's Switches=N@wait, which Slurm relaxes by itself after the wait.
    `leaf_feature` mode pins a leaf through its feature and is cleared here once the wait passed.
    What depends only on the cluster (largest leaf, best leaf per job size, the Placement of each
    switch count) is worked out once per snapshot, not once per job (O(pending x leaves));
    tests/unit/test_policy_views.py checks it against the per-job reference."""

    def __init__(
        self,
        capacity: Mapping[str, int],
        free_by_leaf: Mapping[str, int],
        wait_s: int,
        mode: str,
        leaf_feature_prefix: str,
    ) -> None:
        self.capacity = capacity
        self.free_by_leaf = free_by_leaf
        self.wait_s = wait_s
        self.mode = mode
        self.prefix = leaf_feature_prefix
        self.biggest = max(capacity.values(), default=0)
        self._switches: dict[int, Placement] = {}  # leaf count -> Switches=count@wait
        self._leaf: dict[int, Placement | None] = {}  # GPUs -> feature of the best fitting leaf

    def decide(self, job: Job, now: float, reason: str) -> SetPlacement | ClearPlacement | None:
        count = switches_needed(job, self.capacity, self.biggest)
        if self.mode == "switches":
            placement = self._switches.get(count)
            if placement is None:
                placement = self._switches[count] = Placement(max_switches=count, switches_wait_s=self.wait_s)
            return SetPlacement(job.job_id, placement, reason)
        waited = job.waiting_s(now)
        if waited >= self.wait_s or count > 1:
            if job.placement.features:
                return ClearPlacement(job.job_id, f"consolidation wait {self.wait_s}s passed; relaxed")
            return None
        if job.placement.features and job.placement.features.startswith(self.prefix):
            return SetPlacement(job.job_id, job.placement, reason)  # keep the leaf chosen earlier
        gpus = job.gpus
        if gpus in self._leaf:
            placement = self._leaf[gpus]
        else:
            fitting = [leaf for leaf, cap in self.capacity.items() if cap >= gpus and not leaf.startswith("~")]
            placement = None
            if fitting:
                best = max(fitting, key=lambda leaf: (self.free_by_leaf.get(leaf, 0), leaf))
                placement = Placement(features=f"{self.prefix}{best}")
            self._leaf[gpus] = placement
        if placement is None:
            return None
        return SetPlacement(job.job_id, placement, reason)


def fits_fragmented(job: Job, largest_free: Mapping[str, int]) -> bool:
    """Whether a one-node job fits now on some node outside the excluded set."""
    room = largest_free.get(job.partition, 0) if job.partition in largest_free else largest_free[""]
    return job.gpus_per_node <= room
