"""Deployment files: units that systemd can parse, a cron line, the slurm.conf lines."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dike_slurm.config import Config
from dike_slurm.domain.slurm_priority import effective_span, tier_gap
from dike_slurm.errors import InputError
from dike_slurm.ops.render import render
from dike_slurm.slurm.slurm_conf import parse_slurm_conf


def make_config(tmp_path, slurm_conf: str = "NodeName=n[1-4] Gres=gpu:8\n", replay=None, **engine) -> Config:
    slurm_dir = tmp_path / "etc"
    slurm_dir.mkdir(exist_ok=True)
    (slurm_dir / "slurm.conf").write_text(slurm_conf)
    (slurm_dir / "topology.conf").write_text("SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Nodes=n[3-4]\n"
                                             "SwitchName=top Switches=s[1-2]\n")
    return Config.model_validate({
        "engine": {"state_db": str(tmp_path / "lib" / "state.sqlite"), **engine},
        "slurm": {"slurm_conf": str(slurm_dir / "slurm.conf")},
        "replay": replay or {},
        "policies": {"dike": {"max_consolidation_wait_s": 900}},
    })


def parse_unit(text: str) -> configparser.ConfigParser:
    # not strict: systemd lets a key repeat (SystemCallFilter= an allow list, then ~ what it removes);
    # the last value is the one read here
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(text)
    return parser


def test_service_runs_as_a_dedicated_user_and_restarts_on_failure(tmp_path):
    config = make_config(tmp_path)
    unit = parse_unit(render("systemd", config, tmp_path / "dike.toml", user="dikesvc"))
    service = unit["Service"]
    assert service["User"] == "dikesvc" and service["Restart"] == "on-failure"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"  # SIGHUP re-reads the configuration
    # the console script of the environment the project is installed in
    assert service["ExecStart"] == f"{sys.prefix}/bin/dike-slurm run --apply --config {tmp_path / 'dike.toml'}"
    assert service["ReadWritePaths"] == str(tmp_path / "lib")  # not under /var/lib: no StateDirectory
    assert "StateDirectory" not in service
    assert f"install -d -o dikesvc -g dikesvc -m 0750 {tmp_path / 'lib'}" in unit_text(config, user="dikesvc")
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def unit_text(config: Config, **options) -> str:
    return render("systemd", config, Path("/etc/dike-slurm/dike.toml"), **options)


def test_the_state_folder_is_systemds_and_the_metrics_have_a_folder_of_their_own(tmp_path):
    config = make_config(tmp_path, state_db="/var/lib/dike-slurm/state.sqlite",
                         metrics_file="/var/lib/dike-slurm-metrics/dike_slurm.prom")
    text = unit_text(config)
    service = parse_unit(text)["Service"]
    assert (service["StateDirectory"], service["StateDirectoryMode"]) == ("dike-slurm", "0750")
    assert service["ReadWritePaths"] == "/var/lib/dike-slurm-metrics"  # only the metrics folder besides the state
    assert "install -d -o dike-slurm -g dike-slurm -m 0755 /var/lib/dike-slurm-metrics" in text
    # node-exporter reads the engine's file; the engine never writes node-exporter's folder
    assert "ln -s /var/lib/dike-slurm-metrics/dike_slurm.prom /var/lib/prometheus/node-exporter/" in text
    assert "ReadWritePaths=/var/lib/prometheus" not in text
    assert "munge.service" in parse_unit(text)["Unit"]["After"].split()
    private = make_config(tmp_path, state_db="/var/lib/dike-slurm/state.sqlite",
                          metrics_file="/var/lib/dike-slurm/dike_slurm.prom")
    with pytest.raises(InputError, match="metrics_file .* is in the state folder"):
        unit_text(private)


def test_a_unit_rendered_from_a_source_checkout_says_so(tmp_path, monkeypatch):
    import dike_slurm.ops.render as rendering

    tree = Path(rendering.__file__).resolve().parent.parent
    monkeypatch.setattr(sys, "prefix", str(tmp_path))  # an environment the package is not installed in
    assert rendering.source_checkout() == tree
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "dike-slurm").write_text("#!/bin/sh\n")
    text = unit_text(make_config(tmp_path))
    assert f"# WARNING: this environment runs dike_slurm from the source tree {tree}" in text
    assert f"ExecStart={tmp_path}/bin/dike-slurm run" in text
    monkeypatch.setattr(sys, "prefix", str(tree.parent))  # the package lies under the environment
    assert rendering.source_checkout() is None
    with pytest.raises(InputError, match="no dike-slurm script in"):
        unit_text(make_config(tmp_path))


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
        "PriorityWeightFairshare=10000",
        "PriorityWeightAge=1000",
        "PriorityWeightJobSize=1000",
        "PriorityWeightTRES=GRES/gpu=1000",
        "PriorityMaxAge=7-0",
        "PriorityDecayHalfLife=7-0",
        "PriorityWeightQOS=1014000",
        "TopologyPlugin=topology/tree",
        "SchedulerParameters=max_switch_wait=900",
    ]
    assert "NodeName=n[1-2] ... Features=leaf_s1" in text and "NodeName=n[3-4] ... Features=leaf_s2" in text


def rendered_model(text: str, qos: dict[str, int]):
    """Slurm's priority as the rendered lines set it (what the engine would read once they are merged)."""
    return parse_slurm_conf("NodeName=n1 Gres=gpu:8\n" + text, "rendered").priority_model(qos, "rendered")


