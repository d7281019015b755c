"""`dike-slurm doctor` on what real Slurm 22.05, 24.11 and 26.05 print (tests/fixtures/slurm-VERSION)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dike_slurm.cli.doctor_cmd import FAIL, OK, WARN, diagnose, gather, parse_show_config
from dike_slurm.config import load_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def answers(version: str, **changes: str):
    folder = FIXTURES / f"slurm-{version}"
    files = {
        ("scontrol", "--version"): "scontrol-version.txt",
        ("squeue", "--json"): "squeue.json",
        ("scontrol", "show", "config"): "scontrol-show-config.txt",
        ("sacctmgr",): "sacctmgr-show-user.txt",
    }
    calls = []

    def runner(argv, env, timeout):
        calls.append(list(argv))
        for prefix, name in files.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return changes.get(name, (folder / name).read_text(encoding="utf-8"))
        raise AssertionError(argv)

    return runner, calls


@pytest.mark.parametrize("version", ["22.05", "24.11", "26.05"])
def test_the_lab_of_each_version_passes(version, tmp_path):
    runner, calls = answers(version)
    config = load_config(None, environ={"DIKE_ENGINE__POLICY": "dike",
                                        "DIKE_POLICIES__DIKE__MAX_CONSOLIDATION_WAIT_S": "1800"})
    checks = {c.name: c for c in gather(config, "root", runner)}
    assert all(c.verdict in (OK, WARN) for c in checks.values()), checks
    assert checks["Slurm version"].found == f"slurm-wlm {version}" + (".8" if version == "22.05" else ".5")
    assert checks["PriorityType"].found == "priority/multifactor"
    assert checks["TopologyPlugin"].found == "topology/tree" and checks["JobRequeue"].found == "1"
    family = "v0.0.38" if version == "22.05" else "v0.0.40+"
    assert f"({family}, Slurm {version}." in checks["JSON format"].found
    # the lab keeps Slurm's 300 s max_switch_wait: a 1800 s consolidation wait would be cut short
    assert checks["max_switch_wait"].verdict == WARN and "max_switch_wait=1800" in checks["max_switch_wait"].advice
    assert [argv[0] for argv in calls] == ["scontrol", "squeue", "scontrol", "sacctmgr"]


def test_an_unknown_format_and_a_site_without_the_basics_fail_with_what_to_change():
    document = json.loads((FIXTURES / "slurm-24.11" / "squeue.json").read_text())
    document["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.99"
    runner, _ = answers("24.11", **{"squeue.json": json.dumps(document)})
    checks = {c.name: c for c in gather(load_config(None, environ={}), "root", runner)}
    assert checks["JSON format"].verdict == FAIL and "v0.0.99" in checks["JSON format"].advice

    config = parse_show_config("PriorityType            = priority/basic\nTopologyPlugin          = topology/flat\n"
                               "SchedulerParameters     = max_switch_wait=600\nJobRequeue              = 0\n")
    checks = {c.name: c for c in diagnose(
        version="slurm 24.11.5", json_format=checks["Slurm version"], config=config, admin_level="None",
        is_root=False, strategy="site_factor", max_consolidation_wait_s=300, preemption=True)}
    assert checks["privileges"].verdict == FAIL and "AdminLevel=Operator" in checks["privileges"].advice
    assert checks["PriorityType"].verdict == FAIL and "priority/multifactor" in checks["PriorityType"].advice
    assert checks["TopologyPlugin"].verdict == WARN and checks["JobRequeue"].verdict == WARN
    assert checks["max_switch_wait"].verdict == OK and checks["max_switch_wait"].found == "600 s"
