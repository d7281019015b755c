"""The thin CLI: help, config check, clear errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dike_slurm", *args], capture_output=True, text=True, cwd=cwd, timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_help_from_the_repository_root_and_elsewhere(tmp_path):
    for folder in (REPO, tmp_path):
        result = run("--help", cwd=folder)
        assert result.returncode == 0, result.stderr
        assert "policies" in result.stdout and "config" in result.stdout


def test_config_check_accepts_the_example():
    result = run("config", "check", str(REPO / "examples" / "dike.toml"))
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout


def test_config_check_rejects_with_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[engine]\ninterval_s = 0\n")
    result = run("config", "check", str(bad))
    assert result.returncode == 2
    assert "engine.interval_s" in result.stderr and str(bad) in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_command_is_a_usage_error():
    result = run("frobnicate")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
