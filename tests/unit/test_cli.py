"""The thin CLI: help, config check, clear errors without tracebacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from in_process import dike_slurm

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    return dike_slurm(*args, cwd=REPO, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_help_from_the_repository_root_and_elsewhere(tmp_path):
    for folder in (REPO, tmp_path):
        # a new interpreter: `python -m dike_slurm` in the repository root imports the source folder
        # first, and finds dike_slurm.policies and .sim only through the install's mapping (docs/architecture.md)
        result = subprocess.run([sys.executable, "-m", "dike_slurm", "--help"], capture_output=True, text=True,
                                cwd=folder, timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
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


def test_config_check_fails_a_state_file_the_engine_cannot_create(tmp_path):
    (tmp_path / "a-file").write_text("")
    config = tmp_path / "dike.toml"
    config.write_text(f'[engine]\nstate_db = "{tmp_path}/a-file/state.sqlite"\n')
    result = run("config", "check", str(config))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"engine.state_db: {tmp_path}/a-file/state.sqlite: {tmp_path}/a-file is a file, not a folder" in result.stdout
    assert "the engine could not write engine.state_db, engine.lock_file" in result.stderr


def test_unknown_command_is_a_usage_error():
    result = run("frobnicate")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


# Heavy libraries the offline side needs; `dike-slurm --help`, `status`, `breaker status` and
# `explain` must start without them (bench/cli_start.py measures the start time).
HEAVY_AT_START = ("matplotlib", "pandas", "numpy", "jinja2", "prometheus_client", "dike_slurm.sim")


def test_importing_the_cli_loads_no_heavy_library():
    probe = f"import sys, dike_slurm.cli; print(','.join(m for m in {HEAVY_AT_START!r} if m in sys.modules))"
    # a new interpreter: this one has imported them all already
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_trace_generate_passes_every_option_to_the_generator(tmp_path):
    from dike_slurm.sim.tracegen.generate import generate_sample
    from dike_slurm.sim.tracegen.synthetic_cluster import ClusterSpec
    from dike_slurm.sim.tracegen.workload_model import WorkloadModel

    result = run("trace", "generate", "--out", str(tmp_path / "cli"), "--jobs", "60", "--nodes", "6",
                 "--gpus-per-node", "4", "--cpus-per-node", "32", "--mem-per-node", "256000", "--gpu-type", "h100",
                 "--nodes-per-leaf", "2", "--switch-fanout", "2", "--switch-levels", "2", "--users", "7",
                 "--load", "0.5", "--start", "2025-03-01T12:00:00", "--seed", "9")
    assert result.returncode == 0, result.stderr
    cluster = ClusterSpec(nodes=6, gpus_per_node=4, cpus_per_node=32, real_memory_mb=256000, gpu_type="h100",
                          nodes_per_leaf=2, switch_fanout=2, switch_levels=2)
    model = WorkloadModel(n_users=7, target_load=0.5)
    generate_sample(tmp_path / "direct", 60, cluster, model, 9, start="2025-03-01T12:00:00")
    for name in ("sacct.txt", "slurm.conf", "topology.conf"):
        assert (tmp_path / "cli" / name).read_bytes() == (tmp_path / "direct" / name).read_bytes(), name
    assert "gres/gpu:h100=" in (tmp_path / "cli" / "sacct.txt").read_text()


def test_trace_generate_rejects_a_bad_cluster_in_one_line(tmp_path):
    result = run("trace", "generate", "--out", str(tmp_path), "--nodes", "8", "--switch-fanout", "2", "--switch-levels", "9")
    assert result.returncode == 2
    assert "switch_levels" in result.stderr and "Traceback" not in result.stderr
