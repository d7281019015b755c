"""The site's own decisions are kept, against the real Slurm lab (`run --once --apply` as an admin
runs it): a SiteFactor an admin set with scontrol, before the engine's first cycle or after the
engine wrote; a job in the QOS the configuration exempts; a running job the engine may not requeue
(no preemption), which gets no write Slurm would not use.

The lab's QOS are normal, low and urgent (docs/slurm-lab.md); its thresholds 72 and 720 GPU-seconds.
"""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_engine_live import LiveEngine, fill_cluster, site_factors, sprio_lists, wait_state

SlurmLab = Any


def run_once(engine: LiveEngine) -> subprocess.CompletedProcess[str]:
    """`run --once --apply`; its notes are on stderr."""
    return engine("run", "--once", "--apply")


def audit_rows(engine: LiveEngine, *job_ids: int) -> list[tuple[int, str, str, str]]:
    """(job, action, change, message) of every audit row of these jobs, oldest first."""
    with sqlite3.connect(engine.state_db) as db:
        return db.execute(f"SELECT job_id, action, change, message FROM audit WHERE job_id IN "
                          f"({','.join('?' * len(job_ids))}) ORDER BY id", job_ids).fetchall()


def metric(engine: LiveEngine, name: str) -> float:
    """One sample of the engine's Prometheus textfile (`name` with its labels, as written)."""
    for line in (engine.dir / "metrics.prom").read_text().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in the metrics file")


def set_site_factor(lab: SlurmLab, job_id: int, value: int) -> None:
    """An admin's `scontrol update job N SiteFactor=V`, once sprio shows it."""
    lab.run("scontrol", "update", f"JobId={job_id}", f"SiteFactor={value}")
    lab.wait_for(lambda: site_factors(lab).get(job_id, (None,))[0] == value, 30,
                 f"sprio to show job {job_id}'s SiteFactor {value}")


@pytest.fixture
def engine(slurm_lab: SlurmLab, tmp_path: Path) -> LiveEngine:
    return LiveEngine(slurm_lab, tmp_path)


@pytest.mark.scenario
def test_a_site_factor_set_by_scontrol_before_the_first_cycle_is_kept_and_explain_says_why(slurm_lab, engine):
    lab = slurm_lab
    fill_cluster(lab, "dikeuser1")
    kept = lab.sbatch("--gres=gpu:8", "--wrap", "sleep 30", user="dikeuser2")
    other = lab.sbatch("--gres=gpu:8", "--wrap", "sleep 30", user="dikeuser2")
    sprio_lists(lab, kept, other)
    set_site_factor(lab, kept, 880000)  # before the engine's first cycle

    first = run_once(engine)
    assert f"note: job {kept}: SiteFactor 880000 was set outside the engine" in first.stderr, first.stderr
    assert site_factors(lab)[kept][0] == 880000
    comments = lab.cluster().admin_comments
    assert comments[kept] == "" and comments[other].startswith("dike:level=0,")  # the other job was written
    assert site_factors(lab)[other][0] > 0
    assert [row[1:3] for row in audit_rows(engine, kept)] == [("left-alone", "SiteFactor 880000 kept")]
    assert metric(engine, 'dike_slurm_jobs_left_alone{reason="site"}') == 1
    assert metric(engine, "dike_slurm_left_alone_total") == 1

    explained = engine("explain", str(kept)).stdout
    assert "SiteFactor: now 880000, planned nothing (left to the site, below)" in explained, explained
    assert ("left to the site: SiteFactor 880000 was set outside the engine, which never wrote this job's "
            "SiteFactor: left to the site (with the job's AdminComment)") in explained, explained
    assert "left alone: SiteFactor 880000 kept" in explained

    # the engine's own value is its own; a value changed since it wrote is the site's
    run_once(engine)
    assert site_factors(lab)[kept][0] == 880000 and len(audit_rows(engine, kept)) == 1
    written = site_factors(lab)[other][0]
    assert [row[1] for row in audit_rows(engine, other)] == ["update"] * len(audit_rows(engine, other))
    set_site_factor(lab, other, 4242)
    changed = run_once(engine)
    assert f"note: job {other}: SiteFactor changed to 4242 after the engine set " in changed.stderr, changed.stderr
    assert site_factors(lab)[other][0] == 4242 and site_factors(lab)[kept][0] == 880000
    assert audit_rows(engine, other)[-1][1:3] == ("left-alone", "SiteFactor 4242 kept")
    assert written > 0 and lab.job_state(kept) == lab.job_state(other) == "PENDING"


