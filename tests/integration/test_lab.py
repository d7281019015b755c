"""Smoke tests of the Slurm lab itself: what the engine relies on really holds."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

pytestmark = pytest.mark.adapter

# the slurm_lab fixture (tests/integration/conftest.py); not imported: two conftest
# modules would clash under the one name "conftest"
SlurmLab = Any

LEAVES = {"s1": {"n1", "n2"}, "s2": {"n3", "n4"}}


def _sacct_jobs(lab: SlurmLab, job_ids: list[int], since: dt.datetime) -> dict[int, Any]:
    """job id -> its last run in `sacct --json`, read by dike_slurm's reader."""
    runs = lab.sacct_records("-a", "--duplicates", "-S", since.strftime("%Y-%m-%dT%H:%M:%S"),
                             "-E", "now", "-j", ",".join(map(str, job_ids)))
    return {job_id: records[-1] for job_id, records in runs.items()}


def _sprio_row(lab: SlurmLab, job_id: int) -> list[str] | None:
    """[id, site factor, priority] from sprio, or None while the job is not listed."""
    out = lab.run("sprio", "-h", "-j", str(job_id), "-o", "%i|%S|%Y", check=False).stdout
    for line in out.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if fields[0] == str(job_id):
            return fields
    return None


def test_four_idle_nodes_with_eight_gpus_on_two_leaves(slurm_lab: SlurmLab) -> None:
    cluster = slurm_lab.cluster()
    nodes = {n.name: n for n in cluster.nodes}
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    for name, node in nodes.items():
        # Slurm 23.02+ flags a node PLANNED while the backfill scheduler holds it for a waiting job,
        # and clears the flag only at its next pass: the previous test's jobs, cancelled a moment
        # ago, can leave it (seen on 24.11: IDLE+PLANNED). The node is idle and schedulable.
        base, *flags = node.state.split("+")
        assert base == "IDLE" and set(flags) <= {"PLANNED"} and node.available, (name, node.state)
        assert (node.gpus, node.gpus_alloc) == (8, 0), (name, node.gpus, node.gpus_alloc)
        assert node.partitions == ("gpu",), (name, node.partitions)
        leaf = "s1" if name in LEAVES["s1"] else "s2"
        assert f"leaf_{leaf}" in node.features, (name, node.features)
    assert cluster.topology.leaves == ("s1", "s2")
    topology = slurm_lab.run("scontrol", "show", "topology").stdout
    assert "SwitchName=top" in topology and "SwitchName=s1" in topology and "SwitchName=s2" in topology


def test_root_and_user_jobs_run_and_reach_sacct(slurm_lab: SlurmLab) -> None:
    since = dt.datetime.now() - dt.timedelta(minutes=1)
    root_job = slurm_lab.sbatch("--gres=gpu:1", "--wrap", "sleep 1")
    user_job = slurm_lab.sbatch("--gres=gpu:2", "--wrap", "sleep 1", user="dikeuser1")

    def both_completed() -> dict[int, dict] | None:
        jobs = _sacct_jobs(slurm_lab, [root_job, user_job], since)
        done = all(j in jobs and jobs[j].state_text == "COMPLETED" for j in (root_job, user_job))
        return jobs if done else None

    jobs = slurm_lab.wait_for(both_completed, 60, f"jobs {root_job}, {user_job} COMPLETED in sacct")
    assert jobs[root_job].user == "root"
    assert jobs[user_job].user == "dikeuser1"
    assert jobs[user_job].account == "research"
    assert jobs[user_job].gpus == 2 and jobs[user_job].ran


def test_two_node_job_with_switches_1_stays_in_one_leaf(slurm_lab: SlurmLab) -> None:
    job = slurm_lab.sbatch("-N2", "--gres=gpu:8", "--switches=1", "--wrap", "sleep 60")
    slurm_lab.wait_for(lambda: slurm_lab.job_state(job) == "RUNNING", 30, f"job {job} RUNNING")
    nodes = set(slurm_lab.job_nodes(job))
    assert nodes in LEAVES.values(), nodes
    shown = slurm_lab.run("scontrol", "show", "job", "-d", "-o", str(job)).stdout
    assert "Switches=1" in shown


