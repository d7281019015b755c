"""The engine's commands as an admin types them, against stand-in Slurm commands (no cluster).

A folder of tiny scripts named squeue, sinfo, sprio, sacct, scontrol and sacctmgr answers with
canned Slurm 22.05 output (sprio with the SiteFactor last written) and logs every argv;
`slurm.bin_dir` points the engine at it. The site's priority settings (read when the engine starts) are the lab's recorded ones (tests/fixtures/slurm-22.05).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from in_process import dike_slurm
from test_backend_contract import SACCT, SINFO_JSON, SQUEUE_JSON, SWITCHES, TOPOLOGY

REPO = Path(__file__).resolve().parents[2]
FIXTURES_22 = REPO / "tests" / "fixtures" / "slurm-22.05"

STUB = """#!/bin/sh
echo "$0 $*" >> {log}
if [ "$(basename "$0") $1" = "scontrol update" ]; then  # sprio shows a SiteFactor written, as Slurm's does
  written=$(echo "$*" | sed -n 's/.*JobId=\\([0-9]*\\) .*SiteFactor=\\(-*[0-9]*\\).*/\\1|\\2/p')
  if [ -n "$written" ]; then sed -i "s/^${{written%|*}}|[^|]*|/$written|/" {dir}/sprio.txt; fi
fi
case "$(basename "$0") $1" in
  "squeue --json") cat {dir}/squeue.json ;;
  "squeue -a") echo "squeue: error: Invalid job format specification: stub" >&2 ;;  # the lean read falls back to JSON
  "squeue -h") cat {dir}/switches.txt ;;
  "sinfo --json") cat {dir}/sinfo.json ;;
  "sprio -h") cat {dir}/sprio.txt ;;
  "sacct --allusers") cat {dir}/sacct.txt ;;
  "scontrol show")
    case "$2" in
      config) cat {fixtures}/scontrol-show-config.txt ;;
      partition) cat {fixtures}/scontrol-show-partition.txt ;;
      *) cat {dir}/topology.txt ;;
    esac ;;
  "sacctmgr -nP") cat {fixtures}/sacctmgr-show-qos.txt ;;
  "scontrol update") exit 0 ;;
  "scontrol ") rc=0; while read -r line; do "$0" $line || rc=1; done; exit $rc ;;  # lines fed on stdin
  *) echo "unexpected: $0 $*" >&2; exit 1 ;;
esac
"""


@pytest.fixture
def slurm_stubs(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "squeue.json").write_text(json.dumps(SQUEUE_JSON))
    (tmp_path / "switches.txt").write_text(SWITCHES)
    (tmp_path / "sinfo.json").write_text(json.dumps(SINFO_JSON))
    (tmp_path / "sprio.txt").write_text("63|0|11165\n")
    (tmp_path / "sacct.txt").write_text(SACCT)
    (tmp_path / "topology.txt").write_text(TOPOLOGY)
    for name in ("squeue", "sinfo", "sprio", "sacct", "scontrol", "sacctmgr"):
        script = bin_dir / name
        script.write_text(STUB.format(log=tmp_path / "calls.log", dir=tmp_path, fixtures=FIXTURES_22))
        script.chmod(0o755)
    config = tmp_path / "dike.toml"
    config.write_text(
        f'[engine]\nstate_db = "{tmp_path}/state/state.sqlite"\n'
        'preemptible_partitions = ["gpu"]\n'  # running job 53 opted in: the engine may requeue it, so writes it
        f'[slurm]\nbin_dir = "{bin_dir}"\n'
        '[policies.dike]\nthresholds_gpuh = [0.02, 0.2]\n'
    )
    return config


def dike(*args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    if config is not None:
        env["DIKE_CONFIG"] = str(config)
    return dike_slurm(*args, env=env, cwd=REPO)


def calls(config: Path) -> list[str]:
    log = config.parent / "calls.log"
    return [os.path.basename(line.split()[0]) + " " + " ".join(line.split()[1:])
            for line in log.read_text().splitlines()] if log.exists() else []


def test_the_default_is_a_dry_run_that_prints_the_plan_and_writes_nothing(slurm_stubs):
    result = dike("run", "--once", config=slurm_stubs)
    assert result.returncode == 0, result.stderr
    assert "plan (dry run)" in result.stdout and "SiteFactor=" in result.stdout
    assert "change(s) planned" in result.stdout
    assert not any(c.startswith("scontrol update") for c in calls(slurm_stubs))
    assert not (slurm_stubs.parent / "state").exists()


def test_apply_writes_with_scontrol_and_keeps_an_audit(slurm_stubs):
    result = dike("run", "--once", "--apply", config=slurm_stubs)
    assert result.returncode == 0, result.stderr
    updates = [c for c in calls(slurm_stubs) if c.startswith("scontrol update")]
    assert any("JobId=63" in c and "SiteFactor=" in c for c in updates)
    explained = dike("explain", "60_3", config=slurm_stubs)
    assert explained.returncode == 0, explained.stderr
    assert "job 60_3: user dikeuser2" in explained.stdout and "undo:" in explained.stdout
    assert "$(rm -rf /)" not in " ".join(updates)


def test_replay_only_policies_are_refused_in_one_line(slurm_stubs):
    env_config = slurm_stubs.parent / "oracle.toml"
    env_config.write_text(slurm_stubs.read_text().replace("[engine]\n", '[engine]\npolicy = "srtf_oracle"\n'))
    result = dike("run", "--once", config=env_config)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: policy 'srtf_oracle' is replay-only (it needs true job durations) and cannot run live"
    ]


def test_a_missing_command_is_one_line_not_a_traceback(tmp_path):
    config = tmp_path / "dike.toml"
    config.write_text(f'[engine]\nstate_db = "{tmp_path}/s.sqlite"\n[slurm]\nbin_dir = "{tmp_path}/nothing"\n')
    result = dike("status", config=config)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "squeue: command not found (set slurm.bin_dir)" in result.stderr


def test_render_writes_the_file_and_rejects_unknown_kinds(slurm_stubs, tmp_path):
    out = tmp_path / "dike-slurm.service"
    result = dike("render", "systemd", "--config", str(slurm_stubs), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "Restart=on-failure" in out.read_text()
    bad = dike("render", "launchd", "--config", str(slurm_stubs))
    assert bad.returncode == 2 and "unknown render kind 'launchd'" in bad.stderr


def test_revert_without_state_has_nothing_to_do(slurm_stubs):
    result = dike("revert", config=slurm_stubs)
    assert result.returncode == 0, result.stderr
    assert "0 job(s) to restore" in result.stdout
