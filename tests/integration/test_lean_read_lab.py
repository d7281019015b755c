"""On the real lab: the lean read (squeue -O, squeue -o %A%x, sinfo -N -O) and the JSON read build
the same cluster, job for job, with hostile names and comments among the jobs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytestmark = pytest.mark.adapter

SlurmLab = Any
HOSTILE_NAME = "run|1^x $(touch /tmp/dike-lean-pwned) `id` ^deadbeef"
HOSTILE_COMMENT = "a|b|c ;dike:level=9 | ^f00dcafe x"


def reads(lab: SlurmLab) -> tuple[Any, Any]:
    from dike_slurm.config import SlurmSettings
    from dike_slurm.slurm.backends.cli import SlurmCliBackend

    settings = SlurmSettings(slurm_conf=lab.slurm_conf, bin_dir=lab.bin_dir)
    lean = SlurmCliBackend(settings, environ=lab.env, job_read="lean")
    json_read = SlurmCliBackend(settings, environ=lab.env, job_read="json")
    first = lean.read_cluster()
    assert lean.lean_refused is None, lean.lean_refused
    return first, json_read.read_cluster()


@contextmanager
def frozen(lab: SlurmLab, pending: list[int]) -> Iterator[None]:
    """The queue held still for two reads a moment apart: the partition down (no job starts, and
    after the scheduler's next pass every pending job's reason is PartitionDown) and each pending job's
    priority pinned (PriorityCalcPeriod=1 would otherwise recompute it between the reads)."""
    lab.run("scontrol", "update", "PartitionName=gpu", "State=DOWN")
    try:
        for job in pending:
            priority = lab.run("squeue", "-h", "-j", str(job), "-O", "PriorityLong").stdout.split()[0]
            lab.run("scontrol", "update", f"JobId={job}", f"Priority={priority}")

        def settled() -> bool:
            reasons = lab.run("squeue", "-h", "-t", "PD", "-o", "%i %r").stdout.splitlines()
            return bool(reasons) and all(line.split(" ", 1)[1] in ("PartitionDown", "JobHeldUser") for line in reasons)

        lab.wait_for(settled, 60, "the pending jobs' reasons did not all become PartitionDown")
        yield
    finally:
        lab.run("scontrol", "update", "PartitionName=gpu", "State=UP")


def test_the_lean_and_json_reads_build_the_same_cluster_job_for_job(slurm_lab: SlurmLab) -> None:
    lab = slurm_lab
    running = lab.sbatch("-N2", "-w", "n1,n2", "--gres=gpu:8", "-t", "1-02:03:00", "-J", "wide", "--wrap", "sleep 300",
                         user="dikeuser1")
    hostile = lab.sbatch("-w", "n3", "--gres=gpu:1", f"--job-name={HOSTILE_NAME}", f"--comment={HOSTILE_COMMENT}",
                         "--wrap", "sleep 300", user="dikeuser2")
    lab.wait_for(lambda: lab.job_state(running) == "RUNNING" and lab.job_state(hostile) == "RUNNING", 30,
                 "the running jobs did not start")
    placed = lab.sbatch("-N2", "--gres=gpu:8", "--switches=1@5:00", "--constraint=leaf_s1|leaf_s2", "--exclude=n3",
                        "-J", "placed", "--wrap", "sleep 60", user="dikeuser2")
    sweep = lab.sbatch("--array=0-2", "-N4", "--gres=gpu:8", "-J", "sweep", "--wrap", "sleep 60")
    lab.sbatch("-H", "--nice=100", "--gres=gpu:2", "-J", "niced", "--wrap", "sleep 60")
    favoured = lab.sbatch("--nice=-50", "-N4", "--gres=gpu:8", "-t", "90", "-J", "favoured", "--wrap", "sleep 60")
    lab.run("scontrol", "update", f"JobId={placed}", "AdminComment=dike:level=1,attained=0.0gpuh")
    with frozen(lab, [placed, sweep, favoured]):
        lean, json_read = reads(lab)
    theirs = {j.job_id: j for j in json_read.jobs}
    assert [j.job_id for j in lean.jobs] == sorted(theirs)
    for job in lean.jobs:
        other = theirs[job.job_id]
        assert job == other, {k: (v, other.__dict__[k]) for k, v in job.__dict__.items() if v != other.__dict__[k]}
    assert lean.admin_comments == json_read.admin_comments and lean.admin_comments[placed].startswith("dike:level=1")
    assert lean.nodes == json_read.nodes
    # Site factors come from the same `sprio` call in both reads; between the two calls slurmctld
    # may split the pending array into task records (22.05: one read listed record 4726, the other
    # not), so only the jobs both calls listed are compared.
    common = set(lean.site_factors) & set(json_read.site_factors)
    assert common and all(lean.site_factors[j] == json_read.site_factors[j] for j in common)
    by_id = {j.job_id: j for j in lean.jobs}
    assert by_id[hostile].name == HOSTILE_NAME and by_id[hostile].comment == HOSTILE_COMMENT
    assert by_id[placed].placement.features == "leaf_s1|leaf_s2" and by_id[placed].placement.exclude_nodes == ("n3",)
    assert by_id[placed].slurm_reason == "PartitionDown" and by_id[running].slurm_reason == ""
    assert len(lean.jobs) == 6
