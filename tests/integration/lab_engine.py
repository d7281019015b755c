"""dike-slurm as an admin runs it against the Slurm lab: a subprocess with a private state file.

Each engine reads accounting only from the whole second after it was made (`accounting.since`), so
the lab's earlier jobs do not colour the users' usage or the service prior in the test that owns it.
The bound is a fixed time, not a look-back from each run's own clock: a look-back moved with the
start-up time of each `python -m dike_slurm`, so a job of the previous test that ended near the
bound was history in one cycle and not in the next (seen: a second cycle rewrote a SiteFactor).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any


class LabEngine:
    """`python -m dike_slurm` with the lab's environment, a private state file and metrics file."""

    def __init__(self, lab: Any, state_dir: Path, **settings: str) -> None:
        self.lab = lab
        self.dir = state_dir
        self.state_db = state_dir / "state.sqlite"
        # the autouse fixture has emptied the queue: every earlier job ended before this second
        self.since = int(time.time()) + 1
        self.env = {
            **lab.env,
            "DIKE_ACCOUNTING__SINCE": str(self.since),
            "DIKE_ENGINE__STATE_DB": str(self.state_db),
            "DIKE_ENGINE__METRICS_FILE": str(state_dir / "metrics.prom"),
            "COLUMNS": "250",
            **settings,
        }

    def environ(self, **extra: str) -> dict[str, str]:
        return {**self.env, **extra}

    def run(self, *args: str, timeout: float, **extra: str) -> subprocess.CompletedProcess[str]:
        """One command to its end; whatever it exits with, it never prints a traceback."""
        proc = subprocess.run([sys.executable, "-m", "dike_slurm", *args], env=self.environ(**extra),
                              capture_output=True, text=True, timeout=timeout, cwd="/tmp")
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc
