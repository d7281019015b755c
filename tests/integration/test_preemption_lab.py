"""Dike's preemption against the real Slurm lab: a level-2 job that opted in is requeued for a
blocked level-0 job, the blocked job is pinned to the freed node and runs there, and the requeued
job keeps its attained service; with a grace signal the job's batch shell is signalled first.

The lab's thresholds are 72 and 720 GPU-seconds (scripts/lab-dike.toml.in), so a 32-GPU job
reaches level 2 within about 25 seconds.
"""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from lab_engine import LabEngine

SlurmLab = Any

PREEMPTING = {
    "DIKE_POLICIES__DIKE__PREEMPTION": "true",
    "DIKE_POLICIES__DIKE__MIN_RUNTIME_S": "5",
    "DIKE_POLICIES__DIKE__FAIRNESS_WEIGHT": "0",
}


def wait_state(lab: SlurmLab, job_id: int, state: str, timeout: float = 60) -> None:
    lab.wait_for(lambda: lab.job_state(job_id) == state, timeout, f"job {job_id} {state}")


def comment(lab: SlurmLab, job_id: int) -> str:
    return lab.run("squeue", "-h", "-j", str(job_id), "-o", "%k").stdout.strip()


def required_nodes(lab: SlurmLab, job_id: int) -> str:
    line = lab.run("scontrol", "show", "job", "-o", str(job_id)).stdout
    match = re.search(r"\bReqNodeList=(\S*)", line)
    return match.group(1) if match else ""


@pytest.fixture
def engine(slurm_lab: SlurmLab, tmp_path: Path) -> LabEngine:
    return LabEngine(slurm_lab, tmp_path, **PREEMPTING)


def cycle(engine: LabEngine, **extra: str) -> str:
    proc = engine.run("run", "--once", "--apply", timeout=120, **extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def big_job_at_level_2(lab: SlurmLab, script: str) -> int:
    """A 4-node x 8-GPU job of dikeuser1 that opted in, running past the 720 GPU-second threshold."""
    big = lab.sbatch("-N4", "--gres=gpu:8", "--requeue", "--comment=dike:preemptible", "--wrap", script,
                     user="dikeuser1")
    wait_state(lab, big, "RUNNING")
    time.sleep(25)  # 32 GPUs x 25 s = 800 GPU-seconds: level 2
    return big


def test_a_level_0_job_preempts_an_opted_in_level_2_job_and_gets_its_node(slurm_lab, engine):
    lab = slurm_lab
    big = big_job_at_level_2(lab, "sleep 600")
    small = lab.sbatch("--gres=gpu:8", "--wrap", "sleep 600", user="dikeuser2")
    wait_state(lab, small, "PENDING")
    cycle(engine)
    with sqlite3.connect(engine.state_db) as db:
        audited = db.execute("SELECT job_id, ok FROM audit WHERE action = 'requeue'").fetchall()
    assert audited == [(big, 1)]
    # the big job is requeued (Slurm holds a requeued batch job back as PENDING)...
    lab.wait_for(lambda: lab.job_state(big) in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "COMPLETING"), 30,
                 f"job {big} requeued")
    # ...and the small one starts on the node it was pinned to
    wait_state(lab, small, "RUNNING", timeout=60)
    pinned = required_nodes(lab, small)
    assert pinned and lab.job_nodes(small) == lab.run("scontrol", "show", "hostnames", pinned).stdout.split()
    # the requeued job keeps its attained service: its first run is in sacct and the engine counts it
    lab.wait_for(lambda: "REQUEUED" in lab.run("sacct", "-n", "-D", "-X", "-j", str(big), "-o", "State",
                                               "-S", "now-1hour").stdout, 30, "the first run in sacct")
    cycle(engine)
    explained = engine.run("explain", str(big), timeout=60).stdout
    match = re.search(r"attained service: ([0-9.]+) GPU-hours over (\d+) run\(s\)", explained)
    assert match, explained
    assert float(match.group(1)) >= 0.2 and int(match.group(2)) >= 1  # >= 720 GPU-seconds
    assert "level 2" in explained


def test_with_a_grace_signal_the_batch_shell_hears_it_before_the_requeue(slurm_lab, engine):
    lab = slurm_lab
    # On the signal the job marks itself (a stand-in for writing a checkpoint); the tag stays.
    script = (
        "trap 'scontrol update JobId=$SLURM_JOB_ID Comment=\"dike:preemptible checkpointed\"' USR1; "
        "sleep 600 & wait; sleep 600 & wait"
    )
    big = big_job_at_level_2(lab, script)
    small = lab.sbatch("--gres=gpu:8", "--wrap", "sleep 600", user="dikeuser2")
    wait_state(lab, small, "PENDING")
    grace = {"DIKE_ENGINE__PREEMPT_SIGNAL": "USR1", "DIKE_ENGINE__PREEMPT_GRACE_S": "4"}
    out = cycle(engine, **grace)
    assert "signalled USR1" in out, out
    lab.wait_for(lambda: "checkpointed" in comment(lab, big), 30, f"job {big} marked itself on USR1")
    assert lab.job_state(big) == "RUNNING"  # not requeued yet: inside its grace period
    time.sleep(5)
    cycle(engine, **grace)
    lab.wait_for(lambda: lab.job_state(big) != "RUNNING", 30, f"job {big} requeued after the grace")
    wait_state(lab, small, "RUNNING", timeout=60)
