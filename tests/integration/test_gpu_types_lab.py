"""Mixed GPU generations on the two-type lab (issue 33): `DIKE_LAB_GPU_TYPES=a100,v100
scripts/slurm-lab [--slurm V] up` gives n1 and n3 8 a100 each, n2 and n4 8 v100 each, the type also
a node feature. `make test` brings that lab up for this file after the other integration tests.

Typed (per node and per job), untyped and feature-constrained jobs land as Slurm places them and
the engine reads each job's asked types (on 25.11 through pyslurm too) and each node's type; a
blocked a100 job never makes the engine requeue a job on a v100 node, while the same job untyped
does (the control).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from lab_engine import LabEngine

pytestmark = pytest.mark.adapter

SlurmLab = Any
NODE_TYPES = {"n1": ("a100",), "n2": ("v100",), "n3": ("a100",), "n4": ("v100",)}
PREEMPTING = {
    "DIKE_POLICIES__DIKE__PREEMPTION": "true",
    "DIKE_POLICIES__DIKE__MIN_RUNTIME_S": "5",
    "DIKE_POLICIES__DIKE__FAIRNESS_WEIGHT": "0",
}


@pytest.fixture(autouse=True)
def two_type_lab(slurm_lab: SlurmLab) -> None:
    nodes = {n.name: n.gpu_types for n in slurm_lab.cluster().nodes}
    if nodes != NODE_TYPES:
        pytest.skip("needs the two-type lab: DIKE_LAB_GPU_TYPES=a100,v100 scripts/slurm-lab up "
                    f"(this lab's node types: {nodes})")


def wait_state(lab: SlurmLab, job_id: int, state: str, timeout: float = 60) -> None:
    lab.wait_for(lambda: lab.job_state(job_id) == state, timeout, f"job {job_id} {state}")


def cycle(engine: LabEngine) -> str:
    proc = engine.run("run", "--once", "--apply", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def requeues(engine: LabEngine) -> list[tuple[int, int]]:
    with sqlite3.connect(engine.state_db) as db:
        return db.execute("SELECT job_id, ok FROM audit WHERE action = 'requeue' ORDER BY id").fetchall()


def test_typed_untyped_and_constrained_jobs_land_on_their_types(slurm_lab):
    lab = slurm_lab
    a100 = lab.sbatch("--gres=gpu:a100:3", "--wrap", "sleep 300")
    v100 = lab.sbatch("--gres=gpu:v100:3", "--wrap", "sleep 300")
    feature = lab.sbatch("--constraint=a100", "--gres=gpu:2", "--wrap", "sleep 300")
    either = lab.sbatch("-N4", "--constraint=a100|v100", "--gres=gpu:1", "--wrap", "sleep 300")
    untyped = lab.sbatch("--gres=gpu:1", "--wrap", "sleep 300")
    per_job = lab.sbatch("--gpus=v100:2", "--wrap", "sleep 300")
    asked = {a100: ("a100",), v100: ("v100",), feature: ("a100",), either: ("a100", "v100"), untyped: (),
             per_job: ("v100",)}
    for job in asked:
        wait_state(lab, job, "RUNNING")
    jobs = {j.job_id: j for j in lab.cluster().jobs}
    assert {job: jobs[job].gpu_types for job in asked} == asked
    if lab.engine_backend == "pyslurm":  # the 25.11 lab: the engine reads through pyslurm
        jobs = {j.job_id: j for j in lab.pyslurm_backend().read_cluster().jobs}
        assert {job: jobs[job].gpu_types for job in asked} == asked
    for job, types in asked.items():
        for node in lab.job_nodes(job):
            assert not types or NODE_TYPES[node][0] in types, f"job {job} asked for {types} and runs on {node}"
    assert sorted(lab.job_nodes(either)) == ["n1", "n2", "n3", "n4"]


def test_a_blocked_a100_job_never_requeues_a_v100_job(slurm_lab, tmp_path: Path):
    lab = slurm_lab
    engine = LabEngine(lab, tmp_path, **PREEMPTING)
    # the a100 nodes busy with jobs that did not opt in; the v100 nodes with one that did
    held = lab.sbatch("-N2", "--gres=gpu:a100:8", "--wrap", "sleep 600", user="dikeuser2")
    victim = lab.sbatch("-N2", "--gres=gpu:v100:8", "--requeue", "--comment=dike:preemptible",
                        "--wrap", "sleep 600", user="dikeuser1")
    for job in (held, victim):
        wait_state(lab, job, "RUNNING")
    lab.wait_run_time(victim, 6)  # 16 GPUs x 6 s = 96 GPU-seconds: level 1 (the lab's threshold is 72)
    blocked = lab.sbatch("--gres=gpu:a100:8", "--wrap", "sleep 300", user="dikeuser2")
    wait_state(lab, blocked, "PENDING")
    for _ in range(2):
        cycle(engine)
    assert requeues(engine) == []
    assert lab.job_state(victim) == "RUNNING" and lab.job_state(blocked) == "PENDING"
    # The control: the same job untyped may use a v100 node, and the engine preempts for it.
    lab.run("scancel", str(blocked))
    untyped = lab.sbatch("--gres=gpu:8", "--wrap", "sleep 300", user="dikeuser2")
    wait_state(lab, untyped, "PENDING")
    cycle(engine)
    assert requeues(engine) == [(victim, 1)]
    wait_state(lab, untyped, "RUNNING")
    assert lab.job_nodes(untyped)[0] in ("n2", "n4")


def test_attained_service_follows_the_sites_tres_billing_weights(slurm_lab, tmp_path: Path):
    """The lab's partition bills an a100 GPU-second 2.0 and a v100 one 1.0: the engine's attained
    service of a running job is GPUs x 2.0 x seconds on a100 and GPUs x 1.0 x seconds on v100."""
    lab = slurm_lab
    engine = LabEngine(lab, tmp_path)
    a100 = lab.sbatch("--gres=gpu:a100:4", "--wrap", "sleep 300")
    v100 = lab.sbatch("--gres=gpu:v100:4", "--wrap", "sleep 300")
    untyped_on_a100 = lab.sbatch("--gres=gpu:2", "-w", "n1", "--wrap", "sleep 300")
    for job in (a100, v100, untyped_on_a100):
        wait_state(lab, job, "RUNNING")
    started = {job.job_id: job.start_time for job in lab.cluster().jobs}
    lab.wait_for(lambda: time.time() - max(started.values()) >= 15, 30, "15 s of running")
    proc = engine.run("queue", "--json", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {row["job_id"]: row for row in json.loads(proc.stdout)["jobs"]}
    # each job's service / (GPUs x weight) + its start is the same instant: the cycle's now
    weights = {a100: 2.0, v100: 1.0, untyped_on_a100: 2.0}
    gpus = {a100: 4, v100: 4, untyped_on_a100: 2}
    now = {job: rows[job]["attained_gpu_hours"] * 3600 / (gpus[job] * weights[job]) + started[job] for job in weights}
    assert max(now.values()) - min(now.values()) <= 2.0, (now, rows)
    # charged as GPU-seconds of any type, the a100 job's would be half: its "now" 7 s and more early
    assert rows[a100]["attained_gpu_hours"] * 3600 / 4 + started[a100] - max(now.values()) >= 7.0
    print(f"FIGURES billing: attained GPU-hours a100 {rows[a100]['attained_gpu_hours']}, v100 "
          f"{rows[v100]['attained_gpu_hours']}, untyped on a100 {rows[untyped_on_a100]['attained_gpu_hours']}")