def test_the_priority_lines_keep_every_qos_tier_strict_with_dikes_whole_span(tmp_path):
    text = render("slurm-conf", make_config(tmp_path), tmp_path / "dike.toml")
    assert "ASSUMED typical" in text and "priority_multifactor documentation" in text  # where the weights come from
    assert "QOS tiers, ASSUMED (no qos.txt beside slurm.conf, no [replay] qos_priority): normal=0, urgent=1." in text
    assert "sacctmgr -i add qos urgent set Priority=1" in text
    assert 'Resulting span in engine.priority_mode = "tiers": SiteFactor 1..1000000, inside every QOS tier.' in text
    model = rendered_model(text, {"normal": 0, "urgent": 1})
    assert model.weights.others_total == 13_000 and model.weights.qos == 1_014_000
    assert effective_span("tiers", 1_000_000, model) == 1_000_000
    assert tier_gap(model) > model.weights.others_total + 1_000_000  # no job passes a tier, Dike's span included


def test_the_sites_own_weights_and_qos_table_are_used_where_slurm_conf_has_them(tmp_path):
    site = ("NodeName=n[1-4] Gres=gpu:8\nPriorityType=priority/multifactor\nPriorityWeightAge=2000\n"
            "PriorityWeightFairshare=20000\nPriorityWeightTRES=CPU=500,GRES/gpu=1500\nPriorityWeightQOS=0\n")
    config = make_config(tmp_path, site, priority_span=500_000)
    (tmp_path / "etc" / "qos.txt").write_text("Name|Priority\nnormal|0\nlow|10\nurgent|100\n")
    text = render("slurm-conf", config, tmp_path / "dike.toml")
    assert f"your slurm.conf's ({tmp_path / 'etc' / 'slurm.conf'})" in text and "ASSUMED" not in text
    assert f"QOS tiers ({tmp_path / 'etc' / 'qos.txt'}): normal=0, low=10, urgent=100." in text
    lines = [l for l in text.splitlines() if l.startswith("Priority")]
    assert "PriorityWeightTRES=CPU=500,GRES/gpu=1500" in lines and "PriorityWeightAge=2000" in lines
    # the smallest step (low, a tenth of the weight) above 24,000 + 500,000: 5,240,010, rounded up
    assert "PriorityWeightQOS=5241000" in lines and "PriorityWeightQOS=0" not in lines
    model = rendered_model(text, {"normal": 0, "low": 10, "urgent": 100})
    assert effective_span("tiers", 500_000, model) == 500_000


def test_the_replays_qos_priorities_are_used_without_a_qos_file(tmp_path):
    config = make_config(tmp_path, replay={"qos_priority": {"normal": 0, "high": 1, "urgent": 2}})
    text = render("slurm-conf", config, tmp_path / "dike.toml")
    assert "QOS tiers ([replay] qos_priority): normal=0, high=1, urgent=2." in text
    assert "PriorityWeightQOS=2027000" in text  # steps of half the weight: 2 x 1,013,001, rounded up


def test_a_slurm_conf_that_cannot_be_read_is_said_and_the_typical_weights_proposed(tmp_path):
    config = make_config(tmp_path, "include nodes.conf\nPriorityWeightAge=5\n")
    text = render("slurm-conf", config, tmp_path / "dike.toml")
    assert "# Your slurm.conf could not be read (" in text and "no NodeName lines" in text
    assert "ASSUMED typical" in text and "PriorityWeightQOS=1014000" in text


def test_another_mode_and_a_span_slurm_cannot_hold_are_said(tmp_path):
    text = render("slurm-conf", make_config(tmp_path, priority_mode="over"), tmp_path / "dike.toml")
    assert 'engine.priority_mode = "over": SiteFactor 1..1000000, which puts Dike\'s order above the QOS tiers' in text
    text = render("slurm-conf", make_config(tmp_path, priority_span=3_000_000_000), tmp_path / "dike.toml")
    assert "WARNING: the highest priority would reach" in text and "lower engine.priority_span" in text


def test_paths_a_unit_would_misread_are_refused(tmp_path):
    with pytest.raises(InputError, match="plain path"):
        render("systemd", make_config(tmp_path), tmp_path / "my config%i.toml")
    with pytest.raises(InputError, match="user name"):
        render("systemd", make_config(tmp_path), tmp_path / "dike.toml", user="root; rm")


NO_SYSTEMD_ANALYZE = "systemd-analyze is not installed here (make test installs Debian's systemd as root)"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason=NO_SYSTEMD_ANALYZE)
@pytest.mark.parametrize("oneshot", [False, True])
def test_systemd_analyze_verifies_the_units_and_scores_them_3_or_lower(tmp_path, oneshot):
    """`verify` with ExecStart at this test's own environment; `security --offline` scores what the
    unit exposes (0 to 10; systemd calls 3.0 or lower OK)."""
    config = make_config(tmp_path, state_db="/var/lib/dike-slurm/state.sqlite",
                         metrics_file="/var/lib/dike-slurm-metrics/dike_slurm.prom")
    service = tmp_path / ("dike-slurm-cycle.service" if oneshot else "dike-slurm.service")
    service.write_text(render("systemd", config, tmp_path / "dike.toml", oneshot=oneshot))
    verified = subprocess.run(["systemd-analyze", "verify", str(service)], capture_output=True, text=True)
    assert verified.returncode == 0, verified.stderr
    scored = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(service)],
                            capture_output=True, text=True)
    assert scored.returncode == 0, scored.stderr
    level = re.search(rf"Overall exposure level for {service.name}: (\d+\.\d+)", scored.stdout)
    assert level is not None, scored.stdout[-500:]
    assert float(level.group(1)) <= 3.0, scored.stdout
