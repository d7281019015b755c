"""A preemption must land: the nodes it frees go to the job they were freed for (issue 25).

The replay, on Slurm's priority with the lab's weights (slurm-lab: age 1,000 over 30 min, fair
share 10,000, job size 1,000, GRES/gpu 1,000): one 8-GPU node runs a level-1 job; a 1-GPU level-0
job B and four 2-GPU level-0 jobs of the same user arrive a second apart. Dike ranks B first (it
waited a second longer) and preempts the running job for it. At B's value and theirs, a few
units apart, Slurm's own factors put the 2-GPU jobs first (GRES/gpu and job size count their
GPUs and CPUs), so without protection they take the freed node and the preemption is wasted.
"""

from __future__ import annotations

import pytest

from dike_slurm.domain.model import Topology
from dike_slurm.slurm.slurm_conf import parse_slurm_conf
from dike_slurm.policies.dike import DikeParams, DikePolicy
from dike_slurm.policies.preemption import plan_preemptions
from dike_slurm.sim.kernel.cluster import SimCluster
from dike_slurm.sim.kernel.records import JobResult, SimSettings, Timeline
from dike_slurm.sim.kernel.simulator import Simulator
from dike_slurm.sim.kernel.trace import TraceJob
from dike_slurm.domain.slurm_priority import (
    PartitionPriority,
    PriorityWeights,
    SlurmPriorityModel,
    protection_reserve,
)

ONE_NODE = "NodeName=n1 Gres=gpu:8 CPUs=64\nPartitionName=gpu Nodes=n1 Default=YES MaxTime=INFINITE\n"
# invented for this test: the lab's weights (scripts/slurm-lab) on a one-node cluster
LAB_WEIGHTS = SlurmPriorityModel(
    weights=PriorityWeights(age=1000, fairshare=10000, job_size=1000, tres={"gres/gpu": 1000}, max_age_s=1800),
    qos_priority={}, partitions={"gpu": PartitionPriority()}, node_count=1, cluster_cpus=64,
    partition_tres={"gpu": {"cpu": 64, "node": 1, "gres/gpu": 8}}, source="invented: the lab's weights",
)
B = 2


def job(job_id: int, submit: float, gpus: int, duration: float, cpus: int) -> TraceJob:
    return TraceJob(job_id=job_id, display_id=str(job_id), user="alice", account="research", partition="gpu",
                    qos="normal", name=f"job{job_id}", comment="", submit=submit, eligible_delay_s=0.0,
                    duration_s=duration, time_limit_s=None, gpus=gpus, num_nodes=1, cpus=cpus)


def replay(protect: bool) -> tuple[dict[int, JobResult], Simulator]:
    trace = [job(1, 0, 8, 20000, 8), job(B, 2000, 1, 600, 1)] + [job(10 + i, 2001, 2, 3000, 2) for i in range(4)]
    results: dict[int, JobResult] = {}
    settings = SimSettings(priority_model=LAB_WEIGHTS, priority_reserve=protection_reserve(LAB_WEIGHTS),
                           preemptible=1.0, restart_cost_s=0.0, checkpoint_interval_s=0.0)
    simulator = Simulator(trace, SimCluster(parse_slurm_conf(ONE_NODE), Topology()), DikePolicy(),
                          DikeParams(protect_freed_nodes=protect), settings, Timeline(origin=0.0, width=60.0),
                          lambda result: results.__setitem__(result.job_id, result))
    simulator.run()
    return results, simulator


@pytest.mark.parametrize("protect", [False, True])
def test_the_room_a_preemption_frees_goes_to_the_job_it_was_freed_for_only_when_protected(protect):
    results, simulator = replay(protect)
    stats = simulator.stats
    first_pass = 2040.0  # the policy cycle after B's arrival, and the scheduler pass it triggers
    if protect:
        assert (stats.preemptions, stats.landed_preemptions, stats.wasted_preemptions) == (1, 1, 0)
        assert results[B].start == first_pass and results[1].preemptions == 1
        assert sum(results[10 + i].start == first_pass for i in range(4)) == 3  # the rest of the node
    else:
        # the 2-GPU jobs take the whole freed node; B waits until one of them has run
        # min_runtime_s (1800 s) at level 1, and a second preemption makes room for it
        assert (stats.preemptions, stats.landed_preemptions, stats.wasted_preemptions) == (2, 1, 1)
        assert all(results[10 + i].start == first_pass for i in range(4))
        assert results[B].start == first_pass + 1800


def test_the_reserve_keeps_a_protected_job_above_any_other_of_its_tier():
    """With every other factor at its most for the others and at 0 for it, a protected job (the
    top of the span) still comes first: the others are written at most span - reserve."""
    span, reserve = 1_000_000, protection_reserve(LAB_WEIGHTS)
    assert reserve == 13_001  # age + fair share + job size + GRES/gpu, plus 1
    assert span + 0 > (span - reserve) + LAB_WEIGHTS.weights.others_total


def test_a_higher_tiers_blocked_job_is_not_passed_over_by_a_preemption():
    """A blocked urgent job that preemption cannot help (no victim it outranks) keeps a normal
    job from preempting: Slurm would give what is freed to the urgent job."""
    from dike_slurm.domain.model import Job, JobState, Node, Snapshot
    from dike_slurm.policies.preemption import PreemptionLimits

    tiers = SlurmPriorityModel(
        weights=PriorityWeights(qos=1_000_000), qos_priority={"normal": 0, "urgent": 1},
        partitions={"gpu": PartitionPriority()}, node_count=1, cluster_cpus=64, partition_tres={},
    )
    running = Job(1, "bob", JobState.RUNNING, 0.0, gpus=8, nodes=("n1",), start_time=0.0, requeueable=True)
    urgent = Job(2, "carol", JobState.PENDING, 10.0, gpus=8, qos="urgent", partition="gpu")
    normal = Job(3, "alice", JobState.PENDING, 20.0, gpus=8, qos="normal", partition="gpu")
    snapshot = Snapshot(100.0, (running, urgent, normal), (Node("n1", 8, 8, 64, "ALLOCATED", (), ("gpu",)),),
                        site_priority=tiers)

    def plan(protect: bool):
        return plan_preemptions(
            snapshot, [normal, urgent], [running], outranks=lambda blocked, victim: blocked is normal,
            may_preempt=lambda victim: True, loss=lambda victim: 0.0, one_leaf=lambda job: False,
            limits=PreemptionLimits(max_requeues=4), reason=lambda blocked, victim: "test", protect=protect)

    assert [r.for_job for r in plan(False).requeues] == [3]  # unprotected: for the normal job, as before
    protected = plan(True)
    assert protected.requeues == () and protected.protected == ()


def test_decisions_rank_protected_jobs_first_and_the_engine_writes_them_the_top():
    from dike_slurm.domain.decisions import Decisions, SetPriority
    from dike_slurm.cycle.priority_scale import wanted_value

    decisions = Decisions((SetPriority(1, 0, 2.9, "a"), SetPriority(2, 0, 2.5, "b"), SetPriority(3, 1, 1.2, "c")),
                          protected=(2,))
    assert decisions.order() == (2, 1, 3)
    values = {d.job_id: wanted_value(d, {2}, 3.0, 1_000_000, 13_001) for d in decisions.priorities}
    assert values[2] == 1_000_000 and values[1] <= 1_000_000 - 13_001 and values[1] > values[3]


def test_the_requeue_cap_unprotects_only_the_jobs_whose_requeues_it_refused():
    """The engine's cap keeps the first blocked job's victims and refuses the second's: the first
    job stays protected (its room is being freed), and so does a job protected for an earlier
    cycle's room; only the refused one is not (nothing is freed for it)."""
    from dike_slurm.domain.decisions import Decisions, Requeue, SetPlacement
    from dike_slurm.domain.model import Job, JobState, Placement
    from dike_slurm.cycle.requeue_guard import RequeueLimits, guard_requeues

    victims = {v: Job(job_id=v, user="u", state=JobState.RUNNING, submit_time=0.0, gpus=8, start_time=0.0,
                      requeueable=True, nodes=(f"n{v}",)) for v in (1, 2)}
    decisions = Decisions(
        placements=(SetPlacement(10, Placement(require_nodes=("n1",)), "pin"),
                    SetPlacement(20, Placement(require_nodes=("n2",)), "pin")),
        requeues=(Requeue(1, "for 10", for_job=10), Requeue(2, "for 20", for_job=20)),
        protected=(10, 20, 30),
    )
    guarded, notes = guard_requeues(decisions, victims, 1000.0, RequeueLimits(min_run_s=0.0, max_per_cycle=1))
    assert [r.job_id for r in guarded.requeues] == [1] and len(notes) == 1
    assert guarded.protected == (10, 30)
    assert [p.job_id for p in guarded.placements] == [10]
