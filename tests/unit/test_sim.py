"""The simulator on hand-built tiny traces whose outcome is known by hand."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import Field

from dike_slurm.domain.decisions import Decisions, Requeue, SetPlacement, SetPriority
from dike_slurm.domain.model import JobState, Placement, Snapshot, Topology
from dike_slurm.slurm.slurm_conf import parse_slurm_conf, parse_topology_conf
from dike_slurm.policies.base import Policy, PolicyParams
from dike_slurm.registry import default_registry
from dike_slurm.sim.kernel.cluster import SimCluster
from dike_slurm.sim.kernel.records import JobResult, SimSettings, Timeline
from dike_slurm.sim.kernel.simulator import BACKFILL_PASS, END_INSTANT, MAIN_PASS, SUBMIT, EmptySchedule, SimulationStuck, Simulator
from dike_slurm.sim.kernel.trace import TraceJob

ONE_NODE = "NodeName=n1 Gres=gpu:8 CPUs=64\nPartitionName=gpu Nodes=n1 Default=YES MaxTime=INFINITE\n"
FOUR_NODES = "NodeName=n[1-4] Gres=gpu:8 CPUs=64\nPartitionName=gpu Nodes=n[1-4] Default=YES\n"
TWO_LEAVES = "SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Nodes=n[3-4]\nSwitchName=top Switches=s[1-2]\n"


def job(job_id, submit, gpus, duration, limit=None, nodes=1, user="alice", **extra) -> TraceJob:
    fields = dict(
        job_id=job_id, display_id=str(job_id), user=user, account="research", partition="gpu", qos="normal",
        name=f"job{job_id}", comment="", submit=float(submit), eligible_delay_s=0.0, duration_s=float(duration),
        time_limit_s=limit, gpus=gpus, num_nodes=nodes, cpus=nodes,
    )
    fields.update(extra)
    return TraceJob(**fields)


class Recorder:
    def __init__(self):
        self.results: dict[int, JobResult] = {}

    def __call__(self, result: JobResult) -> None:
        self.results[result.job_id] = result


def simulate(trace, policy=None, params=None, conf=ONE_NODE, topology="", **settings) -> tuple[dict[int, JobResult], Simulator]:
    """Replay `trace` (FIFO unless a policy is given); results by job id, and the simulator."""
    cluster = SimCluster(parse_slurm_conf(conf), parse_topology_conf(topology) if topology else Topology())
    if policy is None:
        policy = default_registry().create("fifo")
        params = policy.Params()
    recorder = Recorder()
    trace = sorted(trace, key=lambda j: (j.submit, j.job_id))
    simulator = Simulator(
        trace, cluster, policy, params, SimSettings(**settings), Timeline(origin=trace[0].submit, width=60.0), recorder
    )
    simulator.run()
    return recorder.results, simulator


# ----------------------------------------------------------------------------- policies for tests

class ConsolidateParams(PolicyParams):
    wait_s: int = 60


class Consolidate(Policy):
    """FIFO, and every pending job of 16 GPUs or more asks for one leaf switch."""

    name = "test-consolidate"
    description = "test"
    Params = ConsolidateParams

    def decide(self, snapshot, params, rng):
        ranked = sorted(snapshot.pending + snapshot.running, key=lambda j: (j.submit_time, j.job_id))
        priorities = tuple(SetPriority(j.job_id, 0, float(len(ranked) - i), "fifo") for i, j in enumerate(ranked))
        placements = tuple(
            SetPlacement(j.job_id, Placement(max_switches=1, switches_wait_s=params.wait_s), "consolidate")
            for j in snapshot.pending if j.gpus >= 16
        )
        return Decisions(priorities, placements)


class PreemptParams(PolicyParams):
    preemption: bool = True  # the simulator evaluates every cycle of a policy that may requeue
    min_runtime_s: float = Field(50.0)


class LeastServedPreempting(Policy):
    """Least attained service first; requeues running jobs once when a job that never ran waits."""

    name = "test-preempt"
    description = "test"
    Params = PreemptParams

    def __init__(self):
        self.snapshots: list[Snapshot] = []

    def requeue_min_run_s(self, params):
        return params.min_runtime_s if params.preemption else None

    def decide(self, snapshot, params, rng):
        self.snapshots.append(snapshot)
        active = snapshot.pending + snapshot.running
        priorities = tuple(
            SetPriority(j.job_id, 0, -j.counted_gpu_s, "las", promoted=j.state is JobState.PENDING and j.preemptions > 0)
            for j in active
        )
        requeues = ()
        if any(j.run_count == 0 for j in snapshot.pending):
            requeues = tuple(
                Requeue(j.job_id, "make room for a new job")
                for j in snapshot.running
                if j.preemptions == 0 and snapshot.time - j.start_time >= params.min_runtime_s
            )
        return Decisions(priorities, (), requeues)


class Exclude(Policy):
    """FIFO, and job 2 may not use node n1."""

    name = "test-exclude"
    description = "test"

    def decide(self, snapshot, params, rng):
        ranked = sorted(snapshot.pending + snapshot.running, key=lambda j: (j.submit_time, j.job_id))
        priorities = tuple(SetPriority(j.job_id, 0, float(len(ranked) - i), "fifo") for i, j in enumerate(ranked))
        placements = tuple(
            SetPlacement(j.job_id, Placement(exclude_nodes=("n1",)), "steer") for j in snapshot.pending if j.job_id == 2
        )
        return Decisions(priorities, placements)


# ----------------------------------------------------------------------------- scheduling


def test_fifo_runs_jobs_in_submit_order():
    results, _ = simulate([job(1, 0, 8, 100), job(3, 2, 8, 100), job(2, 1, 8, 100)])
    assert [(r.start, r.end) for r in (results[1], results[2], results[3])] == [(0, 100), (100, 200), (200, 300)]
    assert results[3].wait_s == 198 and results[3].jct_s == 298


def test_short_job_backfills_into_the_hole_and_long_ones_do_not():
    trace = [
        job(1, 0, 4, 1000, limit=1000),  # holds half the node until t=1000
        job(2, 1, 8, 100, limit=100),  # blocked: reserved to start at t=1000
        job(3, 2, 4, 300, limit=500),  # fits before t=1000: backfilled at the first backfill pass
        job(4, 3, 4, 100, limit=2000),  # would delay job 2: waits
        job(5, 4, 4, 100, limit=None),  # unlimited: nothing can be promised past it, never backfilled
    ]
    results, simulator = simulate(trace)
    assert results[3].start == 30  # bf_interval after the first submission
    assert results[2].start == 1000 and results[2].end == 1100
    assert results[4].start >= 1100 and results[5].start >= 1100
    assert simulator.stats.reservations > 0


def test_without_reservations_big_jobs_starve_behind_backfill():
    trace = [job(1, 0, 4, 1000, limit=1000), job(2, 1, 8, 100, limit=100), job(3, 2, 4, 100, limit=2000)]
    results, _ = simulate(trace, backfill_reservations=0)
    assert results[3].start == 30 and results[2].start == 1000  # job 3 ends at 130: no harm here
    trace.append(job(4, 3, 4, 5000, limit=5000))
    results, _ = simulate(trace, backfill_reservations=0)
    assert results[2].start > 1000  # nothing held the node for job 2


def test_running_unlimited_job_lets_nothing_be_reserved():
    trace = [job(1, 0, 4, 1000, limit=None), job(2, 1, 8, 100, limit=100), job(3, 2, 4, 100, limit=3000)]
    results, simulator = simulate(trace)
    assert results[3].start == 30  # no reservation could be made for job 2 (its start is unknown)
    assert results[2].start == 1000
    assert simulator.stats.reservations == 0


def test_eligible_time_is_honoured():
    results, _ = simulate([job(1, 0, 1, 10), job(2, 5, 1, 10, eligible_delay_s=300.0)])
    assert results[2].start == 305


def test_multi_node_jobs_take_whole_shares_and_wait_for_them():
    trace = [job(1, 0, 4, 100), job(2, 1, 16, 50, nodes=2), job(3, 2, 8, 10)]
    results, _ = simulate(trace, conf="NodeName=n[1-2] Gres=gpu:8 CPUs=64\nPartitionName=gpu Nodes=n[1-2] Default=YES\n")
    assert results[2].start == 100 and results[2].end == 150  # needs 8 free GPUs on both nodes
    # The main scheduler stops at blocked job 2; the next backfill pass starts job 3 on the free node
    # (job 1 has no time limit, so nothing can be reserved for job 2).
    assert results[3].start == 30


def test_exclude_nodes_are_never_used():
    two_nodes = "NodeName=n[1-2] Gres=gpu:8 CPUs=64\nPartitionName=gpu Nodes=n[1-2] Default=YES\n"
    trace = [job(1, 0, 4, 100), job(2, 60, 4, 100), job(3, 60, 8, 100)]
    results, _ = simulate(trace, conf=two_nodes)
    assert results[3].start == 60  # job 2 took the rest of n1 (first fit), n2 was free for job 3
    results, _ = simulate(trace, policy=Exclude(), params=PolicyParams(), conf=two_nodes)
    assert results[2].start == 60 and results[3].start == 100  # job 2 kept off n1 took half of n2


# ----------------------------------------------------------------------------- topology and communication


def spread_trace(heavy_submit=11, **heavy):
    """n1 and n3 busy for 1000 s (n2 for the first 10 s), so a two-node job submitted after 10 s gets
    one node under each leaf switch."""
    return [
        job(1, 0, 8, 1000, limit=1000),  # leaves tie: the first (s1) -> n1
        job(2, 0, 8, 10, limit=10),  # s1 holds it with fewer free nodes than s2 (the tightest leaf) -> n2
        job(4, 0, 8, 1000, limit=1000),  # only s2 holds it -> n3
        job(3, heavy_submit, 16, 100, nodes=2, limit=200, **heavy),
    ]


def test_the_main_scheduler_runs_at_most_every_batch_sched_delay():
    """Slurm 22.05 (controller.c): a change asks for a main pass, which runs once batch_sched_delay
    has passed since the last pass, or at the periodic full pass (every sched_interval) if that
    comes first; jobs do not start the moment a node frees (measured on the lab: job starts fall on
    the pass grid, tests/integration/test_fidelity_lab.py). Passes at 0 (job 1 starts), 3 (job 2,
    submitted at 1, waits) and 9 (job 3 submitted); job 1 ends at 10, the next pass is 3 s after
    the last: 12; job 2 ends at 17, 8 s after the last pass: at once."""
    trace = [job(1, 0, 8, 10), job(2, 1, 8, 5), job(3, 9, 8, 5)]
    results, _ = simulate(trace, batch_sched_delay_s=3.0, sched_interval_s=60.0)
    assert [results[i].start for i in (1, 2, 3)] == [0, 12, 17]
    results, _ = simulate(trace, batch_sched_delay_s=0.0)  # a pass at every change
    assert [results[i].start for i in (1, 2, 3)] == [0, 10, 15]
    results, _ = simulate(trace, batch_sched_delay_s=3.0, sched_interval_s=5.0)  # t=10 is a full pass
    assert [results[i].start for i in (1, 2, 3)] == [0, 10, 15]


def test_the_scheduler_timing_comes_from_slurm_conf():
    from dike_slurm.config import Config
    from dike_slurm.sim.kernel.replay import sim_settings

    settings = sim_settings(Config(), parse_slurm_conf(FOUR_NODES))
    assert (settings.sched_interval_s, settings.batch_sched_delay_s) == (60, 3)
    conf = parse_slurm_conf("SchedulerParameters=bf_interval=5,sched_interval=5,batch_sched_delay=1\n" + FOUR_NODES)
    settings = sim_settings(Config(), conf)
    assert (settings.sched_interval_s, settings.batch_sched_delay_s, settings.bf_interval_s) == (5, 1, 5)


def test_node_choice_is_slurms_tightest_leaf():
    """select/cons_tres with topology/tree, as measured on the lab (tests/integration/test_fidelity_lab.py):
    the leaf that holds the job with the fewest usable nodes; spread, whole leaves one after the other."""
    import numpy as np

    cluster = SimCluster(parse_slurm_conf(FOUR_NODES), parse_topology_conf(TWO_LEAVES))
    mask = lambda *bits: np.array(bits, dtype=bool)  # noqa: E731
    assert cluster.choose(mask(1, 1, 1, 1), 1, False) == [0]  # a tie: the first leaf
    assert cluster.choose(mask(1, 1, 0, 1), 1, False) == [3]  # n3 busy: s2 (n4 alone) fits tightest
    assert cluster.choose(mask(1, 1, 0, 1), 2, False) == [0, 1]  # only s1 holds two
    assert cluster.choose(mask(1, 0, 1, 0), 2, True) is None
    assert cluster.choose(mask(1, 0, 1, 0), 2, False) == [0, 2]
    six = "NodeName=n[1-6] Gres=gpu:8 CPUs=64\nPartitionName=gpu Nodes=n[1-6] Default=YES\n"
    three = "SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Nodes=n[3-4]\nSwitchName=s3 Nodes=n[5-6]\n"
    cluster = SimCluster(parse_slurm_conf(six), parse_topology_conf(three))
    # no leaf holds three: the largest (s2, the first of s2 and s3) whole, then the tightest for the
    # last node (s1 with one usable node, not s3 with two); round-robin would give n1, n3, n5
    assert cluster.choose(mask(1, 0, 1, 1, 1, 1), 3, False) == [2, 3, 0]


@pytest.mark.parametrize("penalty, run_time", [(0.0, 100), (0.5, 150), (1.0, 200), (2.35, 335)])
def test_comm_penalty_when_a_heavy_job_is_spread(penalty, run_time):
    results, _ = simulate(spread_trace(), conf=FOUR_NODES, topology=TWO_LEAVES, comm_penalty=penalty)
    heavy = results[3]
    assert heavy.leaves == 2 and not heavy.consolidated
    assert heavy.start == 11 and heavy.end - heavy.start == pytest.approx(run_time)
    assert heavy.gpu_seconds == pytest.approx(16 * run_time)


def test_no_penalty_when_consolidated_or_light():
    results, _ = simulate([job(1, 0, 8, 1000), job(3, 1, 16, 100, nodes=2)], conf=FOUR_NODES, topology=TWO_LEAVES)
    assert results[3].leaves == 1 and results[3].consolidated and results[3].end == 101
    results, _ = simulate(spread_trace(comment="dike:comm=low"), conf=FOUR_NODES, topology=TWO_LEAVES)
    assert results[3].leaves == 2 and not results[3].heavy and results[3].end == 111


def test_switches_wait_then_runs_anywhere():
    # Submitted on a cycle boundary, so the constraint is set before the first scheduling try.
    results, _ = simulate(spread_trace(heavy_submit=60), Consolidate(), ConsolidateParams(wait_s=30),
                          conf=FOUR_NODES, topology=TWO_LEAVES, comm_penalty=1.0)
    assert results[3].start == 90 and results[3].leaves == 2
    # Slurm caps the wait at SchedulerParameters=max_switch_wait (default 300 s).
    results, _ = simulate(spread_trace(heavy_submit=60), Consolidate(), ConsolidateParams(wait_s=3000),
                          conf=FOUR_NODES, topology=TWO_LEAVES)
    assert results[3].start == 360
    # With a long enough cap the job waits for a whole leaf (free at t=1000 when jobs 1 and 2 end).
    results, _ = simulate(spread_trace(heavy_submit=60), Consolidate(), ConsolidateParams(wait_s=3000),
                          conf=FOUR_NODES, topology=TWO_LEAVES, max_switch_wait_s=5000)
    assert results[3].start == 1000 and results[3].leaves == 1 and results[3].consolidated


def test_the_switches_clock_runs_while_the_job_fits_nowhere():
    """The lab measurement (tests/integration/test_switches_clock_lab.py) replayed: blockers hold n1
    and n3 for 100 s, long jobs n2 and n4; the two-node job asks for one leaf with a 40 s wait
    from t=0 and fits nowhere until t=100. Slurm 22.05 started it spread 1 s after the nodes
    freed: its wait had run out while nothing fit."""
    # in submit order onto n1, n2 (the tightest leaf), n3, n4: the blockers are jobs 1 and 3
    trace = [job(1, 0, 8, 100), job(2, 0, 8, 1000), job(3, 0, 8, 100), job(4, 0, 8, 1000), job(5, 0, 16, 10, nodes=2)]
    results, _ = simulate(trace, Consolidate(), ConsolidateParams(wait_s=40), conf=FOUR_NODES, topology=TWO_LEAVES)
    assert [results[i].start for i in (1, 2, 3, 4)] == [0, 0, 0, 0]
    assert results[5].start == 100 and results[5].leaves == 2


class RewriteParams(PolicyParams):
    first_wait_s: int = 100
    later_wait_s: int = 90
    rewrite_at: float = 120.0


class RewriteSwitches(Policy):
    """FIFO; jobs of 16 GPUs or more ask for one leaf, with another wait from `rewrite_at` on."""

    name = "test-rewrite-switches"
    description = "test"
    Params = RewriteParams

    def decide(self, snapshot, params, rng):
        ranked = sorted(snapshot.pending + snapshot.running, key=lambda j: (j.submit_time, j.job_id))
        priorities = tuple(SetPriority(j.job_id, 0, float(len(ranked) - i), "fifo") for i, j in enumerate(ranked))
        wait = params.first_wait_s if snapshot.time < params.rewrite_at else params.later_wait_s
        placements = tuple(
            SetPlacement(j.job_id, Placement(max_switches=1, switches_wait_s=wait), "consolidate")
            for j in snapshot.pending if j.gpus >= 16
        )
        return Decisions(priorities, placements)


def test_a_rewritten_switches_wait_counts_from_the_first_start_of_the_clock():
    """Slurm 22.05 never resets wait4switch_start (tests/integration/test_fidelity_lab.py): the
    heavy job's clock starts at the cycle of t=60 with a 100 s wait; rewritten at t=120 to 90 s,
    the wait ends at 60 + 90 = 150 (restarted it would have ended at 210)."""
    results, _ = simulate(spread_trace(heavy_submit=60), RewriteSwitches(), RewriteParams(),
                          conf=FOUR_NODES, topology=TWO_LEAVES)
    assert results[3].start == 150 and results[3].leaves == 2


def test_switches_are_ignored_without_a_topology():
    results, _ = simulate(spread_trace(heavy_submit=60), Consolidate(), ConsolidateParams(wait_s=3000), conf=FOUR_NODES)
    assert results[3].start == 60


# ----------------------------------------------------------------------------- preemption, promotion, snapshots


def test_preemption_requeues_with_restart_cost_and_keeps_service():
    policy = LeastServedPreempting()
    trace = [job(1, 0, 8, 1000), job(2, 100, 8, 100), job(3, 200, 8, 10)]
    # checkpoint_interval_s=0: every second of work is kept (the loss model is tested below); no
    # requeue hold (Slurm's, tested below), so job 1 may start again as soon as job 2 ends
    results, simulator = simulate(trace, policy, PreemptParams(), restart_cost_s=60.0, checkpoint_interval_s=0.0,
                                  requeue_hold_s=0.0)
    first, second = results[1], results[2]
    assert second.start == 120 and second.end == 220  # job 1 requeued at the cycle of t=120
    assert first.preemptions == 1 and simulator.stats.preemptions == 1
    assert first.end == 220 + 60 + 880  # restart cost, then the 880 s of work left
    assert first.gpu_seconds == 8 * (120 + 940)
    requeued = next(
        j for s in policy.snapshots if s.time > 120 for j in s.jobs if j.job_id == 1 and j.state is JobState.PENDING
    )
    assert requeued.attained_gpu_s == 8 * 120 and requeued.preemptions == 1 and requeued.run_count == 1
    assert requeued.pending_since == 120
    # Promoted at t=180 (the policy promotes requeued pending jobs): the service so far is forgiven.
    after = [j for s in policy.snapshots if s.time > 180 for j in s.jobs if j.job_id == 1]
    assert after and after[0].state is JobState.RUNNING and after[0].attained_at_promotion_gpu_s == 8 * 120
    assert results[3].start == first.end  # job 3 (never run, same score 0) comes after job 1 by submit time
    assert first.lost_gpu_s == 8 * 60  # only its restart


def test_a_requeue_loses_the_work_since_the_last_checkpoint_and_the_restart():
    trace = [job(1, 0, 8, 1000), job(2, 100, 8, 100), job(3, 200, 8, 10)]
    results, _ = simulate(
        trace, LeastServedPreempting(), PreemptParams(), restart_cost_s=60.0, checkpoint_interval_s=50.0,
        requeue_hold_s=0.0,
    )
    first = results[1]
    # Requeued at t=120 after 120 s of work: checkpoints at 50 and 100 keep 100 s, 20 s are lost.
    assert results[2].start == 120 and results[2].end == 220
    assert first.end == 220 + 60 + 900
    assert first.lost_gpu_s == 8 * (20 + 60)  # the lost work and the restart
    assert first.gpu_seconds == 8 * (120 + 960)


def test_a_cycles_decisions_reach_slurm_after_its_reads_and_runs_end_after_their_work():
    """The live engine writes one cycle time after it read (replay.cycle_latency_s); a run ends its
    launch and exit after its work (replay.run_overhead_s); squeue shows StartTime in whole seconds."""
    trace = [job(1, 0, 8, 1000), job(2, 100, 8, 100)]
    policy = LeastServedPreempting()
    results, _ = simulate(trace, policy, PreemptParams(), checkpoint_interval_s=0.0, requeue_hold_s=0.0,
                          restart_cost_s=0.0, cycle_latency_s=0.5, run_overhead_s=0.05)
    # decided on the snapshot of t=120, requeued when the write lands at 120.5
    assert [j.state for s in policy.snapshots if s.time == 120 for j in s.jobs if j.job_id == 1] == [JobState.RUNNING]
    assert results[2].start == 120.5 and results[2].end == pytest.approx(220.55)
    running = next(j for s in policy.snapshots if s.time == 180 for j in s.jobs if j.job_id == 2)
    assert running.start_time == 120 and running.last_run_s == 60 and running.attained_gpu_s == 8 * 60
    # job 1 kept its 120.5 s of work and runs the 879.5 s left
    assert results[1].preemptions == 1 and results[1].end == pytest.approx(220.55 + 879.5 + 0.05)


def test_the_replays_cycle_latency_stays_below_its_interval():
    from pydantic import ValidationError

    from dike_slurm.config import Config

    assert Config().replay.cycle_latency_s == 1.0 and Config().replay.run_overhead_s == 0.05
    with pytest.raises(ValidationError, match="cycle_latency_s \\(3\\) must be below interval_s \\(3\\)"):
        Config.model_validate({"replay": {"interval_s": 3, "cycle_latency_s": 3}})


def test_a_requeued_job_is_held_as_slurm_holds_it():
    """Slurm sets a requeued job's begin time to the requeue + cred_expire + 1 s (121 s by default;
    tests/integration/test_fidelity_lab.py): job 1, requeued at t=120, may not start before t=241,
    although job 2 ends at t=220; job 3 (submitted at 200) takes the free node meanwhile."""
    trace = [job(1, 0, 8, 1000), job(2, 100, 8, 100), job(3, 200, 8, 10)]
    results, _ = simulate(trace, LeastServedPreempting(), PreemptParams(), restart_cost_s=60.0,
                          checkpoint_interval_s=0.0)
    assert results[2].start == 120 and results[2].end == 220
    assert results[3].start == 220 and results[3].end == 230
    assert results[1].preemptions == 1 and results[1].end == 241 + 60 + 880
    assert results[1].wait_s == 121


def test_the_requeue_hold_comes_from_authinfo_cred_expire():
    from dike_slurm.config import Config
    from dike_slurm.errors import InputError
    from dike_slurm.sim.kernel.replay import sim_settings

    assert sim_settings(Config(), parse_slurm_conf(FOUR_NODES)).requeue_hold_s == 121
    conf = parse_slurm_conf("AuthInfo=socket=/run/m.sock,cred_expire=30\n" + FOUR_NODES)
    assert sim_settings(Config(), conf).requeue_hold_s == 31
    with pytest.raises(InputError):
        sim_settings(Config(), parse_slurm_conf("AuthInfo=cred_expire=soon\n" + FOUR_NODES))


def test_the_replay_guard_refuses_what_the_live_engine_would_refuse():
    """One guard for both: jobs that may not be preempted, and the engine's rate limit."""
    trace = [job(1, 0, 2, 1000), job(2, 0, 2, 1000), job(3, 0, 2, 1000), job(4, 100, 8, 100)]
    policy = LeastServedPreempting()
    _, simulator = simulate(trace, policy, PreemptParams(), max_requeues_per_cycle=2, checkpoint_interval_s=0.0)
    # At t=120 the policy asks for all three; the engine's cap keeps two (in the policy's order).
    assert simulator.stats.requeues_refused >= 1
    after = next(s for s in policy.snapshots if s.time == 180)
    assert {j.job_id: j.preemptions for j in after.jobs if j.job_id < 4} == {1: 1, 2: 1, 3: 0}
    _, none = simulate(trace, LeastServedPreempting(), PreemptParams(), preemptible=0.0)
    assert none.stats.preemptions == 0 and none.stats.requeues_refused >= 3


def test_snapshot_contents():
    policy = LeastServedPreempting()
    trace = [
        job(1, 0, 2, 500, user="alice"), job(2, 0, 8, 5000, user="bob"), job(3, 10, 8, 100, user="carol"),
        job(4, 550, 8, 100, user="dave"),
    ]
    two_nodes = "NodeName=n[1-2] Gres=gpu:8 CPUs=64\nPartitionName=gpu Nodes=n[1-2] Default=YES\n"
    simulate(trace, policy, PreemptParams(min_runtime_s=1e9), conf=two_nodes, usage_half_life_s=3600.0, history_window_s=50.0)
    snapshot = next(s for s in policy.snapshots if s.time == 60)
    running = {j.job_id: j for j in snapshot.running}
    assert running[1].attained_gpu_s == 2 * 60 and running[1].last_run_s == 60 and running[1].nodes == ("n1",)
    assert [j.job_id for j in snapshot.pending] == [3]
    assert [n.gpus_alloc for n in snapshot.nodes] == [2, 8] and snapshot.total_gpus == 16
    assert [n.state for n in snapshot.nodes] == ["MIXED", "ALLOCATED"]
    # Decayed usage: alice's 2 GPUs over 60 s with a one-hour half-life.
    import math

    k = math.log(2) / 3600
    assert snapshot.user_usage_gpu_s["alice"] == pytest.approx(2 * (1 - math.exp(-k * 60)) / k)
    late = next(s for s in policy.snapshots if s.time == 600)  # jobs 1 and 3 have ended
    assert late.completed_service_gpu_s == (8 * 100,)  # job 1 ended at 500, outside the 50 s window
    assert all(j.true_duration_s is not None for j in late.jobs)


def test_a_policy_that_does_not_read_finished_jobs_service_is_not_handed_it():
    class NoHistory(LeastServedPreempting):
        def reads_completed_service(self, params):
            return False

    policy = NoHistory()
    trace = [job(1, 0, 2, 500), job(2, 0, 8, 5000, user="bob"), job(3, 10, 8, 100, user="carol")]
    two_nodes = "NodeName=n[1-2] Gres=gpu:8 CPUs=64\nPartitionName=gpu Nodes=n[1-2] Default=YES\n"
    _, simulator = simulate(trace, policy, PreemptParams(min_runtime_s=1e9), conf=two_nodes)
    assert len(policy.snapshots) > 5 and all(s.completed_service_gpu_s == () for s in policy.snapshots)
    assert not simulator.finished.ends and not simulator.finished.service  # nothing kept for it either


def test_determinism_of_two_runs():
    rng = random.Random(5)
    trace = [
        job(i, rng.randint(0, 5000), rng.choice([1, 2, 4, 8, 16]), rng.randint(30, 3000), limit=rng.choice([None, 3600, 7200]),
            nodes=1, user=f"u{rng.randint(0, 4)}")
        for i in range(1, 200)
    ]
    trace = [replace(j, num_nodes=2, cpus=2) if j.gpus == 16 else j for j in trace]
    policy = default_registry().create("dike")
    first, _ = simulate(trace, policy, policy.Params(), conf=FOUR_NODES, topology=TWO_LEAVES)
    second, _ = simulate(trace, default_registry().create("dike"), policy.Params(), conf=FOUR_NODES, topology=TWO_LEAVES)
    assert list(first.values()) == list(second.values())


class ExcludeEverything(Policy):
    """Keeps every waiting job off every node: nothing can ever start."""

    name = "test-exclude-all"
    description = "test"

    def decide(self, snapshot, params, rng):
        everything = tuple(n.name for n in snapshot.nodes)
        return Decisions(
            tuple(SetPriority(j.job_id, 0, 0.0, "-") for j in snapshot.pending),
            tuple(SetPlacement(j.job_id, Placement(exclude_nodes=everything), "-") for j in snapshot.pending),
        )


def test_a_replay_that_cannot_progress_stops_with_a_clear_error():
    # Job 1 gets its constraint at the cycle of its submission, before the scheduler tries it.
    with pytest.raises(SimulationStuck, match=r"1 job\(s\) cannot start on an idle cluster .* job 1\)"):
        simulate([job(1, 0, 8, 100), job(2, 1, 8, 100)], ExcludeEverything(), PolicyParams())


# ----------------------------------------------------------------------------- stepping

def stepping_simulator(decides=True):
    trace = [job(1, 0, 8, 100), job(2, 10, 8, 50), job(3, 10, 4, 30, user="bob")]
    cluster = SimCluster(parse_slurm_conf(ONE_NODE), Topology())
    recorder = Recorder()
    policy = default_registry().create("fifo")
    simulator = Simulator(
        trace, cluster, policy, policy.Params(), SimSettings(), Timeline(origin=0.0, width=60.0), recorder,
        decides=decides,
    )
    return simulator, recorder


def test_run_until_leaves_the_events_at_that_time_and_stepping_on_ends_as_one_run():
    whole, whole_results = stepping_simulator()
    whole.run()
    stepped, results = stepping_simulator()
    stepped.run(until=100.0)
    assert stepped.now < 100.0 and stepped.peek() == 100.0 and results.results == {}  # job 1 ends at 100: not yet
    steps = 0
    while stepped.peek() < float("inf"):
        stepped.step()
        steps += 1
    assert steps > 0 and results.results == whole_results.results and stepped.stats == whole.stats


def test_each_step_takes_exactly_one_entry_off_the_heap_and_peek_is_its_head():
    whole, whole_results = stepping_simulator()
    whole.run()
    simulator, results = stepping_simulator()
    steps = 0
    while simulator.events:
        head = simulator.events[0]
        assert simulator.peek() == head[0]
        pushed, size = simulator.sequence, len(simulator.events)
        simulator.step()
        steps += 1
        assert simulator.now == head[0] and simulator.round == head[1]  # the head was taken
        assert len(simulator.events) == size - 1 + (simulator.sequence - pushed)  # one off, the pushes on
    assert simulator.peek() == float("inf") and steps == simulator.sequence  # every entry pushed was one step
    assert results.results == whole_results.results and simulator.stats == whole.stats
    with pytest.raises(EmptySchedule, match="no event left"):
        simulator.step()


def test_an_instant_ends_with_an_entry_of_its_own_after_all_its_rounds():
    simulator, _ = stepping_simulator()
    simulator.step()  # job 1's submission opens the instant 0 and puts its end on the heap
    assert simulator.now == 0.0 and [e[0] for e in simulator.events if e[2] == END_INSTANT] == [0.0]
    kinds = [SUBMIT]
    while simulator.peek() == 0.0:
        kinds.append(simulator.events[0][2])
        simulator.step()
    end = kinds.index(END_INSTANT)
    assert kinds.count(END_INSTANT) == 1 and all(kind < MAIN_PASS for kind in kinds[:end])  # the events first
    assert kinds[end + 1:] == [MAIN_PASS, BACKFILL_PASS] and simulator.stats.starts == 1  # then the passes it scheduled


def test_run_into_the_past_is_an_error():
    simulator, _ = stepping_simulator()
    simulator.run(until=100.0)
    for until in (simulator.now, simulator.now - 1.0):
        with pytest.raises(ValueError, match=r"the simulation is at .* already; until must be later"):
            simulator.run(until=until)
    simulator.run(until=100.5)  # later is fine
    assert simulator.now == 100.0


def test_a_simulator_that_does_not_decide_stops_at_each_cycle_until_decide():
    decided, _ = stepping_simulator()
    decided.run()
    simulator, results = stepping_simulator(decides=False)
    policy = default_registry().create("fifo")
    cycles = 0
    while simulator.run().decide_calls > cycles:
        awaiting = simulator.awaiting
        assert awaiting is not None
        with pytest.raises(Exception, match="awaits"):
            simulator.step()
        simulator.decide(policy.decide(awaiting.snapshot, policy.Params(), random.Random(0)))
        cycles += 1
    assert simulator.awaiting is None and cycles == decided.stats.decide_calls > 0
    assert simulator.stats == decided.stats and len(results.results) == 3


