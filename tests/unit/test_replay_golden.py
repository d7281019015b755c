"""The bundled sample's replay metrics, pinned.

The simulator is deterministic, so any change in these numbers is a change in behaviour:
of the reader, the simulator, a policy or a default. When the change is intended, regenerate
the golden file and commit it with the change that explains it:

    DIKE_REGEN_GOLDEN=1 .venv/bin/pytest tests/unit/test_replay_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dike_slurm.config import Config
from dike_slurm.sim.kernel.replay import ReplayTask, load_input, run_tasks, sim_settings

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "sample"
GOLDEN = ROOT / "tests" / "golden" / "replay-sample.json"
POLICIES = ("fifo", "tiresias", "dike")


def test_bundled_sample_replay_matches_the_golden_file():
    """Both figures `make demo` shows: the default configuration (the engine's opt-in rule; the
    sample tags no job, so on day one none is preemptible), and every job preemptible."""
    replay_input = load_input(SAMPLE / "sacct.txt", SAMPLE / "slurm.conf", SAMPLE / "topology.conf")
    config = Config()
    actual: dict = {"input": replay_input.input_summary()}
    for label, preemptible in (("day_one", None), ("every_job_preemptible", 1.0)):
        settings = sim_settings(config, replay_input.conf, preemptible=preemptible)
        tasks = [ReplayTask(name, name, settings.comm_penalty) for name in POLICIES]
        runs = run_tasks(tasks, replay_input, config, settings, workers=2)
        actual[label] = {"comm_penalty": settings.comm_penalty,
                         "policies": {run.name: run.metrics.summary for run in runs}}
    assert actual["day_one"]["policies"]["dike"]["preemptions"] == 0
    if os.environ.get("DIKE_REGEN_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(actual, indent=2) + "\n", encoding="utf-8")
    expected = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert actual == expected
