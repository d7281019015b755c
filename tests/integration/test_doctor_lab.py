"""`dike-slurm doctor` against the real lab configured wrong on purpose (issue 32): scope names the
cluster lacks, files the engine cannot write, and the advice naming the user who runs it. (slurmdbd
not answering: test_faults.py, which stops and restarts the lab's daemons.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from unprivileged import as_user

pytestmark = pytest.mark.scenario

SlurmLab = Any


def doctor(lab: SlurmLab, config: Path, user: str | None = None) -> tuple[int, dict]:
    argv = [sys.executable, "-m", "dike_slurm", "doctor", "--json", "--config", str(config)]
    env = dict(lab.env)
    if user is not None:
        argv = as_user(user, argv)
    result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/tmp", timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, {c["name"]: c for c in json.loads(result.stdout)["checks"]}


def test_doctor_fails_scope_names_the_lab_lacks_and_files_the_engine_cannot_write(slurm_lab):
    lab = slurm_lab
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        root = Path(folder)
        root.chmod(0o755)
        (root / "a-file").write_text("")
        (root / "roots").mkdir(mode=0o755)  # root's: no other user writes here
        config = root / "dike.toml"
        config.write_text(
            "[scope]\npartitions = [\"gpuu\"]\naccounts = [\"reserch\"]\n"
            f"[engine]\nstate_db = \"{root}/a-file/state.sqlite\"\nmetrics_file = \"{root}/roots/dike.prom\"\n")
        config.chmod(0o644)
        code, checks = doctor(lab, config)
        assert code == 1
        partitions, accounts = checks["scope.partitions"], checks["scope.accounts"]
        assert partitions["verdict"] == "FAIL" and "'gpuu': did you mean 'gpu'?" in partitions["advice"], partitions
        assert accounts["verdict"] == "FAIL" and "'reserch': did you mean 'research'?" in accounts["advice"], accounts
        assert checks["scope.qos"]["verdict"] == "ok"
        # the lab itself is set up right: slurmdbd answers and GPUs are tracked in accounting
        assert checks["slurmdbd"]["verdict"] == "ok" and checks["AccountingStorageTRES"]["verdict"] == "ok"
        state = checks["engine.state_db"]
        assert state["verdict"] == "FAIL" and f"{root}/a-file is a file, not a folder" in state["found"]
        if lab.in_chroot:  # the CLI runs as root there (Slurm sees a user only through the command wrappers)
            return
        assert os.geteuid() == 0, "the integration tests run as root (the lab needs it)"
        code, checks = doctor(lab, config, user="dikeuser2")
        assert code == 1
        metrics = checks["engine.metrics_file"]
        assert metrics["verdict"] == "FAIL" and f"cannot be created: {root}/roots is not writable" in metrics["found"]
        assert metrics["found"].endswith("by dikeuser2") and "install -d -o dikeuser2 -g dikeuser2" in metrics["advice"]
        privileges = checks["privileges"]
        assert privileges["verdict"] == "FAIL" and privileges["found"] == "dikeuser2: AdminLevel=None", privileges
        assert "sacctmgr -i modify user dikeuser2 set AdminLevel=Admin" in privileges["advice"]