def test_utilisation_counts_useful_work_not_rework():
    """A requeue that loses 20 s of work and pays a 60 s restart keeps 8 GPUs busy for 80 s more;
    the utilisation does not count them: they are lost GPU-hours, beside the useful ones."""
    from dike_slurm.sim.kernel.metrics import MetricsCollector, summarise

    trace = [job(1, 0, 8, 1000), job(2, 100, 8, 100), job(3, 200, 8, 10)]
    results, simulator = simulate(trace, LeastServedPreempting(), PreemptParams(), restart_cost_s=60.0,
                                  checkpoint_interval_s=50.0, requeue_hold_s=0.0)
    collector = MetricsCollector()
    for result in results.values():
        collector(result)
    summary = summarise(collector, simulator.stats, simulator.timeline, total_gpus=8).summary
    useful, lost = 8 * (1000 + 100 + 10), 8 * (20 + 60)
    assert summary["useful_gpu_h"] == pytest.approx(useful / 3600, abs=1e-3)
    assert summary["preemption_lost_gpu_h"] == pytest.approx(lost / 3600, abs=1e-3)
    assert summary["slowed_gpu_h"] == 0
    makespan = summary["makespan_s"]
    assert summary["gpu_utilization"] == pytest.approx(useful / (8 * makespan), abs=1e-4)
    assert collector.gpu_seconds == pytest.approx(useful + lost)  # busy, rework included


