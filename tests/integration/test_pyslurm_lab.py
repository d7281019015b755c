"""The pyslurm backend on the real Slurm 25.11 lab, against the command-line backend on the same cluster.

pyslurm 25.11 builds only against Slurm 25.11, and its library needs the lab chroot's glibc, so
these tests run inside that chroot: `scripts/slurm-lab --slurm 25.11 run pytest
tests/integration/test_pyslurm_lab.py` (make test does). Everywhere else they are skipped with
one line. Every read is compared with the command-line backend's read of the same moment (jobs,
GPUs, nodes, reasons, admin comments, accounting); every write is read back through the
command-line backend and reverted; requeue and the grace signal run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from pathlib import Path
from typing import Any

import pytest

from dike_slurm.domain.fields import JobField, JobUpdate, SwitchRequest

SlurmLab = Any  # the slurm_lab fixture (tests/integration/conftest.py)

try:
    import pyslurm  # type: ignore[import-not-found]  # noqa: F401
except ImportError:
    pyslurm = None

pytestmark = [pytest.mark.adapter, pytest.mark.skipif(
    os.environ.get("DIKE_LAB_SLURM") != "25.11" or pyslurm is None,
    reason="the pyslurm backend's lab tests need the Slurm 25.11 lab and run inside its chroot: "
           "scripts/slurm-lab --slurm 25.11 run pytest tests/integration/test_pyslurm_lab.py")]

# Job fields both backends read from Slurm (the rest are the engine's: attained service, runs...)
JOB_FIELDS = ("job_id", "user", "state", "submit_time", "gpus", "num_nodes", "cpus", "account", "partition",
              "qos", "name", "comment", "array_job_id", "array_task_id", "eligible_time", "start_time",
              "time_limit_s", "nodes", "placement", "priority", "nice", "requeueable", "gpu_types",
              "slurm_reason")
RECORD_FIELDS = ("job_id", "array_job_id", "array_task_id", "name", "user", "account", "partition", "qos",
                 "state", "submit", "eligible", "start", "end", "time_limit_s", "num_nodes", "cpus", "gpus",
                 "nodes", "gpu_types", "alloc_gpu_types")


@pytest.fixture
def backends(slurm_lab: SlurmLab) -> tuple[Any, Any]:
    """(the command-line backend, the pyslurm backend) on the lab."""
    return slurm_lab.backend(), slurm_lab.pyslurm_backend()


def job_view(job: Any) -> dict[str, Any]:
    return {name: getattr(job, name) for name in JOB_FIELDS}


def cluster_view(state: Any) -> dict[str, Any]:
    return {"jobs": {j.job_id: job_view(j) for j in state.jobs},
            "nodes": {n.name: dataclasses.asdict(n) for n in state.nodes},
            "admin_comments": dict(state.admin_comments), "site_factors": dict(state.site_factors)}


def same_moment(lab: SlurmLab, cli: Any, pyslurm_backend: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pyslurm read between two equal command-line reads: the cluster did not change under it."""
    def reads() -> tuple[dict[str, Any], dict[str, Any]] | None:
        before = cluster_view(cli.read_cluster())
        through_pyslurm = cluster_view(pyslurm_backend.read_cluster())
        return (before, through_pyslurm) if cluster_view(cli.read_cluster()) == before else None
    return lab.wait_for(reads, 60, "two equal command-line reads around a pyslurm read")


def pending_reasons_set(lab: SlurmLab) -> bool:
    out = lab.run("squeue", "-h", "-t", "PD", "-o", "%r").stdout.split()
    return bool(out) and "None" not in out


