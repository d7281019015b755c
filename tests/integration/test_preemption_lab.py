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
    lab.wait_run_time(big, 24)  # 32 GPUs x 24 s = 768 GPU-seconds: level 2
    return big


@pytest.mark.adapter
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


@pytest.mark.adapter
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
    with sqlite3.connect(engine.state_db) as db:
        (signalled,) = db.execute("SELECT MAX(at) FROM audit WHERE action = 'signal' AND job_id = ?",
                                  (big,)).fetchone()
    lab.wait_for(lambda: time.time() > signalled + 4, 10, "the 4 s grace to pass")  # the engine's own clock
    cycle(engine, **grace)
    lab.wait_for(lambda: lab.job_state(big) != "RUNNING", 30, f"job {big} requeued after the grace")
    wait_state(lab, small, "RUNNING", timeout=60)


# ---------------------------------------------------------------- the freed room lands (issue 25)

# Every level-0 job gets the same score (no fair-share, wait or service-prior term: the prior
# would rank the 1-GPU job, expected to use less, first), so the engine writes the job a
# preemption is for and the jobs queued beside it the same value; Slurm's own factors then decide
# between them (GRES/gpu and job size favour the 4-GPU jobs over the 1-GPU one).
EQUAL_VALUES = {**PREEMPTING, "DIKE_POLICIES__DIKE__WAIT_WEIGHT": "0", "DIKE_POLICIES__DIKE__PRIOR_WEIGHT": "0"}


def freed_node_scenario(lab: SlurmLab) -> tuple[int, int, str, list[int]]:
    """Three nodes busy with jobs that did not opt in, an opted-in 8-GPU job at level 1 on the
    fourth, then a 1-GPU job and two 4-GPU jobs of one user, queued in that order: (victim, the
    1-GPU job, the victim's node, the 4-GPU jobs)."""
    busy = [lab.sbatch("--gres=gpu:8", "--wrap", "sleep 600", user="dikeuser2") for _ in range(3)]
    victim = lab.sbatch("--gres=gpu:8", "--requeue", "--comment=dike:preemptible", "--wrap", "sleep 600",
                        user="dikeuser1")
    for job in (*busy, victim):
        wait_state(lab, job, "RUNNING")
    node = lab.job_nodes(victim)[0]
    lab.wait_run_time(victim, 11)  # 8 GPUs x 11 s = 88 GPU-seconds: level 1 (the threshold is 72)
    beneficiary = lab.sbatch("--gres=gpu:1", "--wrap", "sleep 300", user="dikeuser2")
    others = [lab.sbatch("--gres=gpu:4", "--wrap", "sleep 300", user="dikeuser2") for _ in range(2)]
    for job in (beneficiary, *others):
        wait_state(lab, job, "PENDING")
    return victim, beneficiary, node, others


def preempt_and_follow(lab: SlurmLab, engine: LabEngine, **extra: str) -> tuple[int, int, str, list[int], int]:
    """The scenario, one engine cycle that preempts the victim for the 1-GPU job, then at most two
    more cycles after the victim has left its node: (victim, 1-GPU job, node, 4-GPU jobs, the
    cycles it took the 1-GPU job to be seen running, 3 when it was not)."""
    victim, beneficiary, node, others = freed_node_scenario(lab)
    cycle(engine, **extra)
    with sqlite3.connect(engine.state_db) as db:
        requeued = db.execute("SELECT job_id FROM audit WHERE action = 'requeue' AND ok = 1").fetchall()
    assert requeued == [(victim,)]
    assert required_nodes(lab, beneficiary) == node
    lab.wait_for(lambda: lab.job_state(victim) != "RUNNING" and node not in lab.run(
        "squeue", "-h", "-t", "CG", "-o", "%N").stdout, 60, f"job {victim} left {node}")
    for cycles in (1, 2):
        cycle(engine, **extra)
        if lab.job_state(beneficiary) == "RUNNING":
            return victim, beneficiary, node, others, cycles
    return victim, beneficiary, node, others, 3