def test_a_policy_is_decided_when_each_cycle_falls_due_unless_it_lets_the_replay_postpone():
    """The live engine decides every interval. The replay postpones a cycle at which no waiting job
    could start only for a policy that says deciding later orders the same (fifo, multifactor).
    Dike with preemption off is decided at every cycle, as Dike with preemption on is: where no
    job is preemptible the two replay alike (postponed, Dike without preemption had replayed the
    bundled sample's day one at 15,213 s average JCT against 19,860 s decided when due)."""
    trace = [job(i, submit=30.0 * i, gpus=(2, 4, 8)[i % 3], duration=900.0 + 600 * (i % 4), user=f"u{i % 3}",
                 name=("train", "eval")[i % 2]) for i in range(1, 31)]
    dike = default_registry().create("dike")
    timing = dict(preemptible=0.0, cycle_latency_s=1.0)
    off, off_sim = simulate(trace, dike, dike.Params(preemption=False), **timing)
    on, on_sim = simulate(trace, dike, dike.Params(), **timing)
    assert off_sim.stats.postponed_cycles == 0 and off_sim.stats.decide_calls == off_sim.stats.cycles > 10
    assert off == on and on_sim.stats.decide_calls == off_sim.stats.decide_calls
    for name in ("fifo", "multifactor"):
        policy = default_registry().create(name)
        _, postponing = simulate(trace, policy, policy.Params(), **timing)
        assert postponing.stats.postponed_cycles > 0 and postponing.stats.decide_calls < postponing.stats.cycles


def plain_reserve(scheduler, entry, reservations, now):
    """SlurmScheduler._reserve's choice as first written (a full-width ready time per node): what
    the row-only version must equal, reservation for reservation (both hold through
    Reservations.hold)."""
    import numpy as np

    job, allowed, single_leaf, _ = entry
    trace, cluster = job.trace, scheduler.cluster
    gpus_per_node, count = trace.gpus_per_node, trace.num_nodes
    usable = allowed & (cluster.cpus >= trace.cpus_per_node)
    column = gpus_per_node - 1 + reservations.reserved
    ready = np.full(len(cluster), float("inf"))
    rows = np.flatnonzero(usable & (column < scheduler.slots.shape[1]))
    ready[rows] = scheduler.slots[rows, column[rows]]
    np.maximum(ready, now, out=ready)
    if single_leaf:
        start = float("inf")
        for leaf in np.unique(cluster.leaf_of[rows]).tolist():
            times = ready[rows[cluster.leaf_of[rows] == leaf]]
            if len(times) >= count:
                start = min(start, float(np.partition(times, count - 1)[count - 1]))
    elif len(rows) >= count:
        start = float(np.partition(ready[rows], count - 1)[count - 1])
    else:
        start = float("inf")
    if start == float("inf") or start > now + scheduler.settings.bf_window_s:
        return False
    nodes = cluster.choose(ready <= start, count, single_leaf)
    if nodes is None:
        return False
    reservations.hold(scheduler.slots, nodes, gpus_per_node, start)
    return True


EIGHT_NODES = ("NodeName=n[1-5] Gres=gpu:8 CPUs=64\nNodeName=n[6-8] Gres=gpu:4 CPUs=16\n"
               "PartitionName=gpu Nodes=n[1-8] Default=YES\n")
THREE_LEAVES = "SwitchName=s1 Nodes=n[1-3]\nSwitchName=s2 Nodes=n[4-6]\nSwitchName=s3 Nodes=n[7-8]\nSwitchName=top Switches=s[1-3]\n"


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_backfill_reservation_equals_the_full_width_plain_one(data):
    """_reserve reads only the usable nodes' slots: on random slot tables (free, ending, unlimited
    and absent GPUs), promised GPUs, allowed nodes and job shapes, it reserves exactly what the
    plain full-width version does, a pass's reservations in a row included."""
    from types import SimpleNamespace

    import numpy as np

    from dike_slurm.sim.kernel.scheduler import SLOT_UNLIMITED, Reservations

    _, simulator = simulate([job(1, 0, 1, 60)], conf=EIGHT_NODES, topology=THREE_LEAVES)
    scheduler = simulator.scheduler
    times = st.sampled_from([-np.inf, 0.0, 50.0, 100.0, 100.0, 3000.0, 90_000.0, SLOT_UNLIMITED])
    for node, gpus in enumerate(scheduler.cluster.gpus.tolist()):
        scheduler.slots[node, :gpus] = sorted(data.draw(st.lists(times, min_size=gpus, max_size=gpus)))
    now = data.draw(st.sampled_from([0.0, 60.0, 100.0]))
    ours, plain = Reservations(8), Reservations(8)
    for _ in range(data.draw(st.integers(1, 4))):
        trace = SimpleNamespace(gpus_per_node=data.draw(st.integers(1, 8)), num_nodes=data.draw(st.integers(1, 4)),
                                cpus_per_node=data.draw(st.sampled_from([1, 16, 32])))
        allowed = np.array(data.draw(st.lists(st.booleans(), min_size=8, max_size=8)))
        entry = (SimpleNamespace(trace=trace), allowed, data.draw(st.booleans()), ())
        assert scheduler._reserve(entry, ours, now) == plain_reserve(scheduler, entry, plain, now)
        assert ours.by_node == plain.by_node and ours.count == plain.count
        assert ours.reserved.tolist() == plain.reserved.tolist()