def test_reads_equal_the_command_line_backend(slurm_lab: SlurmLab, backends: tuple[Any, Any]) -> None:
    lab = slurm_lab
    cli, through_pyslurm = backends
    since = dt.datetime.now() - dt.timedelta(seconds=5)
    done = lab.sbatch("--gres=gpu:1", "--wrap", "true", user="dikeuser1")
    lab.wait_for(lambda: not lab.unended([done]), 60, f"job {done} ended in accounting")
    running = [
        lab.sbatch("-N2", "-w", "n1,n2", "--gres=gpu:3", "--switches=1", "--wrap", "sleep 300", user="dikeuser1"),
        lab.sbatch("--gpus=2", "--time=30", "--wrap", "sleep 300", user="dikeuser2"),
        lab.sbatch("-n2", "--comment=cpu only", "--wrap", "sleep 300"),
    ]
    lab.wait_for(lambda: all(lab.job_state(j) == "RUNNING" for j in running), 60, f"jobs {running} running")
    pending = [  # none can start while those run (n1 and n2 are partly used)
        lab.sbatch("-N2", "--gres=gpu:8", "--exclude=n3", "--constraint=leaf_s1", "--switches=1@00:05:00",
                   "--wrap", "sleep 60", user="dikeuser2"),
        lab.sbatch("--hold", "--nice=50", "--gres=gpu:2", "--requeue", "--wrap", "sleep 60"),
        lab.sbatch("--array=0-2", "--gres=gpu:8", "-N4", "--wrap", "sleep 60", user="dikeuser1"),
        lab.sbatch("--begin=now+3600", "--nodelist=n2", "--gres=gpu:1", "--wrap", "sleep 60"),
    ]
    lab.run("scontrol", "update", f"JobId={pending[1]}", "AdminComment=dike:level=2,attained=1.0gpuh")
    lab.wait_for(lambda: pending_reasons_set(lab), 60, "a reason on every pending job")

    expected, got = same_moment(lab, cli, through_pyslurm)
    assert set(got["jobs"]) == set(expected["jobs"]) >= set(running + pending)
    for job_id, fields in expected["jobs"].items():
        assert got["jobs"][job_id] == fields, job_id
    assert got["nodes"] == expected["nodes"]
    assert got["admin_comments"] == expected["admin_comments"]
    assert got["site_factors"] == expected["site_factors"] and expected["site_factors"]  # sprio: eligible jobs
    assert sum(j["gpus"] for j in got["jobs"].values() if j["state"].value == "RUNNING") == 6 + 2
    assert sum(n["gpus_alloc"] for n in got["nodes"].values()) == 8

    start, end = since.timestamp(), dt.datetime.now().timestamp() + 60
    by_cli = {r.job_id: r for r in cli.accounting(start, end).records}
    by_pyslurm = {r.job_id: r for r in through_pyslurm.accounting(start, end).records}
    assert set(by_pyslurm) == set(by_cli) >= {done, *running}
    for job_id, record in by_cli.items():
        want = {name: getattr(record, name) for name in RECORD_FIELDS}
        assert {name: getattr(by_pyslurm[job_id], name) for name in RECORD_FIELDS} == want, job_id
    assert by_pyslurm[done].gpus == 1 and by_pyslurm[running[0]].gpus == 6


def blocked_job(lab: SlurmLab) -> int:
    """An eligible pending job that cannot start (every GPU is held by another job): its writes stay."""
    holder = lab.sbatch("-N4", "--gres=gpu:8", "--wrap", "sleep 300")
    lab.wait_for(lambda: lab.job_state(holder) == "RUNNING", 60, f"job {holder} running")
    job = lab.sbatch("--gres=gpu:4", "--constraint=leaf_s2", "--wrap", "sleep 60")
    lab.wait_for(lambda: lab.job_state(job) == "PENDING" and pending_reasons_set(lab), 60, f"job {job} pending")
    return job


