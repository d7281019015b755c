"""The bundled sample's replay metrics, pinned.

The simulator is deterministic, so any change in these numbers is a change in behaviour:
of the reader, the simulator, a policy or a default. When the change is intended, regenerate
the golden file and commit it with the change that explains it:

    DIKE_REGEN_GOLDEN=1 .venv/bin/pytest tests/unit/test_replay_golden.py

Each replay is its own test (in this process), so that pytest-xdist spreads the six over its
workers; regenerating updates each test's own entry of the one file, under a lock.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path

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


@cache
def _sample() -> ReplayInput:
    return load_input(SAMPLE / "sacct.txt", SAMPLE / "slurm.conf", SAMPLE / "topology.conf")


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
def test_bundled_sample_replay_matches_the_golden_file(label, policy):
    replay_input, config = _sample(), Config()
    settings = sim_settings(config, replay_input.conf, preemptible=SETTINGS[label])
    (run,) = run_tasks([ReplayTask(policy, policy, settings.comm_penalty)], replay_input, config, settings)
    summary = run.metrics.summary
    if label == "day_one" and policy == "dike":
        assert summary["preemptions"] == 0

    def update(golden: dict) -> None:
        policies = golden.get(label, {}).get("policies", {}) | {policy: summary}
        golden[label] = {"comm_penalty": settings.comm_penalty,
                         "policies": {name: policies[name] for name in POLICIES if name in policies}}

    expected = _golden(update)[label]
    assert settings.comm_penalty == expected["comm_penalty"]
    assert summary == expected["policies"][policy]
