"""Issue 30: with `PrivateData=jobs`, a user learns nothing about another user's jobs through any
dike-slurm command or file, and an admin still sees everything.

The test turns PrivateData=jobs on in the lab's slurm.conf (`scontrol reconfigure`) and back off
after. dikeuser2 runs the read-only commands: on the host lab and inside the 25.11 chroot as that
user (tests/unprivileged.py, always with CAP_DAC_READ_SEARCH, so it could read the state file,
which makes the audit's own filter the thing tested); in a chroot lab Slurm sees dikeuser2 through the command wrappers and the view
takes the login name from USER and LOGNAME, as `getpass.getuser()` does.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from test_engine_live import LiveEngine, engine, fill_cluster, site_factors, sprio_lists  # noqa: F401
from unprivileged import as_user

pytestmark = pytest.mark.adapter

SlurmLab = Any
USER = "dikeuser2"


def private_data(lab: SlurmLab) -> str:
    line = next(line for line in lab.run("scontrol", "show", "config").stdout.splitlines()
                if line.startswith("PrivateData"))
    return line.split("=", 1)[1].strip()


def reconfigure(lab: SlurmLab, wanted: str) -> None:
    """`scontrol reconfigure`, then wait until slurmctld answers with PrivateData = `wanted` (24.11
    restarts slurmctld on reconfigure: it is unreachable for a moment)."""
    lab.run("scontrol", "reconfigure")

    def applied() -> bool:
        proc = lab.run("scontrol", "show", "config", check=False)
        return proc.returncode == 0 and any(line.split("=", 1)[1].strip() == wanted
                                            for line in proc.stdout.splitlines() if line.startswith("PrivateData"))

    lab.wait_for(applied, timeout=60, message=f"slurmctld to read PrivateData={wanted}")

    def nodes_back() -> bool:  # 24.11 restarts the slurmd too: wait until every node answers again
        states = lab.run("sinfo", "-h", "-N", "-o", "%t", check=False).stdout.split()
        return bool(states) and all(state in ("idle", "mix", "alloc") for state in states)

    lab.wait_for(nodes_back, timeout=60, message="the lab's nodes to answer after the reconfigure")


@pytest.fixture
def private_jobs(slurm_lab: SlurmLab) -> Iterator[None]:
    text = slurm_lab.slurm_conf.read_text()
    slurm_lab.slurm_conf.write_text(text + "PrivateData=jobs\n")
    try:
        reconfigure(slurm_lab, "jobs")
        yield
    finally:
        slurm_lab.slurm_conf.write_text(text)
        reconfigure(slurm_lab, "none")


def as_dikeuser2(lab: SlurmLab, engine: LiveEngine, *args: str) -> subprocess.CompletedProcess[str]:  # noqa: F811
    """`dike-slurm ARGS` as dikeuser2; never a traceback."""
    env = {**engine.environ(), "USER": USER, "LOGNAME": USER}
    argv = [sys.executable, "-m", "dike_slurm", *args]
    if lab.in_chroot:
        env["DIKE_LAB_USER"] = USER
    else:
        assert os.geteuid() == 0, "the integration tests run as root (the lab needs it)"
        argv = as_user(USER, argv, read_anything=True)  # the state file too, wherever this Python lives
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/tmp", timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_a_user_sees_only_their_jobs_with_the_engines_numbers_and_an_admin_sees_all(
        slurm_lab, engine, private_jobs):  # noqa: F811
    lab = slurm_lab
    theirs = fill_cluster(lab, "dikeuser1")
    their_waiting = lab.sbatch("--gres=gpu:8", "--job-name=secret-project", "--wrap", "sleep 5", user="dikeuser1")
    mine = lab.sbatch("--gres=gpu:8", "--job-name=mine", "--wrap", "sleep 5", user=USER)
    sprio_lists(lab, their_waiting, mine)
    engine.cycle()
    admin = json.loads(engine("queue", "--json").stdout)
    assert admin["view"] == "engine"
    by_id = {row["job_id"]: row for row in admin["jobs"]}
    assert set(by_id) >= {*theirs, their_waiting, mine}  # the admin (root) sees every job
    engine_row = by_id[mine]
    assert engine_row["level"] is not None

    queue = as_dikeuser2(lab, engine, "queue", "--json")
    assert queue.returncode == 0, queue.stderr
    document = json.loads(queue.stdout)
    assert document["view"] == "published" and "PrivateData=jobs" in document["note"]
    (row,) = document["jobs"]  # Slurm shows dikeuser2 one job: its own
    assert row["job_id"] == mine and row["user"] == USER
    # the engine's own numbers, as it published them, not a recomputation from a filtered queue
    assert row["level"] == engine_row["level"]
    assert row["attained_gpu_hours"] == round(engine_row["counted_gpu_hours"], 1)
    assert row["priority_now"] == site_factors(lab)[mine][0] == engine_row["priority_now"]
    assert row["priority_planned"] is None and row["reason"] == ""

    status = as_dikeuser2(lab, engine, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert [r["job_id"] for r in json.loads(status.stdout)["jobs"]] == [mine]
    explained = as_dikeuser2(lab, engine, "explain", str(mine))
    assert explained.returncode == 0 and f"level {engine_row['level']}" in explained.stdout, explained.stdout
    assert "where it stands: not shown" in explained.stdout

    # A hidden job and a job that never existed read the same: nothing says the hidden one exists
    hidden = as_dikeuser2(lab, engine, "explain", str(their_waiting), "--json")
    never = as_dikeuser2(lab, engine, "explain", "999999", "--json")
    assert hidden.returncode == never.returncode == 1
    assert {**json.loads(hidden.stdout), "query": "?"} == {**json.loads(never.stdout), "query": "?"}
    hidden_text = as_dikeuser2(lab, engine, "explain", str(their_waiting)).stdout
    never_text = as_dikeuser2(lab, engine, "explain", "999999").stdout
    assert hidden_text.replace(str(their_waiting), "N") == never_text.replace("999999", "N")
    assert "not in the queue as Slurm shows it to you" in hidden_text and "finished (" not in hidden_text

    audit = as_dikeuser2(lab, engine, "audit", "--json")
    assert audit.returncode == 0, audit.stderr
    entries = json.loads(audit.stdout)["entries"]
    assert entries and {e["job_id"] for e in entries} == {mine} and {e["user"] for e in entries} == {USER}
    assert len(json.loads(engine("audit", "--json").stdout)["entries"]) > len(entries)  # the admin's audit has more

    outputs = [queue, status, explained, hidden, never, audit]
    for proc in outputs:  # no name, user or id of dikeuser1's jobs, anywhere
        for secret in ("dikeuser1", "secret-project", *(f'"job_id": {j},' for j in (*theirs, their_waiting))):
            assert secret not in proc.stdout + proc.stderr, (proc.args, secret)

    # the files: the store is private to the service; the metrics file holds no user's data
    assert stat.S_IMODE(os.stat(engine.state_db).st_mode) & 0o077 == 0
    metrics = (engine.dir / "metrics.prom").read_text()
    assert "dikeuser" not in metrics and "secret-project" not in metrics and "dike_" in metrics
