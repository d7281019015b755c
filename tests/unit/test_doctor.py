"""`dike-slurm doctor` on what real Slurm 22.05, 24.11 and 26.05 print (tests/fixtures/slurm-VERSION)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dike_slurm.ops.doctor import gather
from dike_slurm.ops.doctor_checks import FAIL, OK, WARN, Check, diagnose
from dike_slurm.parsing.slurm_options import parse_show_config
from dike_slurm.config import load_config
from dike_slurm.errors import DikeError
from dike_slurm.slurm.backends.commands import failure

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def answers(version: str, **changes: str):
    """A runner answering from what Slurm `version` printed; `changes` replace a file's text, and a
    change that is an exception is raised (the command failed)."""
    folder = FIXTURES / f"slurm-{version}"
    files = {
        ("scontrol", "--version"): "scontrol-version.txt",
        ("squeue", "--json"): "squeue.json",
        ("scontrol", "show", "config"): "scontrol-show-config.txt",
        ("scontrol", "show", "partition", "-o"): "scontrol-show-partition.txt",
        ("sacctmgr", "-nP", "show", "qos", "format=Name,Priority"): "sacctmgr-show-qos.txt",
        ("sacctmgr", "-nP", "show", "account", "format=Account"): "sacctmgr-show-account.txt",
        ("sacctmgr", "-n", "-P", "show", "user"): "sacctmgr-show-user.txt",
    }
    calls = []

    def runner(argv, env, timeout):
        calls.append(list(argv))
        for prefix, name in files.items():
            if tuple(argv[: len(prefix)]) == prefix:
                answer = changes.get(name)
                if isinstance(answer, Exception):
                    raise answer
                return answer if answer is not None else (folder / name).read_text(encoding="utf-8")
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
    # each command once: the scope's partition and QOS names come from the site's priority read
    assert [argv[:4] for argv in calls] == [
        ["scontrol", "--version"], ["squeue", "--json"], ["scontrol", "show", "config"],
        ["scontrol", "show", "partition", "-o"], ["sacctmgr", "-nP", "show", "qos"],  # the site's priority
        ["sacctmgr", "-nP", "show", "account"], ["sacctmgr", "-n", "-P", "show"]]  # slurmdbd and accounts; AdminLevel
    assert checks["slurmdbd"].verdict == OK and checks["AccountingStorageTRES"].verdict == OK
    assert checks["privileges"].found == "root (root)"
    assert checks["QOS tiers kept"].verdict == OK  # the lab's tiers hold with the default mode


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


# ---------------------------------------------------------------- the site's own priority

CONFIG_22 = (FIXTURES / "slurm-22.05" / "scontrol-show-config.txt").read_text(encoding="utf-8")


def site(mode: str = "tiers", qos_weight: int | None = None, strategy: str = "site_factor", **changes):
    """doctor on the 22.05 lab (QOS normal 0, low 10, urgent 100; every other weight 13,000 together)."""
    if qos_weight is not None:
        changes["scontrol-show-config.txt"] = CONFIG_22.replace(
            "PriorityWeightQOS       = 1000000", f"PriorityWeightQOS       = {qos_weight}")
    runner, calls = answers("22.05", **changes)
    config = load_config(None, environ={"DIKE_ENGINE__PRIORITY_MODE": mode,
                                        "DIKE_ENGINE__PRIORITY_STRATEGY": strategy})
    return {c.name: c for c in gather(config, "root", runner)}, calls


def test_doctor_shows_a_line_per_weight_the_qos_tiers_and_the_span_of_each_mode():
    checks, _ = site()
    found = {name: checks[name].found for name in (
        "PriorityWeightAge", "PriorityWeightFairshare", "PriorityWeightJobSize", "PriorityWeightPartition",
        "PriorityWeightQOS", "PriorityWeightAssoc", "PriorityWeightTRES gres/gpu", "site factors but QOS")}
    assert found == {
        "PriorityWeightAge": "1000 (all of it once a job waited PriorityMaxAge 00:30:00)",
        "PriorityWeightFairshare": "10000 (Fair Tree)", "PriorityWeightJobSize": "1000",
        "PriorityWeightPartition": "0", "PriorityWeightQOS": "1000000", "PriorityWeightAssoc": "0",
        "PriorityWeightTRES gres/gpu": "1000", "site factors but QOS": "13000 at most (each factor at its full weight)",
    }
    assert checks["QOS tiers"].found == "normal 0, low 100000, urgent 1000000 (smallest step 100000)"
    assert checks["Dike's span"].found == ("tiers 1..86999, blend 1..1000000, over 1..1000000; "
                                           "engine.priority_mode = tiers: 1..86999")
    kept = checks["QOS tiers kept"]
    assert kept.verdict == OK and kept.found.startswith("yes: Dike's 1..86999")
    assert "partition PriorityTier" not in checks  # one partition, one tier


def test_the_partition_tiers_are_shown_where_there_are_several():
    runner, _ = answers("24.11")
    checks = {c.name: c for c in gather(load_config(None, environ={}), "root", runner)}
    assert checks["partition PriorityTier"].found == "gpu 1, prio 2" and checks["partition PriorityTier"].verdict == OK


@pytest.mark.parametrize("mode", ["over", "blend"])
def test_a_mode_that_lets_dike_lift_a_job_over_a_qos_tier_is_a_warning(mode):
    kept = site(mode)[0]["QOS tiers kept"]
    assert kept.verdict == WARN and f"engine.priority_mode = {mode} writes SiteFactor up to 1000000" in kept.found
    # the step that keeps the whole span: 13,000 + 1,000,000 + 1 for the low tier (a tenth of the weight)
    assert 'engine.priority_mode = "tiers" (Dike then writes 1..86999' in kept.advice
    assert "PriorityWeightQOS=10130010" in kept.advice


def test_tiers_with_little_room_under_the_smallest_step_is_a_warning():
    checks, _ = site(qos_weight=135_000)  # steps of 13,500: 499 values left above 13,000
    kept = checks["QOS tiers kept"]
    assert kept.verdict == WARN and "only 499 SiteFactor values" in kept.found
    assert "PriorityWeightQOS=10130010" in kept.advice and "1..1000000 inside each tier" in kept.advice
    assert site(qos_weight=150_000)[0]["QOS tiers kept"].verdict == OK  # 1,999 values: enough


def test_site_factors_that_outweigh_a_qos_step_are_a_warning_even_without_dike():
    checks, _ = site(qos_weight=100_000)  # steps of 10,000 under 13,000 of other factors
    kept = checks["QOS tiers kept"]
    assert kept.verdict == WARN and "exceed the smallest QOS step (10000)" in kept.found
    assert "tiers mode leaves Dike 1..1: it changes no order" in kept.found
    assert "Dike's span" in checks and "tiers 1..1," in checks["Dike's span"].found


def test_no_qos_tiers_is_said_and_nothing_to_keep():
    checks, _ = site(qos_weight=0)
    assert checks["QOS tiers"].found == "none: PriorityWeightQOS=0 (QOS priorities: normal 0, low 10, urgent 100)"
    assert "QOS tiers kept" not in checks and checks["Dike's span"].found.startswith("tiers 1..1000000,")


def test_the_priority_strategy_with_qos_tiers_is_a_warning():
    check = site(strategy="priority")[0]["priority_strategy"]
    assert check.verdict == WARN and "QOS no longer counts" in check.found


def test_factors_slurm_does_not_normalize_are_a_warning():
    config = CONFIG_22.replace("PriorityFlags           = ", "PriorityFlags           = NO_NORMAL_QOS")
    check = site(**{"scontrol-show-config.txt": config})[0]["PriorityFlags"]
    assert check.verdict == WARN and "NO_NORMAL_QOS" in check.advice


def test_priority_basic_is_an_error_and_nothing_more_is_read():
    config = CONFIG_22.replace("priority/multifactor", "priority/basic")
    checks, calls = site(**{"scontrol-show-config.txt": config})
    assert checks["PriorityType"].verdict == FAIL and "has no effect" in checks["PriorityType"].advice
    assert "PriorityWeightAge" not in checks and "Dike's span" not in checks
    # the partitions are read once, for the scope's names only
    assert calls.count(["scontrol", "show", "partition", "-o"]) == 1


@pytest.mark.parametrize("mode, verdict", [("tiers", FAIL), ("over", WARN)])
def test_an_unreadable_qos_table_names_the_command(mode, verdict):
    down = DikeError("sacctmgr -nP show qos format=Name,Priority failed: Connection refused")
    check = site(mode, **{"sacctmgr-show-qos.txt": down})[0]["site priority"]
    assert check.verdict == verdict and check.advice.startswith("sacctmgr -nP show qos format=Name,Priority failed")


# ---------------------------------------------------------------- what breaks a site (issue 32)


def test_scope_names_the_cluster_lacks_fail_with_the_closest_name(tmp_path):
    runner, _ = answers("22.05")
    config = load_config(None, environ={"DIKE_SCOPE__PARTITIONS": '["gpuu"]', "DIKE_SCOPE__ACCOUNTS": '["Research"]',
                                        "DIKE_SCOPE__QOS": '["urgent"]'})
    checks = {c.name: c for c in gather(config, "root", runner)}
    partitions, accounts = checks["scope.partitions"], checks["scope.accounts"]
    assert partitions.verdict == FAIL and "'gpuu' not in this cluster (it has: gpu)" in partitions.found
    assert "'gpuu': did you mean 'gpu'?" in partitions.advice
    assert accounts.verdict == FAIL and "'Research': did you mean 'research'?" in accounts.advice
    assert checks["scope.qos"].verdict == OK and checks["scope.qos"].found == "urgent"


def test_slurmdbd_not_answering_fails_with_what_sacctmgr_said():
    argv = ["sacctmgr", "-nP", "show", "account", "format=Account"]
    stderr = (FIXTURES / "slurm-22.05" / "sacctmgr-show-account-slurmdbd-down.err").read_text(encoding="utf-8")
    runner, calls = answers("22.05", **{"sacctmgr-show-account.txt": failure(argv, 1, stderr)})
    config = load_config(None, environ={"DIKE_SCOPE__ACCOUNTS": '["research"]'})
    checks = {c.name: c for c in gather(config, "alice", runner)}
    slurmdbd = checks["slurmdbd"]
    assert slurmdbd.verdict == FAIL and "start slurmdbd" in slurmdbd.advice
    assert slurmdbd.found == ("not answering: sacctmgr -nP show account format=Account failed: slurm_persist_conn_open_"
                              "without_init: failed to open persistent connection to host:localhost:6819: Connection "
                              "refused; Sending PersistInit msg: Connection refused")
    # what needs slurmdbd is not asked again, and says why it is unknown
    assert checks["scope.accounts"].verdict == WARN and "slurmdbd did not answer" in checks["scope.accounts"].found
    assert ["sacctmgr", "-n", "-P", "show", "user", "alice", "format=user,adminlevel"] not in calls
    privileges = {c.name: c for c in not_root(admin_level=None, slurmdbd_error="refused")}["privileges"]
    assert privileges.verdict == WARN and privileges.found == "alice: unknown (slurmdbd did not answer)"


def not_root(**changes):
    """diagnose for alice, who is not root (the tests run as root, so gather would say root)."""
    fields = dict(version="slurm 22.05.8", json_format=Check("JSON format", "v0.0.38", OK), config=parse_show_config(CONFIG_22), admin_level="None",
                  is_root=False, strategy="site_factor", max_consolidation_wait_s=None, preemption=True, user="alice")
    return diagnose(**{**fields, **changes})


def test_gpus_not_tracked_in_accounting_fail_with_the_line_to_add():
    config = CONFIG_22.replace("AccountingStorageTRES   = cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu",
                               "AccountingStorageTRES   = cpu,mem,energy,node,billing,fs/disk,vmem,pages")
    assert config != CONFIG_22
    check = site(**{"scontrol-show-config.txt": config})[0]["AccountingStorageTRES"]
    assert check.verdict == FAIL
    assert check.advice.startswith("AccountingStorageTRES=cpu,mem,energy,node,billing,fs/disk,vmem,pages,gres/gpu ")
    assert "pyslurm" not in check.advice
    runner, _ = answers("22.05", **{"scontrol-show-config.txt": config})
    with_pyslurm = load_config(None, environ={"DIKE_SLURM__BACKEND": "pyslurm"})
    check = {c.name: c for c in gather(with_pyslurm, "root", runner)}["AccountingStorageTRES"]
    assert check.verdict == FAIL
    assert check.advice.endswith("the pyslurm backend cannot count any job's or node's GPUs: it refuses to read the cluster)")


def test_the_advice_names_the_user_who_runs_the_engine():
    privileges = {c.name: c for c in not_root()}["privileges"]
    assert privileges.verdict == FAIL and privileges.found == "alice: AdminLevel=None"
    assert "sacctmgr -i modify user alice set AdminLevel=Admin" in privileges.advice and "USER" not in privileges.advice
    assert {c.name: c for c in not_root(admin_level="Administrator")}["privileges"].verdict == OK


def test_files_the_engine_cannot_create_fail_with_the_folder_to_make(tmp_path):
    (tmp_path / "a-file").write_text("")
    config = load_config(None, environ={"DIKE_ENGINE__STATE_DB": str(tmp_path / "a-file" / "state.sqlite"),
                                        "DIKE_ENGINE__METRICS_FILE": str(tmp_path / "metrics" / "dike.prom")})
    runner, _ = answers("22.05")
    checks = {c.name: c for c in gather(config, "alice", runner)}
    state = checks["engine.state_db"]
    assert state.verdict == FAIL and f"{tmp_path / 'a-file'} is a file, not a folder" in state.found
    assert state.advice.startswith(f"install -d -o alice -g alice {tmp_path / 'a-file'}")
    assert checks["engine.lock_file"].verdict == FAIL  # beside the state file
    assert checks["engine.metrics_file"].verdict == OK and checks["engine.metrics_file"].found.endswith(
        "can be created by alice")


def test_a_state_file_every_user_reads_is_a_warning_under_private_data(tmp_path):
    from dike_slurm.ops.doctor import store_exposure

    state = tmp_path / "state.sqlite"
    state.write_text("")
    tmp_path.chmod(0o755)
    state.chmod(0o644)
    exposure = store_exposure(state)
    assert exposure == f"{state} is readable by every user (mode 644)"
    private = parse_show_config(CONFIG_22.replace("PrivateData             = none", "PrivateData             = jobs"))
    warned = {c.name: c for c in not_root(config=private, store_exposure=exposure)}["state file privacy"]
    assert warned.verdict == WARN and "PrivateData=jobs" in warned.found and "chmod 600" in warned.advice
    assert "state file privacy" not in {c.name for c in not_root(store_exposure=exposure)}  # PrivateData=none
    state.chmod(0o600)
    assert store_exposure(state) == ""
    state.chmod(0o644)
    tmp_path.chmod(0o700)  # a folder others cannot search keeps them out too
    assert store_exposure(state) == ""