def test_switches_1_avoids_a_leaf_that_is_partly_busy(slurm_lab: SlurmLab) -> None:
    blocker = slurm_lab.sbatch("-w", "n1", "--gres=gpu:1", "--wrap", "sleep 120")
    slurm_lab.wait_for(lambda: slurm_lab.job_state(blocker) == "RUNNING", 30, f"job {blocker} RUNNING")
    job = slurm_lab.sbatch("-N2", "--gres=gpu:8", "--switches=1", "--wrap", "sleep 60")
    slurm_lab.wait_for(lambda: slurm_lab.job_state(job) == "RUNNING", 30, f"job {job} RUNNING")
    assert set(slurm_lab.job_nodes(job)) == LEAVES["s2"]


def test_site_factor_on_a_pending_job_shows_in_sprio(slurm_lab: SlurmLab) -> None:
    filler = slurm_lab.sbatch("-N4", "--gres=gpu:8", "--wrap", "sleep 300")
    slurm_lab.wait_for(lambda: slurm_lab.job_state(filler) == "RUNNING", 30, f"job {filler} RUNNING")
    job = slurm_lab.sbatch("--gres=gpu:1", "--wrap", "sleep 10")
    # sprio lists only eligible pending jobs; this one waits for resources
    before = slurm_lab.wait_for(lambda: _sprio_row(slurm_lab, job), 30, f"job {job} in sprio")
    assert slurm_lab.job_state(job) == "PENDING"
    assert int(before[1]) == 0

    slurm_lab.run("scontrol", "update", f"JobId={job}", "SiteFactor=1234")

    after = slurm_lab.wait_for(
        lambda: (row := _sprio_row(slurm_lab, job)) and int(row[1]) == 1234 and row, 15,
        f"SiteFactor=1234 of job {job} in sprio")
    assert int(after[2]) >= 1234


def test_every_job_and_node_slurm_lists_is_read_by_the_engine(slurm_lab: SlurmLab, tmp_path) -> None:
    """Whatever the Slurm version: the backend reads the jobs and nodes squeue and sinfo list
    (their own text output, not JSON), and a live cycle says so."""
    from lab_engine import LabEngine

    lab = slurm_lab
    running = lab.sbatch("-w", "n1", "--gres=gpu:8", "--wrap", "sleep 120", user="dikeuser1")
    lab.wait_for(lambda: lab.job_state(running) == "RUNNING", 30, f"job {running} RUNNING")
    # all four nodes while n1 is busy: these stay pending
    wide = lab.sbatch("-N4", "--gres=gpu:8", "--switches=1@2:00", "--wrap", "sleep 10", user="dikeuser2")
    array = lab.sbatch("--array=0-3", "-N4", "--gres=gpu:8", "--wrap", "sleep 1")
    held = lab.sbatch("-H", "--gres=gpu:1", "--wrap", "sleep 1", user="dikeuser1")
    rows = [line.split("|") for line in lab.run("squeue", "-h", "-a", "-o", "%A|%T").stdout.split()]
    listed = {int(job_id): state for job_id, state in rows}
    assert set(listed) == {running, wide, array, held}, listed
    cluster = lab.cluster()
    assert {j.job_id: j.state.value for j in cluster.jobs} == listed
    (wide_job,) = [j for j in cluster.jobs if j.job_id == wide]
    assert (wide_job.gpus, wide_job.num_nodes, wide_job.placement.max_switches) == (32, 4, 1)
    nodes = set(lab.run("sinfo", "-h", "-N", "-o", "%N").stdout.split())
    assert sorted(n.name for n in cluster.nodes) == sorted(nodes) == ["n1", "n2", "n3", "n4"]
    assert {n.name: n.gpus_alloc for n in cluster.nodes} == {"n1": 8, "n2": 0, "n3": 0, "n4": 0}
    proc = LabEngine(lab, tmp_path).run("run", "--once", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(listed)} jobs in scope" in proc.stdout, proc.stdout
