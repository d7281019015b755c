"""When Slurm starts the `Switches=1@WAIT` clock, measured on the lab (the simulator follows it).

The lab: leaves s1 = n[1-2] and s2 = n[3-4]. Long jobs hold n2 and n4, blockers without a time
limit hold n1 and n3. A 2-node job that asks for one leaf can then only ever run spread over
n1 + n3, and only once the blockers end. If the clock started when the job first fits somewhere
(as a reading of select/cons_tres's `_eval_nodes_topo` suggests), the job would start a whole
wait after the blockers end. Measured on 22.05 and 24.11, it starts as soon as they end: the wait
ran while the job fit nowhere. sim/kernel/scheduler.py starts the clock when the constraint is set
(tests/unit/test_sim.py replays this scenario).
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest

pytestmark = pytest.mark.adapter

SlurmLab = Any
WAIT_S = 30
BLOCKER_S = 40  # past WAIT_S with room: the wait has run out before the blockers end


def wait_state(lab: SlurmLab, job_id: int, state: str, timeout: float = 60) -> None:
    lab.wait_for(lambda: lab.job_state(job_id) == state, timeout, f"job {job_id} {state}")


def times(lab: SlurmLab, job_id: int) -> tuple[float, float]:
    """(start, end) of a job's allocation from sacct, epoch seconds (0 where not known yet)."""
    out = lab.run("sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "Start,End", "-S", "now-1hour").stdout
    lines = out.strip().splitlines()
    if not lines:
        return 0.0, 0.0
    start, end = lines[-1].split("|")[:2]

    def epoch(text: str) -> float:
        try:
            return datetime.datetime.fromisoformat(text).timestamp()
        except ValueError:  # Unknown, None: not there yet
            return 0.0

    return epoch(start), epoch(end)


def test_the_switches_wait_runs_while_the_job_fits_nowhere(slurm_lab):
    lab = slurm_lab
    holders = [lab.sbatch("-w", node, "--gres=gpu:8", "--wrap", "sleep 600") for node in ("n2", "n4")]
    blockers = [lab.sbatch("-w", node, "--gres=gpu:8", "--wrap", f"sleep {BLOCKER_S}") for node in ("n1", "n3")]
    for job in holders + blockers:
        wait_state(lab, job, "RUNNING")
    heavy = lab.sbatch("-N2", "--gres=gpu:8", f"--switches=1@00:00:{WAIT_S}", "--wrap", "sleep 5")
    wait_state(lab, heavy, "RUNNING", timeout=BLOCKER_S + WAIT_S + 60)
    lab.wait_for(lambda: all(times(lab, b)[1] for b in blockers), 30, "the blockers' ends in sacct")
    freed = max(times(lab, b)[1] for b in blockers)
    started = lab.wait_for(lambda: times(lab, heavy)[0], 30, "the heavy job's start in sacct")
    assert sorted(lab.job_nodes(heavy)) == ["n1", "n3"]  # spread: the wait had run out
    # Counted from when it first fit, the job would have started WAIT_S (30 s) after the nodes
    # freed; it started within a scheduling pass or two (sched_interval=5 on the lab).
    delay = started - freed
    assert delay <= 12, f"started {delay:.0f} s after the nodes freed"
