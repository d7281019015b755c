"""Two rules of Dike about what one user's jobs may do to the others, against the real Slurm lab.

- A running job is never requeued for its own user's job of the same name and size
  (policies/dike.py, `WorseLevels.rule`'s `gains`): the swap would promise nothing but the loss.
  The setup is test_preemption_lab.py's `test_a_level_0_job_preempts_an_opted_in_level_2_job_and_gets_its_node`
  with dikeuser1's own copy of the running job in place of dikeuser2's 8-GPU job; that job itself
  comes last, into the same engine state, and is preempted for.
- A job cancelled after a short run, on a new cluster, does not move other users' priorities: the
  service prior learns it in its own user's groups only (dike_slurm/domain/service_prior.py,
  `never_ran`), and none of the prior is in force below `min_history_jobs` finished jobs that really
  ran (policies/dike.py, `_prior_use`; 50 by default, 1 here): the cancelled job is the engine's only
  finished job, and no one's evidence, so it cannot bring the prior into force (it did, weight 0 to 2,
  while such a job counted). Not covered: with the prior already in force, the cancelled job's service still joins the
  finished jobs' service that "how short" is measured against (`Snapshot.completed_service_gpu_s`,
  dike_slurm/slurm/usage.py `completed_service`), and that moves other users' values (seen on the
  lab with min_history_jobs = 2: SiteFactor 658121 -> 729983, their expected service unchanged).
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from typing import Any

import pytest
from lab_engine import LabEngine
from test_engine_live import site_factors, sprio_lists
from test_preemption_lab import PREEMPTING, big_job_at_level_2, cycle, wait_state

SlurmLab = Any


def start_time(lab: SlurmLab, job_id: int) -> str:
    return lab.run("squeue", "-h", "-j", str(job_id), "-o", "%S").stdout.strip()


def requeues(engine: LabEngine) -> list[tuple[int, int]]:
    with sqlite3.connect(engine.state_db) as db:
        return db.execute("SELECT job_id, ok FROM audit WHERE action = 'requeue'").fetchall()


def kinds(lab: SlurmLab, *job_ids: int) -> dict[int, tuple[str, str, int]]:
    """(user, job name, GPUs) of each job, as the engine reads them (what `gains` compares)."""
    jobs = {job.job_id: job for job in lab.cluster().jobs}
    return {job_id: (jobs[job_id].user, jobs[job_id].name, jobs[job_id].gpus) for job_id in job_ids}


@pytest.mark.scenario
def test_a_job_is_never_requeued_for_its_own_users_job_of_the_same_name_and_size(slurm_lab, tmp_path):
    lab = slurm_lab
    engine = LabEngine(lab, tmp_path, **PREEMPTING)
    big = big_job_at_level_2(lab, "sleep 600")  # dikeuser1's opted-in 4 x 8-GPU job, at level 2
    started = start_time(lab, big)
    twin = lab.sbatch("-N4", "--gres=gpu:8", "--wrap", "sleep 600", user="dikeuser1")
    wait_state(lab, twin, "PENDING")
    shapes = kinds(lab, big, twin)
    assert shapes[twin] == shapes[big] == ("dikeuser1", "wrap", 32), shapes
    # the positive case requeues in its first cycle: three cycles here, and the big job is untouched
    for _ in range(3):
        cycle(engine)
        assert requeues(engine) == []
        assert lab.job_state(big) == "RUNNING" and start_time(lab, big) == started
    # the twin outranks it by level all along: only being the same kind of job holds it back
    comments = lab.cluster().admin_comments
    assert comments[big].startswith("dike:level=2,") and comments[twin].startswith("dike:level=0,"), comments
    assert lab.job_state(twin) == "PENDING"
    # explain says so, as the preemption stage decides it (it once promised the requeue)
    said = engine.run("explain", str(twin), timeout=120)
    assert said.returncode == 0 and "no preemption: the 1 running job(s) of a worse level in its partition that " \
        "may be preempted promise no gain for it" in said.stdout, said.stdout + said.stderr

    # the contrast, in the same engine state: dikeuser2's 8-GPU job of the positive case
    small = lab.sbatch("--gres=gpu:8", "--wrap", "sleep 600", user="dikeuser2")
    wait_state(lab, small, "PENDING")
    assert kinds(lab, small)[small] == ("dikeuser2", "wrap", 8)
    said = engine.run("explain", str(small), timeout=120)
    assert said.returncode == 0 and "a preemption: 1 running job(s) of a worse level in its partition may be " \
        "requeued for it" in said.stdout, said.stdout + said.stderr
    cycle(engine)
    assert requeues(engine) == [(big, 1)]
    lab.wait_for(lambda: lab.job_state(big) in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "COMPLETING"), 30,
                 f"job {big} requeued")


def status_rows(engine: LabEngine, job_ids: list[int]) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """`status --json`: the rows of these jobs, and the service prior in force."""
    proc = engine.run("status", "--json", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads(proc.stdout)
    rows = {row["job_id"]: row for row in document["jobs"] if row["job_id"] in job_ids}
    assert sorted(rows) == sorted(job_ids), document["jobs"]
    return rows, document["service_prior"]


def writes_to(engine: LabEngine, job_ids: list[int]) -> list[tuple[int, str]]:
    """The engine's audited writes to these jobs."""
    with sqlite3.connect(engine.state_db) as db:
        return db.execute(f"SELECT job_id, change FROM audit WHERE action = 'update' AND job_id IN "
                          f"({','.join('?' * len(job_ids))}) ORDER BY id", job_ids).fetchall()


