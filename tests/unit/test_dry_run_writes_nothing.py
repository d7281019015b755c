"""A dry run writes nothing anywhere: no state store, no metrics file, no WAL files, no log file.

After one applied cycle (which creates the state file and the metrics file), the state and
metrics folders are made read-only and the read-only commands run as an unprivileged user:
`nobody` when the tests run as root (tests/unprivileged.py: through setpriv when this Python is
where nobody cannot go), otherwise this user, whom the read-only folders stop alike. They must
succeed without a traceback and leave every file exactly as it was.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from in_process import dike_slurm
from test_engine_cli import REPO, slurm_stubs  # noqa: F401 (the fixture)
from unprivileged import as_user


def snapshot(folder: Path) -> dict[str, tuple[int, float, str]]:
    """Every file under `folder`: size, mtime and content hash."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def world_readable(slurm_stubs: Path):  # noqa: F811
    """The stub cluster copied where `nobody` can reach it (pytest's folders are root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="dike-dry-"))
    base.chmod(0o755)
    stubs = base / "cluster"
    shutil.copytree(slurm_stubs.parent, stubs)
    for script in (stubs / "bin").iterdir():
        script.write_text(script.read_text().replace(str(slurm_stubs.parent), str(stubs)))
    (stubs / "calls.log").touch()
    (stubs / "calls.log").chmod(0o666)  # the stubs' own log, not the engine's
    engine = base / "engine"
    engine.mkdir()
    config = base / "dike.toml"
    config.write_text(
        f'[engine]\nstate_db = "{engine}/state/state.sqlite"\nmetrics_file = "{engine}/metrics/dike.prom"\n'
        f'[slurm]\nbin_dir = "{stubs}/bin"\n[policies.dike]\nthresholds_gpuh = [0.02, 0.2]\n'
    )
    for folder, _, files in os.walk(base):
        os.chmod(folder, 0o755)
        for name in files:
            path = Path(folder) / name
            path.chmod(path.stat().st_mode | stat.S_IROTH)
    yield config, engine
    shutil.rmtree(base, ignore_errors=True)


def run(config: Path, *args: str, as_nobody: bool) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "DIKE_CONFIG": str(config), "PYTHONDONTWRITEBYTECODE": "1"}
    if not as_nobody:
        return dike_slurm(*args, env=env, cwd=Path("/"))
    # a new process: the command runs as another user (nobody), which this process cannot become
    return subprocess.run(as_user("nobody", [sys.executable, "-m", "dike_slurm", *args]), capture_output=True,
                          text=True, env=env, cwd="/", timeout=120)


def test_a_dry_cycle_and_the_read_only_commands_write_nothing(world_readable):
    config, engine = world_readable
    applied = run(config, "run", "--once", "--apply", as_nobody=False)
    assert applied.returncode == 0, applied.stderr
    assert (engine / "state" / "state.sqlite").exists() and (engine / "metrics" / "dike.prom").exists()
    # a job arrives: the dry runs below have a write to plan (the stub sprio shows what the cycle wrote)
    queue = config.parent / "cluster" / "squeue.json"
    document = json.loads(queue.read_text())
    arrived = copy.deepcopy(next(job for job in document["jobs"] if job["job_id"] == 63))
    arrived.update(job_id=64, array_task_id=4)
    document["jobs"].append(arrived)
    queue.write_text(json.dumps(document))
    for path in [engine, *engine.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    before = snapshot(engine)
    as_nobody = os.geteuid() == 0
    if as_nobody:  # really nobody, and the read-only state folder stops it
        probe = f"import os; print(os.getuid()); open({str(engine / 'state' / 'probe')!r}, 'w')"
        proof = subprocess.run(as_user("nobody", [sys.executable, "-c", probe]), capture_output=True, text=True, cwd="/")
        assert proof.stdout.split() == ["65534"] and "PermissionError" in proof.stderr, proof
    try:
        for args in (["run", "--once"], ["run", "--once", "--json"], ["status"], ["queue"], ["explain", "63"],
                     ["audit"], ["breaker", "status"]):
            result = run(config, *args, as_nobody=as_nobody)
            assert "Traceback" not in result.stderr, (args, result.stderr)
            assert result.returncode == 0, (args, result.stderr)
        assert "plan (dry run)" in run(config, "run", "--once", as_nobody=as_nobody).stdout
        assert snapshot(engine) == before
        assert sorted(p.name for p in engine.rglob("*")) == ["dike.prom", "metrics", "state", "state.sqlite", "state.sqlite.lock"]
    finally:
        for path in [engine, *engine.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
