"""A sweep as a real Slurm job array on the lab: submitted, waited for, merged, and compared bit for
bit with the same cells run by `sweep local`; a failed cell and a cancelled one show as failed;
re-submitting runs only the unfinished cells.

The array's tasks call this checkout's Python by its absolute path, so this needs the 22.05 lab,
whose jobs run on this host; the 24.11 and 26.05 labs run their jobs inside a chroot where this
virtual environment does not exist, and the test is skipped there (with that reason).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.scenario

SlurmLab = Any  # the slurm_lab fixture (tests/integration/conftest.py)

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "examples" / "sample"
ARRAY_DEADLINE_S = 900


def spec_text() -> str:
    # 3 policies x 2 penalties x 2 seeds = 12 cells, plus a variant whose parameter is out of
    # range: its 4 cells fail. A 300 s policy cycle keeps the replays short (the cells' numbers
    # are compared, not their fidelity).
    return f"""
name = "lab"
policies = ["fifo", "tiresias", "dike"]
penalties = [0, 1]
seeds = [0, 1]
[[dump]]
path = "{SAMPLE / 'sacct.txt'}"
slurm_conf = "{SAMPLE / 'slurm.conf'}"
topology = "{SAMPLE / 'topology.conf'}"
name = "sample"
[[variant]]
label = "dike-bad"
policy = "dike"
params = {{ levels = 1 }}
[replay]
interval_s = 300
[slurm]
max_parallel = 16
"""


def dike_slurm(lab: SlurmLab, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", "dike_slurm", *args], env=lab.env, cwd=cwd,
                            capture_output=True, text=True, timeout=ARRAY_DEADLINE_S)
    assert result.returncode == 0, f"{args} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def wait_for_array(lab: SlurmLab, job_id: int, tasks: int) -> dict[int, str]:
    """Wait until squeue no longer lists the array and sacct has every task in a final state;
    returns task id -> state."""
    lab.wait_for(lambda: not lab.run("squeue", "-h", "-r", "-j", str(job_id), "-o", "%i", check=False).stdout.strip(),
                 ARRAY_DEADLINE_S, f"array {job_id} still queued or running", interval=1.0)

    def final_states() -> dict[int, str] | None:
        records = lab.sacct_records("-a", "-X", "-j", str(job_id))
        states = {}
        for runs in records.values():
            last = runs[-1]
            if last.array_job_id == job_id and last.array_task_id is not None:
                states[last.array_task_id] = last.state.value
        done = len(states) == tasks and not {"PENDING", "RUNNING"} & set(states.values())
        return states if done else None

    return lab.wait_for(final_states, 60, f"sacct does not show the {tasks} tasks of {job_id} finished", interval=1.0)


def test_sweep_as_a_job_array_matches_local_runs_bit_for_bit(slurm_lab: SlurmLab, tmp_path: Path) -> None:
    if slurm_lab.in_chroot:
        pytest.skip(f"the Slurm {slurm_lab.version} lab runs its jobs in a chroot without this checkout's "
                    "virtual environment, so the array's tasks cannot run `dike-slurm sweep run`; the 22.05 lab runs it")
    spec = tmp_path / "spec.toml"
    spec.write_text(spec_text(), encoding="utf-8")
    on_slurm, local = tmp_path / "on-slurm", tmp_path / "local"
    sbatch = str(slurm_lab.bin_dir / "sbatch")

    # Submit: the plan and the array in one command; its last line is the job id.
    started = time.monotonic()
    submitted = dike_slurm(slurm_lab, "sweep", "plan", str(spec), "--out", str(on_slurm), "--submit",
                           "--sbatch", sbatch, cwd=tmp_path)
    job_id = int(submitted.stdout.splitlines()[-1])
    assert "16 cells (0-15)" in submitted.stdout
    states = wait_for_array(slurm_lab, job_id, 16)
    slurm_wall = time.monotonic() - started
    # The bad parameter's cells (12-15) fail alone: the other tasks complete.
    assert states == {i: ("FAILED" if i >= 12 else "COMPLETED") for i in range(16)}, states

    status = json.loads(dike_slurm(slurm_lab, "sweep", "status", str(on_slurm), "--json", cwd=tmp_path).stdout)
    assert status["counts"] == {"ok": 12, "failed": 4, "started": 0, "missing": 0}
    merged = json.loads(dike_slurm(slurm_lab, "sweep", "merge", str(on_slurm), "--json", cwd=tmp_path).stdout)
    assert [f["id"] for f in merged["failed"]] == [12, 13, 14, 15]
    assert all(f["error"].startswith("bad parameter: levels:") and f["log"] == f"logs/cell-{f['id']}.log"
               for f in merged["failed"])
    assert "Input should be greater than or equal to 2" in (on_slurm / "logs" / "cell-12.log").read_text()
    results = {i: json.loads((on_slurm / "results" / f"{i:04d}.json").read_text()) for i in range(16)}
    assert {r["run"]["slurm_job"] for r in results.values()} == {f"{job_id}_{i}" for i in range(16)}

    # The same cells with one local process: the same merged document, bit for bit.
    started = time.monotonic()
    dike_slurm(slurm_lab, "sweep", "plan", str(spec), "--out", str(local), "--local", "1", cwd=tmp_path)
    local_wall = time.monotonic() - started
    local_merged = json.loads(dike_slurm(slurm_lab, "sweep", "merge", str(local), "--json", cwd=tmp_path).stdout)
    assert json.dumps(merged) == json.dumps(local_merged)
    assert (on_slurm / "merge" / "merged.json").read_bytes() == (local / "merge" / "merged.json").read_bytes()
    assert (on_slurm / "merge" / "summary.csv").read_bytes() == (local / "merge" / "summary.csv").read_bytes()
    for i in range(16):
        assert (on_slurm / "cells" / f"{i:04d}.json").read_bytes() == (local / "cells" / f"{i:04d}.json").read_bytes()
    print(f"\n12 ok + 4 failing cells: Slurm array on the lab {slurm_wall:.1f} s, --local 1 {local_wall:.1f} s, "
          f"speed-up {local_wall / slurm_wall:.2f}x")

    # Two cells lost (as if their node died): re-submitting runs only those and the failed ones.
    kept = {i: (on_slurm / "results" / f"{i:04d}.json").read_bytes() for i in range(12) if i not in (3, 7)}
    for i in (3, 7):
        (on_slurm / "results" / f"{i:04d}.json").unlink()
    resubmitted = dike_slurm(slurm_lab, "sweep", "submit", str(on_slurm), "--sbatch", sbatch, cwd=tmp_path)
    second = int(resubmitted.stdout.splitlines()[-1])
    assert second != job_id and "6 cells (3,7,12-15)" in resubmitted.stdout
    # Cell 3 is cancelled while it runs: slurmstepd's line in its log makes it a failed cell.
    log3 = on_slurm / "logs" / "cell-3.log"
    slurm_lab.wait_for(lambda: f"Slurm job {second}_3)" in log3.read_text(), 120, "cell 3 did not start", interval=0.5)
    slurm_lab.run("scancel", f"{second}_3")
    states = wait_for_array(slurm_lab, second, 6)
    assert states == {3: "CANCELLED", 7: "COMPLETED", 12: "FAILED", 13: "FAILED", 14: "FAILED", 15: "FAILED"}
    for i, before in kept.items():
        assert (on_slurm / "results" / f"{i:04d}.json").read_bytes() == before  # not run again
    status = json.loads(dike_slurm(slurm_lab, "sweep", "status", str(on_slurm), "--json", cwd=tmp_path).stdout)
    assert status["counts"] == {"ok": 11, "failed": 5, "started": 0, "missing": 0}
    assert {"id": 3, "state": "failed", "log": "logs/cell-3.log",
            "error": "killed (cancelled); no result written"} in status["unfinished"]

    third = dike_slurm(slurm_lab, "sweep", "submit", str(on_slurm), "--sbatch", sbatch, cwd=tmp_path)
    assert "5 cells (3,12-15)" in third.stdout
    wait_for_array(slurm_lab, int(third.stdout.splitlines()[-1]), 5)
    again = json.loads(dike_slurm(slurm_lab, "sweep", "merge", str(on_slurm), "--json", cwd=tmp_path).stdout)
    assert json.dumps(again) == json.dumps(local_merged)
    assert json.loads((on_slurm / "results" / "0007.json").read_text())["run"]["slurm_job"] == f"{second}_7"