@pytest.mark.scenario
def test_a_job_in_the_configured_exempt_qos_is_never_written(slurm_lab, tmp_path):
    lab = slurm_lab
    engine = LiveEngine(lab, tmp_path, DIKE_SCOPE__EXEMPT_QOS='["urgent"]')
    # the urgent running job opted in to preemption: were it not exempt, its level change would be written
    running = [lab.sbatch("-w", node, "--gres=gpu:8", "--wrap", "sleep 600", user="dikeuser1")
               for node in ("n1", "n2", "n3")]
    running.append(lab.sbatch("-w", "n4", "--gres=gpu:8", "--qos=urgent", "--requeue", "--comment=dike:preemptible",
                              "--wrap", "sleep 600", user="dikeuser1"))
    for job in running:
        wait_state(lab, job, "RUNNING")
    urgent_running = running[-1]
    urgent = lab.sbatch("--gres=gpu:8", "--qos=urgent", "--wrap", "sleep 30", user="dikeuser2")
    normal = lab.sbatch("--gres=gpu:8", "--wrap", "sleep 30", user="dikeuser2")
    sprio_lists(lab, urgent, normal)

    run_once(engine)
    lab.wait_run_time(urgent_running, 11)  # 8 GPUs x 11 s: past the first level's 72 GPU-seconds
    run_once(engine)
    assert audit_rows(engine, urgent, urgent_running) == []
    assert site_factors(lab)[urgent][0] == 0 and site_factors(lab)[normal][0] > 0
    comments = lab.cluster().admin_comments
    assert comments[urgent] == comments[urgent_running] == "" and comments[normal].startswith("dike:level=0,")
    assert metric(engine, 'dike_slurm_jobs_exempt{reason="qos"}') == 2
    for job in (urgent, urgent_running):
        explained = engine("explain", str(job)).stdout
        assert "not managed: exempt (QOS urgent is in scope.exempt_qos)" in explained, explained
        assert "the engine writes nothing to this job" in explained and "audit (newest last)" not in explained


@pytest.mark.scenario
def test_no_running_job_gets_a_site_factor_write_in_a_run_without_preemption(slurm_lab, tmp_path):
    lab = slurm_lab
    engine = LiveEngine(lab, tmp_path, DIKE_POLICIES__DIKE__PREEMPTION="false")
    blocker = lab.sbatch("-N4", "--gres=gpu:8", "--wrap", "sleep 8")
    wait_state(lab, blocker, "RUNNING")
    # even jobs that opted in: with preemption off, the engine never requeues them
    jobs = [lab.sbatch("--gres=gpu:8", "--requeue", "--comment=dike:preemptible", "--wrap", "sleep 300",
                       user="dikeuser1"),
            lab.sbatch("-N2", "--gres=gpu:8", "--wrap", "sleep 300", user="dikeuser2")]
    sprio_lists(lab, *jobs)
    pending = engine.cycle()  # written while pending: Slurm orders them by it
    assert pending["errors"] == 0 and {row[1] for row in audit_rows(engine, *jobs)} == {"update"}
    written = audit_rows(engine, *jobs)
    for job in jobs:
        wait_state(lab, job, "RUNNING", timeout=60)
    for job in jobs:  # 8 and 16 GPUs x 11 s: past the first level's 72 GPU-seconds, level 1
        lab.wait_run_time(job, 11)
    comments_before = lab.cluster().admin_comments
    for _ in range(2):
        running = engine.cycle()
        assert running["writes"] == 0 and running["written"] == 0, running
    assert audit_rows(engine, *jobs) == written  # the audit agrees: nothing more was written
    assert {job: lab.cluster().admin_comments[job] for job in jobs} == {job: comments_before[job] for job in jobs}
    assert all(comments_before[job].startswith("dike:level=0,") for job in jobs)
    for job in jobs:
        explained = engine("explain", str(job)).stdout
        assert "RUNNING" in explained and ("planned nothing: Slurm reads a started job's SiteFactor only once it is "
                                           "pending again, and the engine may not requeue this one") in explained
        assert "level 1:" in explained, explained
        assert "next cycle writes" not in explained
