"""Parity: the simulator and the live engine build the same snapshot and get the same decisions.

The simulator replays a small trace under Dike and records each cycle. For one instant, the
cluster is then shown to the live engine as Slurm would show it (jobs without any history,
nodes, the finished runs as sacct records) through the in-memory FakeBackend. The engine's own
snapshot (attained service from accounting, decayed usage, finished jobs' service) and the
policy's decisions on it must equal the simulator's.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from dike_slurm.slurm.accounting import AccountingRecord
from fakes import FakeBackend
from dike_slurm.config import Config
from dike_slurm.cycle.engine import Engine
from dike_slurm.domain.model import JobState
from dike_slurm.slurm.slurm_conf import parse_slurm_conf, parse_topology_conf
from dike_slurm.policies.dike import DikePolicy
from dike_slurm.sim.kernel.cluster import SimCluster
from dike_slurm.sim.kernel.replay import sim_settings
from dike_slurm.sim.kernel.records import JobResult, Timeline
from dike_slurm.sim.kernel.simulator import Simulator
from dike_slurm.sim.kernel.trace import TraceJob
from dike_slurm.store.state import StateStore

SLURM_CONF = "NodeName=n[1-4] Gres=gpu:8 CPUs=64\nPartitionName=gpu Nodes=n[1-4] Default=YES\n"
# issue 33: two GPU types, one of each per leaf switch (as the lab's two-type mode)
TWO_TYPES_CONF = ("NodeName=n[1,3] Gres=gpu:a100:8 CPUs=64\nNodeName=n[2,4] Gres=gpu:v100:8 CPUs=64\n"
                  "PartitionName=gpu Nodes=n[1-4] Default=YES\n")
# ... and the site charging an a100 GPU-second twice a v100 one (the lab's TRESBillingWeights)
BILLED_CONF = TWO_TYPES_CONF.replace(
    "Default=YES\n", "Default=YES TRESBillingWeights=CPU=0,GRES/gpu:a100=2.0,GRES/gpu:v100=1.0\n")
TOPOLOGY = "SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Nodes=n[3-4]\nSwitchName=top Switches=s[1-2]\n"


class RecordingDike(DikePolicy):
    """Dike, remembering every snapshot it was shown and what it decided."""

    def __init__(self) -> None:
        self.seen = []

    def decide(self, snapshot, params, rng):
        decisions = super().decide(snapshot, params, rng)
        self.seen.append((snapshot, decisions))
        return decisions


def trace(typed: bool = False, every_job_typed: bool = False) -> list[TraceJob]:
    """40 jobs; `typed`: a third ask for a100, a third for v100, the rest for any type;
    `every_job_typed`: half a100, half v100."""
    shapes = [(1, 1), (2, 1), (8, 1), (16, 2), (4, 1), (1, 1), (8, 1), (2, 1)]
    jobs = []
    for i in range(40):
        gpus, nodes = shapes[i % len(shapes)]
        jobs.append(TraceJob(
            job_id=100 + i, display_id=str(100 + i), user=f"user{i % 3}", account=f"acct{i % 2}", partition="gpu",
            qos="normal", name=f"train{i % 4}", comment="", submit=1_000_000.0 + 97 * i, eligible_delay_s=0.0,
            duration_s=600.0 + 311 * (i % 7), time_limit_s=7200, gpus=gpus, num_nodes=nodes, cpus=nodes,
            gpu_types=(("a100",), ("v100",))[i % 2] if every_job_typed else (("a100",), ("v100",), ())[i % 3] if typed else (),
        ))
    return jobs


@pytest.mark.parametrize("fairness_by, typed, billed", [
    ("user", False, False), ("account", False, False), ("user", True, False), ("account", True, True)])
def test_engine_and_simulator_agree_on_snapshot_and_decisions(tmp_path, fairness_by, typed, billed):
    config = Config.model_validate({
        "engine": {"state_db": str(tmp_path / "state.sqlite")},
        "policies": {"dike": {"fairness_by": fairness_by, "min_history_jobs": 5,
                              "preemption": typed, "steer_light_jobs": typed}},
    })
    conf = parse_slurm_conf(BILLED_CONF if billed else TWO_TYPES_CONF if typed else SLURM_CONF)
    topology = parse_topology_conf(TOPOLOGY)
    # Whole-second runs, as sacct's whole seconds show them: a run's launch and exit would put its
    # end between seconds, which the engine's accounting reads rounded (a difference of rounding,
    # not of logic).
    settings = replace(sim_settings(config, conf), run_overhead_s=0.0)
    finished: list[JobResult] = []
    policy = RecordingDike()
    jobs = trace(typed, every_job_typed=billed)  # billed: each run's type known from its request
    simulator = Simulator(
        jobs, SimCluster(conf, topology), policy, config.policy_params("dike"), settings,
        Timeline(origin=jobs[0].submit, width=60.0), finished.append,
    )
    simulator.run()
    # An instant with waiting and running jobs, and enough finished ones for derived thresholds.
    snapshot, decisions = next(
        (s, d) for s, d in policy.seen
        if s.pending and s.running and len(s.completed_service_gpu_s) >= 5
    )
    accounts = {j.job_id: j.account for j in jobs}
    types = {j.job_id: j.gpu_types for j in jobs}
    names = {j.job_id: j.name for j in jobs}
    records = [
        AccountingRecord(
            job_id=r.job_id, display_id=r.display_id, user=r.user, account=accounts[r.job_id], partition="gpu",
            state=JobState.COMPLETED, state_text="COMPLETED", submit=r.submit, start=r.start, end=r.end,
            elapsed_s=int(r.end - r.start), gpus=r.gpus, name=names[r.job_id], gpu_types=types[r.job_id],
            alloc_gpu_types=types[r.job_id],
        )
        for r in finished if r.end <= snapshot.time
    ]
    # What squeue shows: the jobs as Slurm knows them, without the engine's or simulator's memory.
    shown = [
        replace(j, attained_gpu_s=0.0, run_count=0, last_run_s=0.0, true_duration_s=None, pending_since=None)
        for j in snapshot.jobs
    ]
    backend = FakeBackend(shown, snapshot.nodes, snapshot.topology, time=snapshot.time, records=records,
                          priority=settings.priority_model if billed else None)
    engine_policy = RecordingDike()
    Engine(config, backend, StateStore(config.engine.state_db), policy=engine_policy).plan()
    ((engine_snapshot, engine_decisions),) = engine_policy.seen

    assert engine_snapshot.time == snapshot.time
    assert [n.gpu_types for n in engine_snapshot.nodes] == [n.gpu_types for n in snapshot.nodes]
    assert {j.job_id: j.gpu_types for j in engine_snapshot.jobs} == {j.job_id: j.gpu_types for j in snapshot.jobs}
    if typed:
        assert {n.gpu_types for n in snapshot.nodes} == {("a100",), ("v100",)}
        assert {j.gpu_types for j in snapshot.jobs} == ({("a100",), ("v100",)} if billed else {("a100",), ("v100",), ()})
    if billed:  # a running a100 job has attained twice its GPU-seconds, a v100 job its GPU-seconds
        for job in snapshot.running:
            run_gpu_s = job.gpus * (snapshot.time - job.start_time)
            if job.run_count == 1 and run_gpu_s > 0:
                assert job.attained_gpu_s == pytest.approx(run_gpu_s * (2.0 if job.gpu_types == ("a100",) else 1.0))
    assert engine_snapshot.completed_service_gpu_s == pytest.approx(snapshot.completed_service_gpu_s)
    assert engine_snapshot.user_usage_gpu_s == pytest.approx(snapshot.user_usage_gpu_s)
    # the service prior: learned from the same finished jobs, it predicts the same for every job
    assert engine_snapshot.service_prior.jobs == snapshot.service_prior.jobs >= 5
    predicted = [
        tuple(p.predict(j.user, j.name, j.gpus, 3) for p in (engine_snapshot.service_prior, snapshot.service_prior))
        for j in snapshot.jobs
    ]
    assert all(p is not None for pair in predicted for p in pair)
    for mine, twin in predicted:
        assert (mine.group, mine.values, mine.count, mine.gpu_s) == (twin.group, twin.values, twin.count,
                                                                     pytest.approx(twin.gpu_s))
    simulated = {j.job_id: j for j in snapshot.jobs}
    for job in engine_snapshot.jobs:
        twin = simulated[job.job_id]
        assert (job.state, job.attained_gpu_s, job.run_count, job.pending_since, job.last_run_s) == pytest.approx(
            (twin.state, twin.attained_gpu_s, twin.run_count, twin.pending_since or twin.submit_time, twin.last_run_s)
        )
    assert engine_decisions.order() == decisions.order()
    assert [(p.job_id, p.level, p.promoted) for p in engine_decisions.priorities] == [
        (p.job_id, p.level, p.promoted) for p in decisions.priorities
    ]
    assert [p.score for p in engine_decisions.priorities] == pytest.approx([p.score for p in decisions.priorities])
    assert engine_decisions.placements == decisions.placements
    assert engine_decisions.requeues == decisions.requeues
