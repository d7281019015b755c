"""The expected start: the replay's simulator run forward from a live snapshot (sim/forward.py).

Every snapshot here is invented: a few nodes and jobs at T, with run times chosen so that each
expected start follows from one rule (a running job's expected end, Slurm's order, backfill by
time limits, a begin time) and can be worked out by hand.
"""

from __future__ import annotations

from dike_slurm.domain.model import Job, JobState, Node, Topology
from dike_slurm.sim.forward import ForwardInputs, expected_starts

T = 1_800_000_000.0  # invented: the snapshot's time
H = 3600


def nodes(count: int, gpus: int = 8) -> list[Node]:
    return [Node(f"n{i}", gpus, cpus=16, partitions=("gpu",)) for i in range(1, count + 1)]


def running(job_id: int, on: tuple[str, ...], started: float, limit_s: int | None, gpus: int = 8) -> Job:
    return Job(job_id, "alice", JobState.RUNNING, started - 10, gpus=gpus, num_nodes=len(on), cpus=len(on),
               partition="gpu", start_time=started, time_limit_s=limit_s, nodes=on)


def pending(job_id: int, priority: int, limit_s: int | None = H, gpus: int = 8, num_nodes: int = 1,
            reason: str = "Priority", **fields) -> Job:
    fields.setdefault("submit_time", T - 100 - job_id)
    return Job(job_id, "bob", JobState.PENDING, gpus=gpus, num_nodes=num_nodes, cpus=num_nodes,
               partition=fields.pop("partition", "gpu"), time_limit_s=limit_s, priority=priority,
               slurm_reason=reason, **fields)


def starts(jobs: list[Job], expected: dict[int, float], node_count: int = 1, **options) -> dict:
    forecast = expected_starts(ForwardInputs(T, jobs, nodes(node_count), Topology(), expected, **options))
    return {job_id: (s.at - T if s.at is not None else s.why) for job_id, s in forecast.starts.items()}


def test_a_running_job_ending_at_its_expected_end_frees_the_room_for_the_head_pending_job_then():
    # job 1 started 100 s ago; the prior expects 400 s of it, its limit is an hour: it ends at T+300
    jobs = [running(1, ("n1",), T - 100, H), pending(2, priority=10)]
    assert starts(jobs, {1: 400.0}) == {2: 300.0}
    # without an expectation it holds the node to its time limit's end, as squeue --start assumes
    assert starts(jobs, {}) == {2: H - 100.0}
    # a job already past its expected end: the prior was wrong about it, so its time limit again
    assert starts(jobs, {1: 50.0}) == {2: H - 100.0}
    # an expectation beyond the time limit: Slurm ends it at the limit
    assert starts(jobs, {1: 2 * H}) == {2: H - 100.0}


def test_the_queue_runs_in_slurms_order_each_job_for_its_expected_run():
    # job 3 was submitted first, job 2 has the higher priority: 2 goes first and runs its
    # expected 200 s, then 3; job 4 is in a partition of a higher PriorityTier and goes before both
    jobs = [running(1, ("n1",), T - 100, H), pending(2, priority=10), pending(3, priority=5, submit_time=T - 900)]
    assert starts(jobs, {1: 400.0, 2: 200.0}) == {2: 300.0, 3: 500.0}
    jobs.append(pending(4, priority=1, partition="urgent"))
    on_both = [Node("n1", 8, cpus=16, partitions=("gpu", "urgent"))]
    forecast = expected_starts(ForwardInputs(T, jobs, on_both, Topology(), {1: 400.0, 4: 60.0, 2: 200.0},
                                             tiers={"urgent": 2}))
    assert {j: s.at - T for j, s in forecast.starts.items()} == {4: 300.0, 2: 360.0, 3: 560.0}


def test_backfill_starts_a_short_job_now_only_where_it_delays_no_reservation():
    # n1 is busy until T+300 (by its limit too); job 2 (both nodes) is planned then. Job 3 fits its
    # 200 s limit before that on n2 and starts now; job 4's hour would delay job 2: it waits for
    # the room job 2 leaves after its expected 100 s
    jobs = [running(1, ("n1",), T - 100, 400), pending(2, priority=10, gpus=16, num_nodes=2),
            pending(3, priority=5, limit_s=200), pending(4, priority=4)]
    assert starts(jobs, {2: 100.0}, node_count=2) == {2: 300.0, 3: 0.0, 4: 400.0}


def test_a_job_waiting_for_its_begin_time_starts_then():
    assert starts([pending(2, priority=1, reason="BeginTime", eligible_time=T + 600)], {}) == {2: 600.0}


def test_a_job_the_simulation_cannot_place_says_why_instead_of_a_number():
    jobs = [
        running(1, ("n1",), T - 100, None),  # no time limit and no expectation: it never ends
        pending(2, priority=9, reason="JobHeldUser"),
        pending(3, priority=8, reason="Dependency"),
        pending(4, priority=7, reason="QOSMaxGRESPerUser"),
        pending(5, priority=6, gpus=16),  # 16 GPUs on a node of 8
        pending(6, priority=5),  # behind job 1, which never ends
        pending(7, priority=4),  # beyond the cap
    ]
    why = starts(jobs, {}, horizon_s=6 * H, max_pending=2)
    assert why[2] == "held (JobHeldUser): it starts only once released"
    assert why[3] == "waits on a dependency (Dependency), which the simulation does not follow"
    assert why[4] == "Slurm keeps it waiting for QOSMaxGRESPerUser, which the simulation does not model"
    assert why[5].startswith("fits no set of the nodes up now (16 GPU(s) and 1 CPU(s) on each of 1 node(s)")
    assert why[6].startswith("not within the 6 hours simulated: the jobs ahead and the running jobs leave no room")
    assert "1 simulated job(s) have neither a time limit nor an expected run time" in why[6]
    assert why[7] == "further down Slurm's queue than the first 2 pending jobs the simulation takes"


def test_the_method_says_what_the_simulation_took():
    jobs = [running(1, ("n1",), T - 100, H), pending(2, priority=10), pending(3, priority=5, limit_s=None)]
    forecast = expected_starts(ForwardInputs(T, jobs, nodes(1), Topology(), {1: 400.0}))
    assert (forecast.seated, forecast.simulated) == (1, 2)
    assert dict(forecast.basis) == {"service prior": 1, "time limit": 1, "unknown": 1}
    assert forecast.method().startswith("Dike's simulator run forward up to 7 days from now with 1 running and 2 "
                                        "pending job(s) in Slurm's order; their ends and run times: 1 from the "
                                        "service prior, 1 from the time limit, 1 with neither")
