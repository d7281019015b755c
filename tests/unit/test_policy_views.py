"""Equivalence of the one-pass placement helpers with the plain per-question references.

`ClusterView` answers four questions from one walk over the nodes, `Consolidator` works out
per cluster what `consolidation` once worked out per job, and the preemption planner's
`NodeLedger` and `VictimOrder` keep answers for the plan's life. The references below are the plain
versions they replaced; hypothesis checks that the optimised ones give the same answers.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from dike_slurm.domain.decisions import ClearPlacement, SetPlacement
from dike_slurm.domain.model import Job, JobState, Node, Placement, Snapshot, Switch, Topology, may_use_gpus
from dike_slurm.policies.common import ClusterView, Consolidator, leaf_capacity_and_free
from dike_slurm.policies.preemption import NodeLedger, VictimOrder

STATES = ("IDLE", "MIXED", "ALLOCATED", "DRAIN", "DOWN+DRAIN", "MIXED+DRAIN", "IDLE+NOT_RESPONDING")


def reference_capacity(snapshot: Snapshot) -> dict[str, int]:
    capacity: dict[str, int] = {}
    for node in snapshot.nodes:
        if node.available:
            leaf = snapshot.topology.leaf_of(node.name)
            capacity[leaf] = capacity.get(leaf, 0) + node.gpus
    return capacity


def reference_free(snapshot: Snapshot) -> dict[str, int]:
    free: dict[str, int] = {}
    for node in snapshot.nodes:
        leaf = snapshot.topology.leaf_of(node.name)
        free[leaf] = free.get(leaf, 0) + node.gpus_free
    return free


def reference_exclusions(snapshot: Snapshot) -> tuple[str, ...]:
    """Nodes of entirely idle leaves (switches in the tree only)."""
    idle_leaf: dict[str, bool] = {}
    members: dict[str, list[str]] = {}
    for node in snapshot.nodes:
        leaf = snapshot.topology.leaf_of(node.name)
        members.setdefault(leaf, []).append(node.name)
        idle_leaf[leaf] = idle_leaf.get(leaf, True) and node.available and node.gpus_alloc == 0
    excluded: list[str] = []
    for leaf, idle in sorted(idle_leaf.items()):
        if idle and not leaf.startswith("~"):
            excluded.extend(sorted(members[leaf]))
    return tuple(excluded)


def reference_largest_free(snapshot: Snapshot, excluded: frozenset[str]) -> dict[str, int]:
    best: dict[str, int] = {"": 0}
    for node in snapshot.nodes:
        if node.name in excluded:
            continue
        free = node.gpus_free
        best[""] = max(best[""], free)
        for partition in node.partitions:
            best[partition] = max(best.get(partition, 0), free)
    return best


def reference_consolidation(
    job: Job, now: float, capacity, free_by_leaf, wait_s: int, mode: str, prefix: str, reason: str
) -> SetPlacement | ClearPlacement | None:
    biggest = max(capacity.values(), default=0)
    count = 1 if biggest <= 0 else max(1, math.ceil(job.gpus / biggest))
    if mode == "switches":
        return SetPlacement(job.job_id, Placement(max_switches=count, switches_wait_s=wait_s), reason)
    if job.waiting_s(now) >= wait_s or count > 1:
        if job.placement.features:
            return ClearPlacement(job.job_id, f"consolidation wait {wait_s}s passed; relaxed")
        return None
    if job.placement.features and job.placement.features.startswith(prefix):
        return SetPlacement(job.job_id, job.placement, reason)
    fitting = [leaf for leaf, cap in capacity.items() if cap >= job.gpus and not leaf.startswith("~")]
    if not fitting:
        return None
    best = max(fitting, key=lambda leaf: (free_by_leaf.get(leaf, 0), leaf))
    return SetPlacement(job.job_id, Placement(features=f"{prefix}{best}"), reason)


@st.composite
def clusters(draw) -> Snapshot:
    """Up to 12 nodes, some outside the switch tree, of mixed sizes, states and partitions."""
    count = draw(st.integers(1, 12))
    nodes = []
    for i in range(count):
        gpus = draw(st.sampled_from((0, 4, 8)))
        nodes.append(
            Node(
                f"n{i}", gpus, draw(st.integers(0, gpus + 2)), 16, draw(st.sampled_from(STATES)),
                partitions=tuple(draw(st.lists(st.sampled_from(("gpu", "debug", "big")), max_size=2, unique=True))),
            )
        )
    leaves = draw(st.integers(1, 4))
    members: dict[int, list[str]] = {}
    for node in nodes:
        leaf = draw(st.integers(0, leaves))  # `leaves` = outside the tree
        if leaf < leaves:
            members.setdefault(leaf, []).append(node.name)
    switches = [Switch(f"s{leaf}", tuple(names)) for leaf, names in sorted(members.items())]
    topology = Topology.from_switches(switches) if switches else Topology.from_switches([])
    return Snapshot(time=1_000_000.0, jobs=(), nodes=tuple(nodes), topology=topology, user_usage_gpu_s={})


@settings(max_examples=300, deadline=None)
@given(clusters(), st.booleans())
def test_cluster_view_equals_the_four_plain_walks(snapshot, steer):
    view = ClusterView(snapshot, steer)
    assert view.capacity == reference_capacity(snapshot)
    assert view.free_by_leaf == reference_free(snapshot)
    excluded = reference_exclusions(snapshot) if steer else ()
    assert view.excluded == excluded
    assert view.largest_free == reference_largest_free(snapshot, frozenset(excluded))
    assert leaf_capacity_and_free(snapshot) == (view.capacity, view.free_by_leaf)


@settings(max_examples=300, deadline=None)
@given(
    clusters(),
    st.lists(
        st.tuples(st.integers(1, 64), st.integers(0, 7200), st.sampled_from((None, "leaf_s0", "leaf_s1", "other"))),
        min_size=1, max_size=6,
    ),
    st.sampled_from(("switches", "leaf_feature")),
    st.integers(0, 3600),
)
def test_consolidator_equals_the_per_job_reference(snapshot, shapes, mode, wait_s):
    capacity, free_by_leaf = leaf_capacity_and_free(snapshot)
    consolidator = Consolidator(capacity, free_by_leaf, wait_s, mode, "leaf_")
    for job_id, (gpus, waited, feature) in enumerate(shapes, start=1):
        job = Job(
            job_id, "alice", JobState.PENDING, snapshot.time - waited, gpus=gpus, num_nodes=max(1, -(-gpus // 8)),
            placement=Placement(features=feature),
        )
        expected = reference_consolidation(job, snapshot.time, capacity, free_by_leaf, wait_s, mode, "leaf_", "why")
        assert consolidator.decide(job, snapshot.time, "why") == expected


def reference_usable(snapshot: Snapshot, job: Job, honour_exclusions: bool) -> list[int]:
    """The nodes a job may use, worked out afresh for every question (as NodeLedger once did)."""
    excluded = set(job.placement.exclude_nodes) if honour_exclusions else set()
    required = set(job.placement.require_nodes)
    return [
        i for i, node in enumerate(snapshot.nodes)
        if (node.gpus if node.available else 0) >= job.gpus_per_node
        and (not job.partition or not node.partitions or job.partition in node.partitions)
        and node.name not in excluded
        and (not required or node.name in required)
        and (not job.gpu_types or may_use_gpus(job.gpu_types, node.gpu_types))
    ]


@settings(max_examples=300, deadline=None)
@given(clusters(), st.data())
def test_the_ledgers_kept_answers_and_victim_order_equal_the_plain_walks(snapshot, data):
    """NodeLedger keeps each usable-nodes answer for the plan's life and VictimOrder sorts each
    node's victims once: the same answers as asking afresh, and as sorting the filtered victims by
    (loss, job id) for every blocked job (plan_preemptions did that before)."""
    names = [node.name for node in snapshot.nodes]
    running = []
    for job_id in range(1, data.draw(st.integers(0, 8)) + 1):
        on = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))
        running.append(Job(job_id, "alice", JobState.RUNNING, 0.0, gpus=4 * len(on), num_nodes=len(on),
                           nodes=tuple(on), start_time=data.draw(st.sampled_from((0.0, 900.0, 1800.0)))))  # equal losses
    ledger = NodeLedger(snapshot, running)
    asked = data.draw(st.lists(st.tuples(
        st.integers(1, 16), st.integers(1, 2), st.sampled_from(("", "gpu", "big")),
        st.lists(st.sampled_from(names), max_size=3), st.lists(st.sampled_from(names), max_size=2),
        st.sampled_from(((), ("a100",))), st.booleans()), min_size=1, max_size=6))
    for gpus, count, partition, exclude, require, types, honour in asked * 2:  # the second round: kept answers
        job = Job(99, "bob", JobState.PENDING, 0.0, gpus=gpus, num_nodes=count, partition=partition, gpu_types=types,
                  placement=Placement(exclude_nodes=tuple(exclude), require_nodes=tuple(require)))
        assert list(ledger.usable(job, honour)) == reference_usable(snapshot, job, honour)

    preemptible = frozenset(data.draw(st.sets(st.sampled_from([job.job_id for job in running]))) if running else ())
    taken = data.draw(st.sets(st.integers(1, 8)))
    measure = {job.job_id: data.draw(st.integers(0, 3)) for job in running} | {99: data.draw(st.integers(0, 3))}

    def loss(victim: Job) -> float:
        return victim.gpus * ((snapshot.time - victim.start_time) % 1800)

    order = VictimOrder(ledger, preemptible, loss)
    for node in list(range(len(names))) * 2:  # the second round: the kept order
        expected = sorted(
            (v for v in ledger.jobs_on[node]
             if v.job_id in preemptible and v.job_id not in taken and measure[99] < measure[v.job_id]),
            key=lambda v: (loss(v), v.job_id),
        )
        kept = [(cost, v) for cost, v in order.on(node) if v.job_id not in taken and measure[99] < measure[v.job_id]]
        assert [v for _, v in kept] == expected and [cost for cost, _ in kept] == [loss(v) for v in expected]