def test_writes_read_back_through_scontrol_and_revert(slurm_lab: SlurmLab, backends: tuple[Any, Any]) -> None:
    lab = slurm_lab
    cli, through_pyslurm = backends
    job_id = blocked_job(lab)

    def job() -> Any:
        (found,) = [j for j in cli.read_cluster().jobs if j.job_id == job_id]
        return found

    def site_factor() -> int | None:
        return cli.read_cluster().site_factors.get(job_id)

    original = job()
    writes = [  # (field, value written, what the command-line backend then reads, the revert)
        (JobField.SITE_FACTOR, 4321, lambda: site_factor() == 4321, 0),
        (JobField.NICE, 77, lambda: job().nice == 77, original.nice),
        (JobField.ADMIN_COMMENT, "dike:level=1,attained=0.2gpuh",
         lambda: cli.read_cluster().admin_comments.get(job_id) == "dike:level=1,attained=0.2gpuh", ""),
        (JobField.FEATURES, "leaf_s1", lambda: job().placement.features == "leaf_s1", "leaf_s2"),
        (JobField.EXCLUDED_NODES, ("n2", "n4"), lambda: set(job().placement.exclude_nodes) == {"n2", "n4"}, ()),
        (JobField.REQUIRED_NODES, ("n3",), lambda: job().placement.require_nodes == ("n3",), ()),
        (JobField.SWITCHES, SwitchRequest(1, 300), lambda: job().placement.max_switches == 1, SwitchRequest(0, None)),
    ]
    for key, value, holds, revert in writes:
        outcome = through_pyslurm.apply(JobUpdate.of(job_id, {key: value}))
        assert outcome.ok, (key, outcome)
        assert holds(), (key, job())
        assert through_pyslurm.apply(JobUpdate.of(job_id, {key: revert})).ok, key
    after = job()
    assert after.placement == original.placement and after.nice == original.nice
    assert site_factor() == 0
    assert cli.read_cluster().admin_comments.get(job_id, "") == ""
    # the features were cleared too (a write Slurm ignores would fail its read-back)
    assert through_pyslurm.apply(JobUpdate.of(job_id, {JobField.FEATURES: ""})).ok
    assert job().placement.features is None

    assert through_pyslurm.apply(JobUpdate.of(job_id, {JobField.PRIORITY: 5})).ok
    assert job().priority == 5
    assert through_pyslurm.apply(JobUpdate.of(job_id, {JobField.PRIORITY: None})).ok  # back to Slurm
    lab.wait_for(lambda: (job().priority or 0) > 5, 30, "Slurm's own priority back on the job")


def test_requeue_signal_and_a_gone_job(slurm_lab: SlurmLab, backends: tuple[Any, Any], tmp_path: Path) -> None:
    lab = slurm_lab
    _, through_pyslurm = backends
    mark = tmp_path / "usr1"
    graceful = lab.sbatch("--gres=gpu:1", "--wrap", f"trap 'touch {mark}; exit 0' USR1; sleep 300 & wait")
    requeued = lab.sbatch("--gres=gpu:1", "--requeue", "--wrap", "sleep 300")
    lab.wait_for(lambda: all(lab.job_state(j) == "RUNNING" for j in (graceful, requeued)), 60, "both running")

    assert through_pyslurm.signal(graceful, "USR1").ok
    lab.wait_for(mark.exists, 30, f"job {graceful}'s batch shell caught USR1")

    assert through_pyslurm.requeue(requeued).ok
    lab.wait_for(lambda: "REQUEUED" in lab.run("sacct", "-n", "-X", "-P", "--duplicates", "-j", str(requeued),
                                               "-o", "State").stdout, 60, f"job {requeued}'s requeued run in sacct")
    lab.wait_for(lambda: lab.job_state(requeued) in ("PENDING", "RUNNING"), 60,
                 f"job {requeued} back in the queue after COMPLETING")

    lab.scancel_all()
    gone = through_pyslurm.apply(JobUpdate.of(requeued, {JobField.NICE: 5}))
    assert not gone.ok and gone.job_gone, gone
    started = through_pyslurm.apply(JobUpdate.of(graceful, {JobField.FEATURES: "leaf_s1"}))
    assert not started.ok and started.job_gone, started