def preemption_outcomes(engine: LabEngine) -> list[tuple[int, str]]:
    with sqlite3.connect(engine.state_db) as db:
        return db.execute("SELECT job_id, change FROM audit WHERE action = 'preemption' ORDER BY id").fetchall()


@pytest.mark.scenario
@pytest.mark.parametrize("repeat", range(5))
def test_the_node_a_preemption_frees_goes_to_the_job_it_was_freed_for(slurm_lab, engine, repeat):
    lab = slurm_lab
    engine.env.update(EQUAL_VALUES)
    _, beneficiary, node, others, cycles = preempt_and_follow(lab, engine)
    assert cycles <= 2, f"job {beneficiary} not running 2 cycles after its victim left {node}"
    assert lab.job_nodes(beneficiary) == [node]
    # the room left on the node goes to the next job, as Slurm would give it
    lab.wait_for(lambda: sum(lab.job_state(j) == "RUNNING" for j in others) == 1, 30, "one 4-GPU job runs beside it")
    cycle(engine)  # the engine sees it running (it may have started after the last cycle's read)
    assert preemption_outcomes(engine) == [(beneficiary, "landed")]
    explained = " ".join(engine.run("explain", str(beneficiary), timeout=60).stdout.split())
    assert f"preemption for it landed: job {beneficiary} started on {node}, freed for it" in explained
    print(f"FIGURES freed room (repeat {repeat}): job {beneficiary} running on {node} {cycles} cycle(s) after "
          "its victim left")


@pytest.mark.scenario
def test_without_protection_the_jobs_slurm_puts_first_take_the_freed_node(slurm_lab, engine):
    """The control (protect_freed_nodes = false): at the same value Slurm starts the two 4-GPU jobs
    on the freed node, and the job the preemption was for waits."""
    lab = slurm_lab
    engine.env.update(EQUAL_VALUES)
    _, beneficiary, node, others, cycles = preempt_and_follow(
        lab, engine, DIKE_POLICIES__DIKE__PROTECT_FREED_NODES="false")
    assert cycles == 3 and lab.job_state(beneficiary) == "PENDING"
    assert all(lab.job_nodes(job) == [node] for job in others)
    cycle(engine, DIKE_POLICIES__DIKE__PROTECT_FREED_NODES="false")  # the third after the victim left
    assert preemption_outcomes(engine) == [(beneficiary, "wasted")]
    print(f"FIGURES freed room unprotected: both 4-GPU jobs took {node}, job {beneficiary} still pending")


@pytest.mark.adapter
def test_revert_leaves_no_pin_behind_and_names_the_one_slurm_keeps_on_a_running_job(slurm_lab, engine):
    lab = slurm_lab
    engine.env.update(EQUAL_VALUES)
    _, beneficiary, node, _, cycles = preempt_and_follow(lab, engine)
    assert cycles <= 2 and required_nodes(lab, beneficiary) == node
    # Slurm refuses to clear a running job's node list (it would be a request to shrink the job)
    refused = lab.run("scontrol", "update", f"JobId={beneficiary}", "ReqNodeList=", check=False)
    assert refused.returncode != 0 and required_nodes(lab, beneficiary) == node, refused.stderr
    proc = engine.run("revert", "--apply", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"job {beneficiary}: ReqNodeList: ReqNodeList {node} stays on the running job" in " ".join(proc.stdout.split())
    # requeued, it is pending with the pin Slurm kept: revert clears it now
    lab.run("scontrol", "requeue", str(beneficiary))
    lab.wait_for(lambda: lab.job_state(beneficiary) == "PENDING", 60, f"job {beneficiary} pending again")
    assert required_nodes(lab, beneficiary) == node
    proc = engine.run("revert", "--apply", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert required_nodes(lab, beneficiary) in ("", "(null)")
    with sqlite3.connect(engine.state_db) as db:
        assert db.execute("SELECT COUNT(*) FROM owned WHERE field = 'ReqNodeList'").fetchone()[0] == 0
