"""Deployment files: units that systemd can parse, a cron line, the slurm.conf lines."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys

import pytest

from dike_slurm.config import Config
from dike_slurm.errors import InputError
from dike_slurm.render import render


def make_config(tmp_path, **engine) -> Config:
    slurm_dir = tmp_path / "etc"
    slurm_dir.mkdir(exist_ok=True)
    (slurm_dir / "slurm.conf").write_text("NodeName=n[1-4] Gres=gpu:8\n")
    (slurm_dir / "topology.conf").write_text("SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Nodes=n[3-4]\n"
                                             "SwitchName=top Switches=s[1-2]\n")
    return Config.model_validate({
        "engine": {"state_db": str(tmp_path / "lib" / "state.sqlite"), **engine},
        "slurm": {"slurm_conf": str(slurm_dir / "slurm.conf")},
        "policies": {"dike": {"max_consolidation_wait_s": 900}},
    })


def parse_unit(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=True, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(text)
    return parser


def test_service_runs_as_a_dedicated_user_and_restarts_on_failure(tmp_path):
    config = make_config(tmp_path)
    unit = parse_unit(render("systemd", config, tmp_path / "dike.toml", user="dikesvc"))
    service = unit["Service"]
    assert service["User"] == "dikesvc" and service["Restart"] == "on-failure"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"  # SIGHUP re-reads the configuration
    assert service["ExecStart"] == f"{sys.executable} -m dike_slurm run --apply --config {tmp_path / 'dike.toml'}"
    assert str(tmp_path / "lib") in service["ReadWritePaths"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_timer_and_its_oneshot_service(tmp_path):
    config = make_config(tmp_path, interval_s=30)
    timer = parse_unit(render("timer", config, tmp_path / "dike.toml"))
    assert timer["Timer"]["OnUnitActiveSec"] == "30" and timer["Timer"]["Unit"] == "dike-slurm-cycle.service"
    oneshot = parse_unit(render("systemd", config, tmp_path / "dike.toml", oneshot=True))
    assert oneshot["Service"]["Type"] == "oneshot" and "--once --apply" in oneshot["Service"]["ExecStart"]
    assert "Restart" not in oneshot["Service"] and not oneshot.has_section("Install")


def test_cron_line_every_n_minutes(tmp_path):
    text = render("cron", make_config(tmp_path, interval_s=300), tmp_path / "dike.toml")
    (line,) = [l for l in text.splitlines() if l and not l.startswith("#")]
    assert line.startswith("*/5 * * * * dike-slurm flock -n ")
    # syslog through logger: no log file the service user cannot create (/var/log is root's)
    assert line.endswith(f"run --once --apply --config {tmp_path / 'dike.toml'} 2>&1 | logger -t dike-slurm")
    assert "/var/log" not in line


def test_slurm_conf_lines_match_the_policy(tmp_path):
    text = render("slurm-conf", make_config(tmp_path), tmp_path / "dike.toml")
    lines = [l for l in text.splitlines() if l and not l.startswith("#")]
    assert lines == [
        "PriorityType=priority/multifactor",
        "TopologyPlugin=topology/tree",
        "SchedulerParameters=max_switch_wait=900",
    ]
    assert "NodeName=n[1-2] ... Features=leaf_s1" in text and "NodeName=n[3-4] ... Features=leaf_s2" in text


def test_paths_a_unit_would_misread_are_refused(tmp_path):
    with pytest.raises(InputError, match="plain path"):
        render("systemd", make_config(tmp_path), tmp_path / "my config%i.toml")
    with pytest.raises(InputError, match="user name"):
        render("systemd", make_config(tmp_path), tmp_path / "dike.toml", user="root; rm")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_systemd_analyze_verify_accepts_the_units(tmp_path):
    config = make_config(tmp_path)
    service = tmp_path / "dike-slurm.service"
    service.write_text(render("systemd", config, tmp_path / "dike.toml", user="root"))
    result = subprocess.run(["systemd-analyze", "verify", str(service)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
