"""`queue`, `status --json`, `explain --json`, `audit`, `pause` and `revert JOBID` against the real Slurm lab.

A user reads the queue without root (as dikeuser2: tests/unprivileged.py on the host lab; in a
chroot lab Slurm sees dikeuser2 through the command wrappers, because chroot itself needs root);
every --json document parses and names what the lab holds.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from test_engine_live import LiveEngine, engine, fill_cluster, site_factors, sprio_lists  # noqa: F401
from unprivileged import as_user

pytestmark = pytest.mark.scenario

SlurmLab = Any


def as_json(engine: LiveEngine, *args: str) -> dict:  # noqa: F811
    return json.loads(engine(*args, "--json").stdout)


def test_queue_and_json_show_what_slurm_and_the_engine_hold(slurm_lab, engine):  # noqa: F811
    lab = slurm_lab
    fill_cluster(lab, "dikeuser1")
    job = lab.sbatch("--gres=gpu:8", "--job-name=waits", "--wrap", "sleep 5", user="dikeuser2")
    sprio_lists(lab, job)
    cycle = as_json(engine, "run", "--once", "--apply")
    assert cycle["applied"] is True and any(w["job_id"] == job and w["result"] == "ok" for w in cycle["writes"])
    written = next(w for w in cycle["writes"] if w["job_id"] == job)
    factor = next(c for c in written["changes"] if c["field"] == "SiteFactor")
    assert int(factor["new"]) == site_factors(lab)[job][0]  # what Slurm now holds, per sprio

    queue = as_json(engine, "queue", "--user", "dikeuser2", "--state", "pending")
    (row,) = [r for r in queue["jobs"] if r["job_id"] == job]
    assert row["name"] == "waits" and row["state"] == "PENDING" and row["level"] == 0
    assert row["priority_now"] == int(factor["new"]) and row["reason"].startswith("level=0")
    assert all(r["user"] == "dikeuser2" for r in queue["jobs"])
    table = engine("queue")
    assert table.stdout.splitlines()[0].startswith("configuration: ") and "waits" in table.stdout

    status = as_json(engine, "status")
    assert status["state_file"] == str(engine.state_db) and status["last_cycle"]["applied"] is True
    assert {r["job_id"] for r in status["jobs"]} >= {job}
    explained = as_json(engine, "explain", str(job))
    assert explained["status"] == "active" and explained["audit"][0]["change"].startswith("SiteFactor ")
    assert as_json(engine, "audit", "--job", str(job))["entries"]


def test_explain_says_why_a_job_waits_where_it_stands_and_what_would_change_it(slurm_lab, engine):  # noqa: F811
    """Issue 30, item 2: on a full lab, two waiting jobs of dikeuser2; the later one stands second
    of the two, and what would move it is a job ending (no lab job is opted in to preemption)."""
    lab = slurm_lab
    fill_cluster(lab, "dikeuser1")
    first = lab.sbatch("--gres=gpu:8", "--job-name=first", "--wrap", "sleep 5", user="dikeuser2")
    second = lab.sbatch("--gres=gpu:8", "--job-name=second", "--wrap", "sleep 5", user="dikeuser2")
    assert as_json(engine, "run", "--once", "--apply")["applied"] is True
    # an update resets squeue's REASON to None: Slurm names one again at its next scheduler pass
    lab.wait_for(lambda: lab.run("squeue", "-h", "-j", str(second), "-o", "%r").stdout.strip() not in ("", "None"),
                 60, "Slurm gave the waiting job no reason")
    explained = as_json(engine, "explain", str(second))
    assert explained["status"] == "active" and explained["job"]["state"] == "PENDING"
    standing = explained["standing"]
    assert (standing["place"], standing["pending"], standing["ahead"]) == (2, 2, 1), standing
    assert standing["ahead_at_its_level"] == 1  # both at level 0: the earlier one ranks higher
    changes = explained["would_change"]
    assert changes[0] == "a running job ending: it needs 8 GPU(s) on 1 node(s), and 4 job(s) run in partition gpu"
    assert changes[-1].startswith("no preemption: none of the") or changes[-1].startswith("no preemption: no running")
    text = engine("explain", str(second)).stdout
    assert "where it stands: 2 of 2 pending in partition gpu in the engine's order; 1 ahead of it" in text
    assert "Slurm keeps it waiting: " in text and "    - a running job ending: it needs 8 GPU(s)" in text, text
    assert "policy dike: " not in text and "policy dike: " in engine("explain", "--verbose", str(second)).stdout
    assert as_json(engine, "explain", str(first))["standing"]["place"] == 1


def test_pause_stops_the_writes_and_revert_jobid_restores_one_job(slurm_lab, engine):  # noqa: F811
    lab = slurm_lab
    fill_cluster(lab, "dikeuser1")
    first = lab.sbatch("--gres=gpu:8", "--wrap", "sleep 5", user="dikeuser2")
    second = lab.sbatch("--gres=gpu:8", "--wrap", "sleep 5", user="dikeuser1")
    sprio_lists(lab, first, second)
    assert as_json(engine, "pause", "--reason", "lab test")["paused"] is True
    paused = as_json(engine, "run", "--once", "--apply")
    assert paused["writes"] and all(w["result"] == "not run" for w in paused["writes"])
    assert site_factors(lab)[first][0] == 0 and site_factors(lab)[second][0] == 0
    assert as_json(engine, "resume")["paused"] is False
    engine.cycle()
    assert site_factors(lab)[first][0] > 0 and site_factors(lab)[second][0] > 0
    reverted = as_json(engine, "revert", str(first), "--apply")
    assert [w["job_id"] for w in reverted["writes"]] == [first] and reverted["writes"][0]["result"] == "ok"
    sprio_lists(lab, first, second)
    assert site_factors(lab)[first][0] == 0 and site_factors(lab)[second][0] > 0


def test_a_user_without_root_reads_the_queue(slurm_lab, engine):  # noqa: F811
    lab = slurm_lab
    job = lab.sbatch("--gres=gpu:1", "--hold", "--wrap", "sleep 5", user="dikeuser2")
    engine.cycle()
    env = engine.environ()
    argv = [sys.executable, "-m", "dike_slurm", "queue", "--json"]
    if lab.in_chroot:
        env = {**env, "DIKE_LAB_USER": "dikeuser2"}
    else:
        assert os.geteuid() == 0, "the integration tests run as root (the lab needs it)"
        argv = as_user("dikeuser2", argv)
    result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/tmp", timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    (row,) = [r for r in json.loads(result.stdout)["jobs"] if r["job_id"] == job]
    assert row["user"] == "dikeuser2" and row["state"] == "PENDING"
    assert row["slurm_reason"] == "JobHeldUser"  # squeue's REASON, as the user sees it

def test_explain_and_queue_show_the_prediction_from_the_users_finished_jobs(slurm_lab, engine):  # noqa: F811
    """Issue 27: the service prior, live. dikeuser2 finishes three 1-GPU jobs of one name; their next
    job of that name waits, and `explain` and `queue` say what it is expected to use and from which jobs."""
    lab = slurm_lab
    # three finished jobs are history enough here; a site's prior waits for min_history_jobs (50),
    # and for a measurable power (prior_min_power): three runs of one name have none
    engine.env["DIKE_POLICIES__DIKE__MIN_HISTORY_JOBS"] = "3"
    engine.env["DIKE_POLICIES__DIKE__PRIOR_MIN_POWER"] = "-1"
    name = f"warmup{os.getpid()}"  # a name no earlier test's finished jobs carry
    done = [lab.sbatch("--gres=gpu:1", f"--job-name={name}", "--wrap", "sleep 2", user="dikeuser2") for _ in range(3)]

    # The engine reads accounting by time window (sacct -S/-E, from the second after the test
    # began: LabEngine.since), not by job id: wait until that query lists the warmups as completed
    # 1-GPU allocations. The start is relative to now, so that no time zone of the host or of a
    # chroot lab enters it.
    def window_start() -> str:
        return f"now-{max(0, math.floor(time.time() - engine.since))}seconds"  # since may be a moment ahead

    def window() -> dict[int, list[Any]]:
        return lab.sacct_records("--allusers", "-S", window_start(), "-E", "now")

    def all_completed() -> bool:
        records = window()
        return all(any(run.state.value == "COMPLETED" and run.gpus == 1 for run in records.get(job, ()))
                   for job in done)

    lab.wait_for(all_completed, timeout=60, message=f"the three warmup jobs {done} COMPLETED in sacct's window since the test began")
    fill_cluster(lab, "dikeuser1")
    job = lab.sbatch("--gres=gpu:1", f"--job-name={name}", "--wrap", "sleep 5", user="dikeuser2")
    sprio_lists(lab, job)

    explained = as_json(engine, "explain", str(job))
    row = explained["job"]
    assert row["expected_from"]["group"] == {"user": "dikeuser2", "name": name, "gpus": "1"}, (
        f"{row}\nsacct -S {window_start()} -E now:\n{window()}")
    assert row["expected_from"]["finished_jobs"] == 3 and row["expected_from"]["own_jobs_only"] is True
    assert 0 < row["expected_gpu_hours"] < 0.01  # runs of 2-4 s on one GPU
    assert f"from 3 finished jobs of dikeuser2 / {name} / 1 GPUs" in row["expected_from"]["text"]
    text = engine("explain", str(job)).stdout
    assert "expected service: " in text and f"from 3 finished jobs of dikeuser2 / {name} / 1 GPUs" in text
    queue = as_json(engine, "queue", "--user", "dikeuser2")
    (shown,) = [r for r in queue["jobs"] if r["job_id"] == job]
    assert shown["expected_gpu_hours"] == row["expected_gpu_hours"]
    assert shown["expected_from"] == row["expected_from"]
