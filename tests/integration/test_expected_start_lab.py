"""The expected start against the actual start on the real lab (issue 54, item 3; docs/engine.md,
"Expected start").

A simple deterministic queue: dikeuser1 has finished four 8-GPU jobs of one name that each slept
RUN_S; four more of that name fill the cluster, each with a ten-minute time limit, and an 8-GPU job
waits behind them. Dike's simulator ends the running jobs at the prior's expected RUN_S, so the
waiting job's expected start is about RUN_S after theirs; `squeue --start` plans by the time limits,
ten minutes out. The waiting job really starts when the first of them ends.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import pytest
from test_engine_live import engine, wait_state  # noqa: F401 (the fixture)

pytestmark = pytest.mark.scenario

RUN_S = 45  # each job of the history and each blocker sleeps this long
TOLERANCE_S = 10  # predicted against actual start: Slurm's next pass after an end (sched_interval=5), launch


def test_the_expected_start_follows_the_priors_run_times_and_lands_within_the_tolerance(slurm_lab, engine):  # noqa: F811
    lab = slurm_lab
    # four finished runs are history enough here; a site's prior waits for min_history_jobs (50), and
    # for a measurable power (prior_min_power): four runs of one name have none
    engine.env["DIKE_POLICIES__DIKE__MIN_HISTORY_JOBS"] = "4"
    engine.env["DIKE_POLICIES__DIKE__PRIOR_MIN_POWER"] = "-1"
    name = f"block{os.getpid()}"  # a name no earlier test's jobs carry

    def runs(time_limit: str) -> list[int]:
        return [lab.sbatch("-w", node, "--gres=gpu:8", f"--job-name={name}", f"--time={time_limit}", "--wrap",
                           f"sleep {RUN_S}", user="dikeuser1") for node in ("n1", "n2", "n3", "n4")]

    history = runs("10")

    def finished_in_window() -> bool:  # the engine reads accounting from the test's start (LabEngine.since)
        since = f"now-{max(0, math.floor(time.time() - engine.since))}seconds"
        records = lab.sacct_records("--allusers", "-S", since, "-E", "now")
        return all(any(run.state.value == "COMPLETED" for run in records.get(job, ())) for job in history)

    lab.wait_for(finished_in_window, timeout=120, message=f"the history jobs {history} COMPLETED in sacct")
    blockers = runs("10")
    for job in blockers:
        wait_state(lab, job, "RUNNING")
    waiting = lab.sbatch("--gres=gpu:8", "--job-name=next", "--time=10", "--wrap", "sleep 5", user="dikeuser1")

    explained = json.loads(engine("explain", str(waiting), "--json").stdout)
    job: dict[str, Any] = explained["job"]
    assert job["expected_start"] is not None, job["expected_start_note"]
    assert explained["expected_starts"]["basis"]["service prior"] >= 4, explained["expected_starts"]
    # the blockers end RUN_S after they started, not at their limits, ten minutes out
    first = min(_start_time(lab, j) or math.inf for j in blockers)
    assert job["expected_start"] < first + RUN_S + TOLERANCE_S, (job, first)
    # squeue --start shows a time once Slurm's backfill has planned the job (bf_interval=5)
    squeue_start = lab.wait_for(lambda: _start_time(lab, waiting, "--start"), 30, f"squeue --start of job {waiting}")

    wait_state(lab, waiting, "RUNNING", timeout=RUN_S + 60)
    actual = _start_time(lab, waiting)
    dike_error, squeue_error = abs(job["expected_start"] - actual), abs(squeue_start - actual)
    assert dike_error <= TOLERANCE_S, (job, actual)
    assert dike_error <= squeue_error, (dike_error, squeue_error)


def _start_time(lab: Any, job: int, *options: str) -> float | None:
    """squeue's START_TIME of a job (with --start: Slurm's expected start of a pending one), in
    epoch seconds, or None while it shows none; Slurm prints the local time of the machine the lab
    and the tests share."""
    text = lab.run("squeue", *options, "-h", "-j", str(job), "-o", "%S").stdout.strip()
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")) if text[:1].isdigit() else None
