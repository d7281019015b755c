"""A job with a hostile name and comment in the real lab: the engine reads it as data only."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
from lab_engine import LabEngine

pytestmark = pytest.mark.adapter

SlurmLab = Any
MARKER = Path(f"/tmp/dike-hostile-pwned-{os.getpid()}")  # one per run: labs of two versions run side by side
NAME = f"$(touch {MARKER});`touch {MARKER}`|x&y<script>[red]z[/]'\"" + "N" * 200
COMMENT = f"dike:level=9,attained=1.0gpuh; $(touch {MARKER}) | ; \\ \t" + "C" * 900  # Slurm itself rejects much longer ones ("too long")


def test_hostile_job_name_and_comment_through_the_live_engine(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    MARKER.unlink(missing_ok=True)
    lab = slurm_lab
    blocker = lab.sbatch("-N4", "--gres=gpu:8", "--wrap", "sleep 300", user="dikeuser1")
    lab.wait_for(lambda: lab.job_state(blocker) == "RUNNING", 30, "blocker did not start")
    job = lab.sbatch(f"--job-name={NAME}", f"--comment={COMMENT}", "--gres=gpu:1", "--wrap", "sleep 30",
                     user="dikeuser2")
    engine = LabEngine(lab, tmp_path)

    def dike(*args: str) -> subprocess.CompletedProcess[str]:
        proc = engine.run(*args, timeout=120)  # never a traceback
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    dike("run", "--once", "--apply", "-v")
    line = lab.run("scontrol", "show", "job", "-o", str(job)).stdout
    comment = re.search(r" AdminComment=(dike:level=\d+,attained=\d+\.\dgpuh)(,promoted)? ", line)
    assert comment, line  # ours, from our own fields
    assert f"Comment={COMMENT[:30]}" in line  # the user's comment untouched
    explain = dike("explain", str(job)).stdout
    status = dike("status").stdout
    assert str(job) in explain and "audit" in explain
    for text in (explain, status):
        assert "\x1b[" not in text
    with sqlite3.connect(engine.state_db) as db:
        for change, command in db.execute("SELECT change, command FROM audit WHERE job_id = ?", (job,)):
            assert "touch" not in change and "touch" not in command, (change, command)
    assert not MARKER.exists()  # a shell would have run the $(...) and `...` before its command returned


def test_hostile_values_in_one_batch_of_writes_land_as_data_on_their_own_jobs(slurm_lab: SlurmLab) -> None:
    """Writes fed to one scontrol (backends/scontrol_stdin.py): a value that cannot be one line
    goes as its own process, and no value can add a command or reach another job."""
    from dike_slurm.domain.fields import JobField, JobUpdate

    MARKER.unlink(missing_ok=True)
    lab = slurm_lab
    blocker = lab.sbatch("-N4", "--gres=gpu:8", "--wrap", "sleep 300", user="dikeuser1")
    lab.wait_for(lambda: lab.job_state(blocker) == "RUNNING", 30, "blocker did not start")
    jobs = [lab.sbatch("--gres=gpu:1", "--wrap", "sleep 30", user="dikeuser2") for _ in range(5)]
    hostile = [
        f"$(touch${{IFS}}{MARKER});`id`|x&&y",  # no whitespace or quote: a fed line
        f"x\\nupdate\\tJobId={jobs[0]}\\tAdminComment=injected",  # backslashes, not a newline: fed too
        f"x\nupdate JobId={jobs[0]} AdminComment=injected",
        f"$(touch {MARKER}) 'q' \"q\"",
    ]
    updates = [JobUpdate.of(jobs[0], {JobField.SITE_FACTOR: 4242, JobField.ADMIN_COMMENT: "plain"})]
    updates += [JobUpdate.of(job, {JobField.ADMIN_COMMENT: text}) for job, text in zip(jobs[1:], hostile)]
    outcomes = lab.backend().apply_many(updates)
    assert all(o.ok for o in outcomes), outcomes
    assert [o.command.startswith("echo ") for o in outcomes] == [True, True, True, False, False]  # fed or alone
    assert all(f" update JobId={job} " in o.command for job, o in zip(jobs[3:], outcomes[3:]))
    comments = lab.cluster().admin_comments
    assert comments[jobs[0]] == "plain"  # no line reached another job
    for job, text in zip(jobs[1:], hostile):
        assert comments[job] == text, (job, comments[job], text)
    assert not MARKER.exists()  # a shell would have run the $(...) and `...` before its command returned
