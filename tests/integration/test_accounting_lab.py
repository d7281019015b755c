"""The sacct readers on what the real Slurm of the lab (22.05, 24.11) prints, in both formats.

Jobs with the shapes a real dump holds (an array, a two-node GPU job, a job cancelled while
pending, a requeued job, a `|` in a job name) are run on the lab; then `sacct --parsable2`
(steps included) and `sacct --json` dumps of them go through `dike-slurm trace stats` and
`dike-slurm replay`, which must read both the same way.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.adapter

SlurmLab = Any  # the slurm_lab fixture of tests/integration/conftest.py

FORMAT = (
    "JobID,JobIDRaw,JobName,User,Account,Partition,QOS,State,Submit,Eligible,Start,End,Elapsed,ElapsedRaw,"
    "Timelimit,NNodes,NCPUS,NodeList,ReqTRES,AllocTRES,Priority,Flags"
)


def dike_slurm(lab: SlurmLab, *args: str) -> subprocess.CompletedProcess[str]:
    # Not from the repository root, where the source tree would shadow the installed package.
    result = subprocess.run([sys.executable, "-m", "dike_slurm", *args], env=lab.env, capture_output=True,
                            text=True, timeout=300, cwd="/tmp")
    assert result.returncode == 0, result.stderr
    return result


def test_both_sacct_formats_read_the_same(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    lab = slurm_lab
    since = (dt.datetime.now() - dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
    array = lab.sbatch("--array=1-2", "--gres=gpu:1", "-t", "5", "-J", "sweep|lr=1e-3", "--wrap", "sleep 2")
    wide = lab.sbatch("-N2", "--gres=gpu:8", "-t", "5", "--wrap", "sleep 3", user="dikeuser1")
    held = lab.sbatch("-H", "--gres=gpu:1", "--wrap", "sleep 1")
    requeued = lab.sbatch("--requeue", "--gres=gpu:2", "-t", "10", "--wrap", "sleep 60")
    lab.wait_for(lambda: lab.job_state(requeued) == "RUNNING", 60, "the requeue candidate runs")
    lab.wait_run_time(requeued, 3)  # a run of a few seconds, so that the requeued job has service to replay
    lab.run("scancel", str(held))
    lab.run("scontrol", "requeue", str(requeued))
    lab.wait_for(lambda: lab.job_state(requeued) == "PENDING", 60, "requeued job back to pending")
    lab.run("scancel", str(requeued))
    ids = [array, wide, held, requeued]

    def finished() -> bool:
        out = lab.run("sacct", "-a", "-X", "-n", "-P", "-S", since, "-j", ",".join(map(str, ids)),
                      "-o", "JobIDRaw,State,End").stdout
        rows = [line.split("|") for line in out.splitlines() if line]
        return len(rows) == 5 and all(end not in ("Unknown", "") for _, _, end in rows)

    lab.wait_for(finished, 90, "every job ended in sacct")
    select = ["-a", "--duplicates", "-S", since, "-j", ",".join(map(str, ids))]
    text_dump = tmp_path / "sacct.txt"
    text_dump.write_text(lab.run("sacct", *select, "--parsable2", f"--format={FORMAT}").stdout, encoding="utf-8")
    json_dump = tmp_path / "sacct.json"
    json_dump.write_text(lab.run("sacct", *select, "--json").stdout, encoding="utf-8")

    text_stats = json.loads(dike_slurm(lab, "trace", "stats", str(text_dump), "--json").stdout)
    json_stats = json.loads(dike_slurm(lab, "trace", "stats", str(json_dump), "--json").stdout)
    assert text_stats["skipped_rows"].get("job step (not an allocation)", 0) >= 4  # batch/extern steps
    assert json_stats["skipped_rows"] == {}  # JSON nests the steps inside their job
    for key in ("jobs", "gpu_jobs", "never_started", "requeued_jobs", "array_tasks", "users", "gpu_hours",
                "final_states", "gpus_per_job"):
        assert text_stats[key] == json_stats[key], key
    assert text_stats["jobs"] == 5 and text_stats["array_tasks"] == 2 and text_stats["never_started"] == 1
    # requeued once (one run, then cancelled while pending again): trace stats counts a job with a
    # REQUEUED record (which --duplicates keeps) as requeued, as it counts requeues from the states
    assert text_stats["requeued_jobs"] == 1
    assert text_stats["final_states"]["CANCELLED"] == 2

    summaries = []
    for dump in (text_dump, json_dump):
        out = tmp_path / f"replay-{dump.suffix[1:]}"
        dike_slurm(lab, "replay", str(dump), "--slurm-conf", str(lab.slurm_conf), "--policy", "fifo", "--out", str(out))
        summaries.append(json.loads((out / "summary.json").read_text()))
    text_summary, json_summary = summaries
    assert text_summary["policies"] == json_summary["policies"]
    assert text_summary["input"]["jobs_replayed"] == json_summary["input"]["jobs_replayed"] == 4
