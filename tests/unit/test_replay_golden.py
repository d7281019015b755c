"""The bundled sample's reading and replays, pinned.

The simulator is deterministic, so any change in these numbers is a change in behaviour:
of the reader, the simulator, a policy or a default. Each replay pins its summary metrics and
every job's end (a digest of the ends in finish order), so a change that moves jobs but leaves
the averages is caught too. When the change is intended, regenerate the golden file and commit
it with the change that explains it:

    DIKE_REGEN_GOLDEN=1 .venv/bin/pytest tests/unit/test_replay_golden.py

Each replay is its own test (in this process), so that pytest-xdist spreads the six over its
workers; regenerating updates each test's own entry of the one file, under a lock.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from dike_slurm.config import Config
from dike_slurm.sim.kernel.replay import ReplayInput, ReplayTask, load_input, run_tasks, sim_settings

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample"
GOLDEN = ROOT / "tests" / "golden" / "replay-sample.json"
POLICIES = ("fifo", "tiresias", "dike")
# Both figures `make demo` shows: the default configuration (the engine's opt-in rule; the sample
# tags no job, so on day one none is preemptible), and every job preemptible.
SETTINGS = {"day_one": None, "every_job_preemptible": 1.0}
# The replays run the jobs submitted in the sample's first three days (874 of its 2,229 replayed
# jobs), each to its end: a quarter of the whole sample's CPU (about 30 s against 116 s for the
# six, 2026-12-07), with average waits of 0.6-1.0 h, longest waits of 70-106 h, and 145-205
# preemptions in each replay that preempts. `make demo` and `make eval` replay the whole sample.
WINDOW_DAYS = 3


@cache
def _sample() -> ReplayInput:
    return load_input(SAMPLE / "sacct.txt", SAMPLE / "slurm.conf", SAMPLE / "topology.conf")


@cache
def _window() -> ReplayInput:
    """The sample with only the jobs submitted in its first WINDOW_DAYS days."""
    sample = _sample()
    first = sample.trace.jobs[0].submit
    jobs = tuple(job for job in sample.trace.jobs if job.submit < first + WINDOW_DAYS * 86400.0)
    return dataclasses.replace(sample, trace=dataclasses.replace(sample.trace, jobs=jobs))


def _ends_digest(ends: np.ndarray) -> str:
    """Every job's end (ms, in finish order), hashed."""
    return hashlib.sha256(np.round(ends, 3).astype("<f8").tobytes()).hexdigest()


def _golden(update: Callable[[dict], None]) -> dict:
    """The golden file; with DIKE_REGEN_GOLDEN, `update` writes this test's entry into it first."""
    if os.environ.get("DIKE_REGEN_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        with open(GOLDEN.with_suffix(".lock"), "w", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # xdist workers regenerating side by side
            golden = json.loads(GOLDEN.read_text(encoding="utf-8")) if GOLDEN.exists() else {}
            update(golden)
            ordered = {key: golden[key] for key in ("input", *SETTINGS) if key in golden}
            GOLDEN.write_text(json.dumps(ordered, indent=2) + "\n", encoding="utf-8")
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def test_the_sample_reads_as_pinned():
    summary = _sample().input_summary()
    assert summary == _golden(lambda golden: golden.update(input=summary))["input"]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("label", SETTINGS)
def test_the_sample_window_replay_matches_the_golden_file(label, policy):
    replay_input, config = _window(), Config()
    settings = sim_settings(config, replay_input.conf, preemptible=SETTINGS[label])
    (run,) = run_tasks([ReplayTask(policy, policy, settings.comm_penalty)], replay_input, config, settings)
    summary = {**run.metrics.summary, "ends_sha256": _ends_digest(run.metrics.finished_end)}
    if label == "day_one" and policy == "dike":
        assert summary["preemptions"] == 0

    def update(golden: dict) -> None:
        policies = golden.get(label, {}).get("policies", {}) | {policy: summary}
        golden[label] = {"window_days": WINDOW_DAYS, "comm_penalty": settings.comm_penalty,
                         "policies": {name: policies[name] for name in POLICIES if name in policies}}

    expected = _golden(update)[label]
    assert (WINDOW_DAYS, settings.comm_penalty) == (expected["window_days"], expected["comm_penalty"])
    assert summary["jobs"] == len(replay_input.trace.jobs) == 874
    assert summary == expected["policies"][policy]