def explained(engine: LabEngine, job_id: int) -> dict[str, Any]:
    proc = engine.run("explain", str(job_id), "--json", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def what_the_prior_gives(row: dict[str, Any]) -> dict[str, Any]:
    """What a job's row owes the service prior and its ranking: the value planned, the level, the
    reason (its wait figure, which grows with the clock, left out) and the expected service."""
    return {"planned": row["priority_planned"], "level": row["level"],
            "reason": re.sub(r"\bwait=\d+\.\d+", "wait=*", row["reason"]),
            "expected_gpu_hours": row["expected_gpu_hours"], "expected_from": row["expected_from"]}


@pytest.mark.scenario
def test_a_job_cancelled_after_a_short_run_on_a_new_cluster_does_not_move_other_users_priorities(slurm_lab, tmp_path):
    lab = slurm_lab
    # The wait term grows with the clock between the two cycles: without it, every value the
    # engine plans for a waiting job of a user with no usage is a function of its level, fair share
    # and expected service alone, so "the same" is exact, not within engine.priority_tolerance.
    # min_history_jobs = 1: one finished job that really ran would be enough evidence; prior_min_power
    # = -1: whatever its power (one job has none), so that only the evidence rule keeps the prior out
    engine = LabEngine(lab, tmp_path, DIKE_POLICIES__DIKE__WAIT_WEIGHT="0", DIKE_POLICIES__DIKE__MIN_HISTORY_JOBS="1",
                       DIKE_POLICIES__DIKE__PRIOR_MIN_POWER="-1")
    lab.wait_for(lambda: time.time() >= engine.since, 5, "the engine's accounting window to begin")
    blocker = lab.sbatch("-w", "n1", "--gres=gpu:8", "--wrap", "sleep 600", user="dikeuser1")
    short = lab.sbatch("-w", "n2", "--gres=gpu:8", "--wrap", "sleep 600", user="dikeuser1")
    for job in (blocker, short):
        wait_state(lab, job, "RUNNING")
    # other users' jobs, held behind the blocker on n1: one of the short job's name and size (the
    # groups (name, GPUs), (GPUs,) and every job would lend it the short job's run), one of another
    # name and size, and root's
    others = [
        lab.sbatch("-w", "n1", "--gres=gpu:8", "--wrap", "sleep 60", user="dikeuser2"),
        lab.sbatch("-w", "n1", "--gres=gpu:1", "--job-name=eval", "--wrap", "sleep 60", user="dikeuser2"),
        lab.sbatch("-w", "n1", "--gres=gpu:8", "--wrap", "sleep 60"),
    ]
    for job in others:
        wait_state(lab, job, "PENDING")
    assert kinds(lab, short, others[0])[others[0]][1:] == kinds(lab, short)[short][1:] == ("wrap", 8)
    sprio_lists(lab, *others)

    cycle(engine)
    written_before = writes_to(engine, others)
    assert {job for job, _ in written_before} == set(others), written_before
    factors_before = {job: site_factors(lab)[job][0] for job in others}
    assert all(value > 0 for value in factors_before.values()), factors_before
    rows, prior_before = status_rows(engine, others)
    before = {job: what_the_prior_gives(rows[job]) for job in others}
    assert all(row["expected_gpu_hours"] is None for row in before.values()), before
    explained_before = explained(engine, others[0])

    # a run of 10 s on 8 GPUs (80 GPU-seconds, past the first level's 72) stands for the site's
    # 78 s: every run below service_prior.NEVER_RAN_S (300 s) counts alike
    lab.wait_run_time(short, 10)
    lab.run("scancel", str(short))
    lab.wait_for(lambda: not lab.unended([short]), 60, f"accounting to record the end of job {short}")
    (run,) = lab.sacct_records("--allusers", "-j", str(short))[short]
    assert run.state.value == "CANCELLED" and run.start >= engine.since and 10 <= run.end - run.start < 300, run

    cycle(engine)
    rows, prior_after = status_rows(engine, others)
    after = {job: what_the_prior_gives(rows[job]) for job in others}
    explained_after = explained(engine, others[0])
    # the engine read the cancelled job: its prior learned it as one that never really ran, no evidence
    assert [(p["finished_jobs"], p["never_ran_jobs"]) for p in (prior_before, prior_after)] == [(0, 0), (0, 1)], \
        (prior_before, prior_after)
    # ...and nothing of it reaches the others: the same values, reasons and (no) expected service
    assert after == before
    assert {job: site_factors(lab)[job][0] for job in others} == factors_before
    assert {k: prior_after[k] for k in ("power", "trust", "weight")} == \
        {k: prior_before[k] for k in ("power", "trust", "weight")}
    assert prior_after["weight"] == 0
    for document in (explained_before, explained_after):
        assert document["status"] == "active" and document["job"]["expected_from"] is None, document["job"]
    assert what_the_prior_gives(explained_after["job"]) == what_the_prior_gives(explained_before["job"])
    assert writes_to(engine, others) == written_before  # nothing written to them after the cancel
