"""The contract of the command-line backend: the exact argv of every Slurm call it makes.

A recording runner stands in for subprocess; its canned answers are shaped like Slurm 22.05's
own output (squeue/sinfo --json are openapi v0.0.38, checked against the lab cluster; the lean
`squeue -O` / `sinfo -N -O` text holds the same jobs and nodes, with a fixed token).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dike_slurm.slurm.backends import squeue_format
from dike_slurm.domain.fields import JobField, JobUpdate, SwitchRequest
from dike_slurm.slurm.backends.cli import SACCT_FORMAT, SlurmCliBackend
from dike_slurm.slurm.backends.commands import CommandResult, FedResult
from dike_slurm.config import SlurmSettings
from dike_slurm.errors import ConfigError, SlurmError
from dike_slurm.domain.model import JobState, Placement

SQUEUE_JSON = {
    "meta": {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}},
    "errors": [],
    "jobs": [
        {  # a running 16-GPU job on two nodes
            "account": "research", "admin_comment": "", "array_job_id": 0, "array_task_id": None,
            "comment": "", "cpus": 2, "eligible_time": 1796025904, "excluded_nodes": "", "features": "",
            "job_id": 53, "job_state": "RUNNING", "name": "train", "node_count": 2, "nodes": "n[1-2]",
            "nice": None, "partition": "gpu", "priority": 11003, "qos": "normal", "requeue": True,
            "start_time": 1796025910, "submit_time": 1796025904, "time_limit": 525600, "state_reason": "None",
            "tres_alloc_str": "cpu=2,mem=4000M,node=2,billing=2,gres/gpu=16",
            "tres_per_job": "", "tres_per_node": "gres:gpu:8",
            "tres_req_str": "cpu=2,mem=4000M,node=2,billing=2,gres/gpu=16", "user_id": 1001,
            "user_name": "dikeuser1",
        },
        {  # a pending array task with a hostile comment and name, Features and ExcNodeList set
            "account": "teaching", "admin_comment": "dike:level=0,attained=0.0gpuh", "array_job_id": 60,
            "array_task_id": 3, "comment": "$(rm -rf /); dike:comm=high", "cpus": 1,
            "eligible_time": 1796025920, "excluded_nodes": "n[3-4]", "features": "leaf_s1", "job_id": 63,
            "job_state": "PENDING", "name": "x`reboot`", "node_count": 1, "nodes": "", "nice": 4294966796,
            "partition": "gpu", "priority": 11165, "qos": "normal", "requeue": True, "start_time": 1796029520,
            "submit_time": 1796025920, "time_limit": None, "tres_alloc_str": "", "tres_per_job": "",
            "state_reason": "Priority", "state_description": "",
            "tres_per_node": "gres:gpu:2", "tres_req_str": "cpu=1,mem=2000M,node=1,billing=1,gres/gpu=2",
            "user_id": 1002, "user_name": "dikeuser2",
        },
        {  # finished jobs stay in squeue for MinJobAge: not active, ignored
            "job_id": 50, "job_state": "COMPLETED", "user_name": "root", "submit_time": 1796025800,
            "tres_req_str": "cpu=1", "node_count": 1,
        },
    ],
}
SINFO_JSON = {
    "meta": {"plugin": {"type": "openapi/v0.0.38"}, "Slurm": {"release": "22.05.8"}},
    "errors": [],
    "nodes": [
        {"name": "n1", "state": "mixed", "state_flags": [], "gres": "gpu:8", "gres_used": "gpu:3", "cpus": 16,
         "active_features": "leaf_s1", "features": "leaf_s1", "partitions": ["gpu"]},
        {"name": "n3", "state": "idle", "state_flags": ["DRAIN"], "gres": "gpu:8", "gres_used": "gpu:0",
         "cpus": 16, "active_features": "leaf_s2", "features": "leaf_s2", "partitions": ["gpu"]},
    ],
}
SWITCHES = "63|1|5:00|\n"
SPRIO = "63|631297|642062\n"
TOPOLOGY = (
    "SwitchName=s1 Level=0 LinkSpeed=1 Nodes=n[1-2]\n"
    "SwitchName=s2 Level=0 LinkSpeed=1 Nodes=n[3-4]\n"
    "SwitchName=top Level=1 LinkSpeed=1 Nodes=n[1-4] Switches=s[1-2]\n"
)
SACCT = (
    "JobID|JobIDRaw|User|Account|Partition|QOS|State|Submit|Eligible|Start|End|ElapsedRaw|Timelimit|NNodes|"
    "NCPUS|AllocTRES|ReqTRES|NodeList\n"
    "53|53|dikeuser1|research|gpu|normal|REQUEUED|2026-11-30T08:00:00|2026-11-30T08:00:00|2026-11-30T08:00:05|"
    "2026-11-30T08:10:05|600|365-00:00:00|2|2|cpu=2,gres/gpu=16,node=2|cpu=2,gres/gpu=16,node=2|n[1-2]\n"
)


TOKEN = "^0123abcd"
LEAN_JOBS = squeue_format.join_records([
    ["JOBID", *(f.upper() for f in squeue_format.JOB_FIELDS[1:])],
    ["53", "53", "N/A", "RUNNING", "dikeuser1", "research", "gpu", "normal", "1796025904", "1796025904",
     "1796025910", "365-00:00:00", "2", "2", "cpu=2,mem=4000M,node=2,billing=2,gres/gpu=16", "N/A", "gres:gpu:8",
     "(null)", "", "n[1-2]", "0", "0:00", "11003", "0", "1", "None", "train", "", ""],
    ["63", "60", "3", "PENDING", "dikeuser2", "teaching", "gpu", "normal", "1796025920", "1796025920",
     "1796029520", "UNLIMITED", "1", "1", "cpu=1,mem=2000M,node=1,billing=1,gres/gpu=2", "N/A", "gres:gpu:2",
     "leaf_s1", "", "", "1", "5:00", "11165", "-500", "1", "Priority", "x`reboot`", "$(rm -rf /); dike:comm=high",
     "dike:level=0,attained=0.0gpuh"],
    ["50", "50", "N/A", "COMPLETED", "root", "", "gpu", "normal", "1796025800", "N/A", "1796025800", "UNLIMITED",
     "1", "1", "cpu=1", "N/A", "N/A", "(null)", "", "", "0", "0:00", "0", "0", "0", "None", "done", "", ""],
], TOKEN)
LEAN_EXCLUDED = squeue_format.join_records([["JOBID", "EXC_NODES"], ["53", ""], ["63", "n[3-4]"], ["50", ""]], TOKEN)
LEAN_NODES = squeue_format.join_records([
    ["NODELIST", "PARTITION", "CPUS", "GRES", "GRES_USED", "STATE", "AVAIL_FEATURES", "ACTIVE_FEATURES"],
    ["n1", "gpu", "16", "gpu:8", "gpu:3", "mixed", "leaf_s1", "leaf_s1"],
    ["n3", "gpu", "16", "gpu:8", "gpu:0", "idle+drain", "leaf_s2", "leaf_s2"],
], TOKEN)


class Recorder:
    """Stands in for subprocess: remembers each call, answers from a table keyed by argv prefix."""

    def __init__(self, answers: dict[tuple[str, ...], CommandResult] | None = None) -> None:
        self.calls: list[tuple[list[str], dict[str, str], float]] = []
        self.answers = answers or {}

    def __call__(self, argv, env, timeout) -> CommandResult:
        self.calls.append((list(argv), dict(env), timeout))
        for prefix, result in self.answers.items():
            if tuple(argv[: len(prefix)]) == prefix:
                return result
        return CommandResult(0, "", "")

    @property
    def argvs(self) -> list[list[str]]:
        return [argv for argv, _, _ in self.calls]


def ok(text: str) -> CommandResult:
    return CommandResult(0, text, "")


def reads(prefix: str = "") -> dict[tuple[str, ...], CommandResult]:
    return {
        (f"{prefix}squeue", "--json"): ok(json.dumps(SQUEUE_JSON)),
        (f"{prefix}squeue", "-h"): ok(SWITCHES),
        (f"{prefix}sinfo", "--json"): ok(json.dumps(SINFO_JSON)),
        (f"{prefix}sprio",): ok(SPRIO),
        (f"{prefix}scontrol", "show", "topology"): ok(TOPOLOGY),
        (f"{prefix}sacct",): ok(SACCT),
    }


def lean_reads(prefix: str = "") -> dict[tuple[str, ...], CommandResult]:
    return {
        (f"{prefix}squeue", "-a", "-o"): ok(LEAN_EXCLUDED),
        (f"{prefix}squeue", "-a", "--sort=i", "-O"): ok(LEAN_JOBS),
        (f"{prefix}sinfo", "-N", "-O"): ok(LEAN_NODES),
        **reads(prefix),
    }


def backend(recorder: Recorder, job_read: str = "json", **settings) -> SlurmCliBackend:
    return SlurmCliBackend(
        SlurmSettings(**settings), runner=recorder, clock=lambda: 1796026000.0, environ={"PATH": "/usr/bin"},
        job_read=job_read, token=lambda: TOKEN,
    )


def test_the_lean_read_makes_exactly_these_calls_with_a_token_and_epoch_times():
    recorder = Recorder(lean_reads())
    backend(recorder, "lean").read_cluster()
    lean_env = {"PATH": "/usr/bin", "TZ": "UTC", "SLURM_TIME_FORMAT": "%s"}
    assert recorder.argvs == [
        ["squeue", "-a", "--sort=i", "-O",
         "JobID:^0123abcd,ArrayJobID:^0123abcd,ArrayTaskID:^0123abcd,State:^0123abcd,UserName:^0123abcd,"
         "Account:^0123abcd,Partition:^0123abcd,QOS:^0123abcd,SubmitTime:^0123abcd,EligibleTime:^0123abcd,"
         "StartTime:^0123abcd,TimeLimit:^0123abcd,NumNodes:^0123abcd,NumCPUs:^0123abcd,tres-alloc:^0123abcd,"
         "tres-per-job:^0123abcd,tres-per-node:^0123abcd,Feature:^0123abcd,ReqNodes:^0123abcd,NodeList:^0123abcd,"
         "ReqSwitch:^0123abcd,Wait4Switch:^0123abcd,PriorityLong:^0123abcd,Nice:^0123abcd,Requeue:^0123abcd,Reason:^0123abcd,"
         "Name:^0123abcd,Comment:^0123abcd,admin_comment:^0123abcd"],
        ["squeue", "-a", "-o", "%A^0123abcd%x^0123abcd"],
        ["sprio", "-h", "-o", "%i|%S|%Y"],
        ["sinfo", "-N", "-O",
         "NodeList:^0123abcd,PartitionName:^0123abcd,CPUs:^0123abcd,Gres:^0123abcd,GresUsed:^0123abcd,"
         "StateComplete:^0123abcd,Features:^0123abcd,features_act:^0123abcd"],
        ["scontrol", "show", "topology"],
    ]
    envs = [env for _, env, _ in recorder.calls]
    assert envs == [lean_env, lean_env, {"PATH": "/usr/bin", "TZ": "UTC"}, lean_env, {"PATH": "/usr/bin", "TZ": "UTC"}]


def test_a_callers_slurm_time_format_reaches_no_command_but_the_lean_read():
    """An admin's SLURM_TIME_FORMAT=%s made sacct print epoch seconds, which the reader skipped as bad
    timestamps: every finished job was lost to the prior and fair share (seen on the lab)."""
    recorder = Recorder(lean_reads())
    cli = SlurmCliBackend(SlurmSettings(), runner=recorder, clock=lambda: 1796026000.0,
                          environ={"PATH": "/usr/bin", "SLURM_TIME_FORMAT": "%s"},
                          job_read="lean", token=lambda: TOKEN)
    cli.read_cluster()
    records = cli.accounting(1796000000.0, 1796026000.0).records
    envs = {argv[0]: env for argv, env, _ in recorder.calls}
    assert envs["sacct"] == envs["sprio"] == envs["scontrol"] == {"PATH": "/usr/bin", "TZ": "UTC"}
    assert envs["squeue"] == envs["sinfo"] == {"PATH": "/usr/bin", "TZ": "UTC", "SLURM_TIME_FORMAT": "%s"}
    assert records  # the recorded sacct text reads as records


def test_the_lean_read_and_the_json_read_build_the_same_cluster():
    lean = backend(Recorder(lean_reads()), "lean").read_cluster()
    json_read = backend(Recorder(reads()), "json").read_cluster()
    assert lean == json_read
    assert [j.job_id for j in lean.jobs] == [53, 63] and lean.admin_comments[63] == "dike:level=0,attained=0.0gpuh"


def test_read_cluster_makes_exactly_these_calls():
    recorder = Recorder(reads())
    backend(recorder).read_cluster()
    assert recorder.argvs == [
        ["squeue", "--json"],
        ["squeue", "-h", "-a", "-t", "PD", "-O", "JobID:|,ReqSwitch:|,Wait4Switch:|"],
        ["sprio", "-h", "-o", "%i|%S|%Y"],
        ["sinfo", "--json"],
        ["scontrol", "show", "topology"],
    ]


def test_every_call_gets_slurm_conf_utc_and_the_timeout_and_bin_dir(tmp_path):
    recorder = Recorder(reads("/opt/slurm/bin/"))
    topology = tmp_path / "topology.conf"
    topology.write_text("SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Nodes=n[3-4]\n")
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text("ClusterName=x\n")
    cli = backend(recorder, slurm_conf=slurm_conf, bin_dir=Path("/opt/slurm/bin"),
                  command_timeout_s=7, topology_conf=topology)
    state = cli.read_cluster()
    assert [argv[0] for argv in recorder.argvs] == [
        "/opt/slurm/bin/squeue", "/opt/slurm/bin/squeue", "/opt/slurm/bin/sprio", "/opt/slurm/bin/sinfo",
    ]  # the topology came from the file: no scontrol call
    assert state.topology.leaves == ("s1", "s2")
    for _, env, timeout in recorder.calls:
        assert env["SLURM_CONF"] == str(slurm_conf) and env["TZ"] == "UTC" and timeout == 7
    assert cli.calls == 4
    # the file is read every cycle: the same text is the same tree, an edited one is parsed anew
    assert cli.read_cluster().topology is state.topology
    topology.write_text("SwitchName=s1 Nodes=n[1-4]\n")
    assert cli.read_cluster().topology.leaves == ("s1",)


def test_accounting_always_passes_explicit_start_and_end():
    recorder = Recorder(reads())
    result = backend(recorder).accounting(1796025600.0, 1796026000.0)
    assert recorder.argvs == [[
        "sacct", "--allusers", "--allocations", "--duplicates", "--parsable2", f"--format={SACCT_FORMAT}",
        "-S", "2026-11-30T08:00:00", "-E", "2026-11-30T08:06:40",
    ]]
    (record,) = result.records
    assert record.job_id == 53 and record.gpus == 16 and record.state is JobState.REQUEUED


@pytest.mark.parametrize(
    ("values", "argvs"),
    [
        ({JobField.SITE_FACTOR: 631297, JobField.ADMIN_COMMENT: "dike:level=1,attained=3.2gpuh"},
         [["scontrol", "update", "JobId=63", "SiteFactor=631297", "AdminComment=dike:level=1,attained=3.2gpuh"]]),
        ({JobField.SWITCHES: SwitchRequest(1, 300), JobField.FEATURES: "leaf_s1",
          JobField.EXCLUDED_NODES: ("n3", "n4")},
         [["scontrol", "update", "JobId=63", "Switches=1@00:05:00", "Features=leaf_s1", "ExcNodeList=n3,n4"]]),
        ({JobField.SWITCHES: SwitchRequest(0), JobField.FEATURES: "", JobField.EXCLUDED_NODES: ()},
         [["scontrol", "update", "JobId=63", "Switches=0", "Features=", "ExcNodeList="]]),
        ({JobField.PRIORITY: 5000}, [["scontrol", "update", "JobId=63", "Priority=5000"]]),
        ({JobField.PRIORITY: None, JobField.ADMIN_COMMENT: ""},
         [["scontrol", "update", "JobId=63", "AdminComment="], ["scontrol", "hold", "63"],
          ["scontrol", "release", "63"]]),
        ({JobField.NICE: 250}, [["scontrol", "update", "JobId=63", "Nice=250"]]),
    ],
)
def test_writes_make_exactly_these_calls(values, argvs):
    recorder = Recorder()
    outcome = backend(recorder).apply(JobUpdate.of(63, values))
    assert outcome.ok and recorder.argvs == argvs


def test_an_update_lists_its_fields_in_field_order_whatever_order_they_came_in():
    fields = list(JobField)
    values = {field: "x" for field in fields}
    for order in (fields, fields[::-1], fields[3:] + fields[:3]):
        assert JobUpdate.of(1, {f: values[f] for f in order}).fields == tuple(fields)


def test_requeue_is_one_call():
    recorder = Recorder()
    assert backend(recorder).requeue(53).ok
    assert recorder.argvs == [["scontrol", "requeue", "53"]]


def test_squeue_json_becomes_the_domain_jobs_and_untrusted_text_stays_data():
    recorder = Recorder(reads())
    state = backend(recorder).read_cluster()
    running, pending = state.jobs
    assert (running.job_id, running.state, running.gpus, running.num_nodes) == (53, JobState.RUNNING, 16, 2)
    assert running.nodes == ("n1", "n2") and running.nice == 0 and running.start_time == 1796025910.0
    assert running.time_limit_s == 525600 * 60
    assert pending.display_id == "60_3" and pending.gpus == 2
    assert pending.nice == -500  # squeue's JSON prints Nice=-500 as 4294966796
    assert pending.start_time is None and pending.time_limit_s is None
    assert pending.placement == Placement(max_switches=1, switches_wait_s=300, features="leaf_s1",
                                          exclude_nodes=("n3", "n4"))
    assert state.site_factors == {63: 631297}
    assert state.admin_comments == {53: "", 63: "dike:level=0,attained=0.0gpuh"}
    n1, n3 = state.nodes
    assert (n1.gpus, n1.gpus_alloc, n1.features) == (8, 3, ("leaf_s1",))
    assert n3.state == "IDLE+DRAIN" and not n3.available
    assert state.topology.lowest_common_switch(["n1", "n3"]) == "top"
    # The hostile comment and name are data: no argv of any call contains them.
    assert not any("rm -rf" in word or "reboot" in word for argv in recorder.argvs for word in argv)


def test_a_job_that_started_meanwhile_is_not_an_engine_error():
    recorder = Recorder({("scontrol",): CommandResult(1, "", "Job is no longer pending execution for job 63\n")})
    outcome = backend(recorder).apply(JobUpdate.of(63, {JobField.FEATURES: "leaf_s1"}))
    assert not outcome.ok and outcome.job_gone
    assert outcome.message == "Job is no longer pending execution for job 63"


def test_a_refused_write_is_an_error_with_slurms_message():
    recorder = Recorder({("scontrol",): CommandResult(1, "", "Access/permission denied for job 63\n")})
    outcome = backend(recorder).apply(JobUpdate.of(63, {JobField.SITE_FACTOR: 5}))
    assert not outcome.ok and not outcome.job_gone and "permission denied" in outcome.message


def test_a_failing_read_raises_with_the_command_and_slurms_message():
    down = CommandResult(1, "", "slurm_load_jobs error: Unable to contact slurm controller\n")
    recorder = Recorder({("squeue", "--json"): down})
    with pytest.raises(SlurmError, match="squeue --json failed .*Unable to contact slurm controller"):
        backend(recorder).read_cluster()
    recorder = Recorder({("squeue",): down})  # the lean read fails, then the JSON read says why
    with pytest.raises(SlurmError, match="squeue --json failed .*Unable to contact slurm controller"):
        backend(recorder, "lean").read_cluster()
    assert [argv[:3] for argv in recorder.argvs] == [["squeue", "-a", "--sort=i"], ["squeue", "--json"]]


def test_a_missing_slurm_conf_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigError, match="slurm.slurm_conf: no such file"):
        backend(Recorder(), slurm_conf=tmp_path / "missing.conf")


def test_describe_quotes_for_a_shell_reader():
    cli = backend(Recorder())
    text = cli.describe(JobUpdate.of(7, {JobField.SITE_FACTOR: 0, JobField.ADMIN_COMMENT: "ticket 42"}))
    assert text == "scontrol update JobId=7 SiteFactor=0 'AdminComment=ticket 42'"


def test_reads_share_what_is_left_of_the_cycle_deadline_and_writes_keep_their_timeout():
    class SlowRecorder(Recorder):
        def __call__(self, argv, env, timeout):  # every read takes 0.2 s of the budget
            time.sleep(0.2)
            return super().__call__(argv, env, timeout)

    recorder = SlowRecorder(reads())
    cli = backend(recorder, command_timeout_s=30)
    cli.limit_reads(0.5)
    with pytest.raises(SlurmError, match="^sinfo --json not started: the cycle deadline has passed$"):
        cli.read_cluster()
    first, second = recorder.calls[0][2], recorder.calls[1][2]
    assert 0.4 < first <= 0.5 and 0.1 < second <= 0.3 < first  # each read gets what is left, not 30 s
    cli.apply(JobUpdate.of(63, {JobField.SITE_FACTOR: 5}))
    assert recorder.calls[-1][0][:2] == ["scontrol", "update"] and recorder.calls[-1][2] == 30  # writes: whole
    cli.limit_reads(None)
    cli.read_cluster()
    assert all(timeout == 30 for _, _, timeout in recorder.calls[-5:])


# ---------------------------------------------------------------- the site's priority settings

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def priority_reads(version: str, **replaced: CommandResult) -> dict[tuple[str, ...], CommandResult]:
    """What Slurm `version` printed (tests/fixtures/slurm-VERSION) for the three priority reads."""
    folder = FIXTURES / f"slurm-{version}"
    answers = {
        ("scontrol", "show", "config"): ok((folder / "scontrol-show-config.txt").read_text()),
        ("scontrol", "show", "partition"): ok((folder / "scontrol-show-partition.txt").read_text()),
        ("sacctmgr",): ok((folder / "sacctmgr-show-qos.txt").read_text()),
    }
    return {**answers, **{prefix: replaced[name] for prefix, name in (
        (("scontrol", "show", "config"), "config"), (("scontrol", "show", "partition"), "partitions"),
        (("sacctmgr",), "qos")) if name in replaced}}


@pytest.mark.parametrize("version", ["22.05", "24.11", "26.05"])
def test_the_sites_priority_is_read_with_exactly_these_calls(version):
    from dike_slurm.domain.slurm_priority import PartitionPriority, effective_span, tier_gap

    recorder = Recorder(priority_reads(version))
    model = backend(recorder).priority_model()
    assert recorder.argvs == [
        ["scontrol", "show", "config"],
        ["scontrol", "show", "partition", "-o"],
        ["sacctmgr", "-nP", "show", "qos", "format=Name,Priority"],
    ]
    assert all(env == {"PATH": "/usr/bin", "TZ": "UTC"} for _, env, _ in recorder.calls)
    weights = model.weights
    qos = 9_000_000 if version == "26.05" else 1_000_000  # the lab's QOS weight when each was recorded
    assert (weights.age, weights.fairshare, weights.job_size, weights.partition, weights.qos, weights.assoc) == (
        1000, 10000, 1000, 0, qos, 0)
    assert weights.tres == {"gres/gpu": 1000} and weights.max_age_s == 1800 and weights.multifactor
    assert weights.decay_half_life_s == 7 * 86400 and weights.fair_tree and not weights.favor_small
    assert model.qos_priority == {"normal": 0, "low": 10, "urgent": 100}
    assert model.qos_tiers() == [0, qos / 10, qos] and tier_gap(model) == qos / 10
    assert model.partitions["gpu"] == PartitionPriority(job_factor=1, tier=1)
    assert model.partition_tres["gpu"] == {"cpu": 64, "node": 4, "gres/gpu": 32}
    assert (model.node_count, model.cluster_cpus) == (4, 64)
    if version == "24.11":  # recorded with a second partition on n[3-4]
        assert model.partitions["prio"] == PartitionPriority(job_factor=10, tier=2)
        assert model.partition_tres["prio"] == {"cpu": 32, "node": 2, "gres/gpu": 16}
    # tiers: the smallest step less 13,000 of other factors less 1
    assert [effective_span(mode, 1_000_000, model) for mode in ("tiers", "blend", "over")] == [
        qos // 10 - 13_001, 1_000_000, 1_000_000]


def test_the_priority_reads_use_bin_dir_and_slurm_conf(tmp_path):
    slurm_conf = tmp_path / "slurm.conf"
    slurm_conf.write_text("ClusterName=x\n")
    recorder = Recorder({("/opt/slurm/bin/" + prefix[0], *prefix[1:]): answer
                         for prefix, answer in priority_reads("22.05").items()})
    backend(recorder, slurm_conf=slurm_conf, bin_dir=Path("/opt/slurm/bin"), command_timeout_s=7).priority_model()
    assert [argv[0] for argv in recorder.argvs] == ["/opt/slurm/bin/scontrol"] * 2 + ["/opt/slurm/bin/sacctmgr"]
    assert all(env["SLURM_CONF"] == str(slurm_conf) and timeout == 7 for _, env, timeout in recorder.calls)


def test_without_slurmdbd_there_is_no_qos_table_to_read():
    config = (FIXTURES / "slurm-22.05" / "scontrol-show-config.txt").read_text().replace(
        "accounting_storage/slurmdbd", "accounting_storage/none")
    recorder = Recorder(priority_reads("22.05", config=ok(config)))
    model = backend(recorder).priority_model()
    assert [argv[0] for argv in recorder.argvs] == ["scontrol", "scontrol"]
    assert model.qos_priority == {} and model.qos_tiers() == [0.0]


def test_unset_and_basic_settings_read_as_slurm_means_them():
    config = ("PriorityType            = priority/basic\nPriorityWeightTRES      = (null)\n"
              "PriorityFlags           = NO_FAIR_TREE\nPriorityMaxAge          = 1-00:00:00\n")
    model = backend(Recorder(priority_reads("22.05", config=ok(config)))).priority_model()
    assert not model.weights.multifactor and model.weights.tres == {} and not model.weights.fair_tree
    assert model.weights.max_age_s == 86400 and model.weights.total == 0


@pytest.mark.parametrize("failing, answer, message", [
    ("config", CommandResult(1, "", "slurm_load_ctl_conf error: Unable to contact slurm controller\n"),
     "scontrol show config failed \\(exit 1\\): slurm_load_ctl_conf error"),
    ("partitions", CommandResult(1, "", "slurm_load_partitions error: Unable to contact slurm controller\n"),
     "scontrol show partition -o failed \\(exit 1\\): slurm_load_partitions error"),
    ("partitions", ok("PartitionName=gpu Nodes=n[1-4] PriorityTier=high TotalCPUs=64 TotalNodes=4\n"),
     r"scontrol show partition -o: cannot read its output: .*:1: prioritytier='high' is not an integer"),
    ("qos", CommandResult(1, "", "sacctmgr: error: Problem talking to the database: Connection refused\n"),
     "sacctmgr -nP show qos format=Name,Priority failed \\(exit 1\\): .*Connection refused"),
    ("qos", ok("normal|0\nurgent|high\n"),
     r"sacctmgr -nP show qos format=Name,Priority: cannot read its output: .*'high' is not an integer"),
    ("config", ok("PriorityType = priority/multifactor\nPriorityWeightAge = lots\n"),
     r"scontrol show config: cannot read its output: .*PriorityWeightAge='lots' is not a number"),
])
def test_a_priority_read_that_fails_names_its_command(failing, answer, message):
    with pytest.raises(SlurmError, match=message):
        backend(Recorder(priority_reads("22.05", **{failing: answer}))).priority_model()


# ---------------------------------------------------------------- writes fed to one scontrol


class Feeder:
    """Stands in for the fed scontrol: remembers argv and stdin, answers with a canned result."""

    def __init__(self, result: FedResult | None = None) -> None:
        self.calls: list[tuple[list[str], str, float]] = []
        self.result = result or FedResult(0, "", "")

    def __call__(self, argv, env, stdin, timeout) -> FedResult:
        self.calls.append((list(argv), stdin, timeout))
        return self.result


def fed_backend(recorder: Recorder, feeder, **settings) -> SlurmCliBackend:
    return SlurmCliBackend(SlurmSettings(**settings), runner=recorder, feeder=feeder, environ={"PATH": "/usr/bin"})


def site_factors(*pairs: tuple[int, int]) -> list[JobUpdate]:
    return [JobUpdate.of(job, {JobField.SITE_FACTOR: value}) for job, value in pairs]


def test_updates_go_as_lines_to_one_scontrol_with_an_audit_text_an_admin_can_run():
    recorder, feeder = Recorder(), Feeder()
    updates = [
        JobUpdate.of(63, {JobField.SITE_FACTOR: 631297, JobField.ADMIN_COMMENT: "dike:level=1,attained=3.2gpuh"}),
        JobUpdate.of(64, {JobField.SWITCHES: SwitchRequest(1, 300), JobField.EXCLUDED_NODES: ("n3", "n4")}),
        JobUpdate.of(65, {JobField.FEATURES: "", JobField.EXCLUDED_NODES: ()}),
    ]
    results = fed_backend(recorder, feeder, command_timeout_s=30).apply_many(updates, timeout=12)
    assert recorder.argvs == []  # no process per job
    assert feeder.calls == [(["scontrol"], (
        "update JobId=63 SiteFactor=631297 AdminComment=dike:level=1,attained=3.2gpuh\n"
        "update JobId=64 Switches=1@00:05:00 ExcNodeList=n3,n4\n"
        "update JobId=65 Features= ExcNodeList=\n"), 30)]  # at least the command timeout
    assert all(r.ok for r in results)
    assert results[1].command == "echo 'update JobId=64 Switches=1@00:05:00 ExcNodeList=n3,n4' | scontrol"


@pytest.mark.parametrize("hostile", ["a b", "x\nupdate JobId=1 Priority=1", "x;y'z", 'say "hi"', "tab\there", "\x1b[31m",
                                     "c" * 1100])
def test_a_value_that_cannot_be_one_line_goes_as_its_own_process(hostile):
    recorder, feeder = Recorder(), Feeder()
    updates = site_factors((1, 10), (2, 20)) + [JobUpdate.of(3, {JobField.ADMIN_COMMENT: hostile})]
    results = fed_backend(recorder, feeder).apply_many(updates)
    assert [stdin for _, stdin, _ in feeder.calls] == ["update JobId=1 SiteFactor=10\nupdate JobId=2 SiteFactor=20\n"]
    assert recorder.argvs == [["scontrol", "update", "JobId=3", f"AdminComment={hostile}"]]  # one argv word
    assert all(r.ok for r in results)


def test_a_job_s_second_update_goes_in_a_second_round_after_its_first_in_order():
    recorder, feeder = Recorder(), Feeder()
    updates = [
        JobUpdate.of(1, {JobField.SITE_FACTOR: 10}),
        JobUpdate.of(2, {JobField.PRIORITY: None}),
        JobUpdate.of(1, {JobField.FEATURES: "leaf_s1"}),
        JobUpdate.of(3, {JobField.SITE_FACTOR: 30}),
        JobUpdate.of(2, {JobField.SITE_FACTOR: 20}),
    ]
    fed_backend(recorder, feeder).apply_many(updates)
    # round 1: each job's first update (job 2's Priority handed back is hold + release, alone);
    # round 2: the second ones
    assert [stdin for _, stdin, _ in feeder.calls] == ["update JobId=1 SiteFactor=10\nupdate JobId=3 SiteFactor=30\n",
                                                     "update JobId=1 Features=leaf_s1\nupdate JobId=2 SiteFactor=20\n"]
    assert recorder.argvs == [["scontrol", "hold", "2"], ["scontrol", "release", "2"]]


def test_each_line_gets_its_own_error_and_a_gone_job_is_not_an_engine_error():
    stderr = ("Invalid job id specified for job 2\n"
              "Job is no longer pending execution for job 3\n"
              "Access/permission denied for job 4\n")
    feeder = Feeder(FedResult(1, "", stderr))
    recorder = Recorder()
    results = fed_backend(recorder, feeder).apply_many(site_factors((1, 1), (2, 2), (3, 3), (4, 4), (5, 5)))
    assert recorder.argvs == []
    assert [(r.ok, r.job_gone, r.message) for r in results] == [
        (True, False, ""),
        (False, True, "Invalid job id specified for job 2"),
        (False, True, "Job is no longer pending execution for job 3"),
        (False, False, "Access/permission denied for job 4"),
        (True, False, ""),
    ]


def test_a_write_slurm_asks_for_again_later_reads_so_on_its_own_line():
    """Slurm 22.05 just after slurmctld restarted (recorded on the lab, tests/integration/test_faults.py)."""
    stderr = "Job update not available right now, the DB index is being set, try again in a bit for job 2\n"
    results = fed_backend(Recorder(), Feeder(FedResult(1, "", stderr))).apply_many(site_factors((1, 1), (2, 2)))
    assert [(r.ok, r.job_gone, r.retry_later) for r in results] == [(True, False, False), (False, False, True)]


@pytest.mark.parametrize("result", [
    FedResult(0, "", "slurm_update error: Socket timed out on send/recv operation\n"),  # a line nobody owns
    FedResult(1, "", ""),  # an exit code no line explains
    FedResult(1, "", "Invalid job id specified for job 99\n"),  # a job not in the batch
])
def test_an_outcome_scontrol_left_unclear_is_written_again_alone(result):
    recorder = Recorder({("scontrol", "update", "JobId=2"): CommandResult(1, "", "Invalid job id specified for job 2\n")})
    results = fed_backend(recorder, Feeder(result)).apply_many(site_factors((1, 1), (2, 2)))
    assert recorder.argvs == [["scontrol", "update", "JobId=1", "SiteFactor=1"],
                              ["scontrol", "update", "JobId=2", "SiteFactor=2"]]
    assert [(r.ok, r.job_gone) for r in results] == [(True, False), (False, True)]
    assert results[0].command == "scontrol update JobId=1 SiteFactor=1"


def test_a_killed_scontrol_leaves_its_unanswered_lines_unconfirmed_and_starts_nothing_more():
    feeder = Feeder(FedResult(None, "", "Invalid job id specified for job 1\n", killed_after=20.0))
    recorder = Recorder()
    updates = site_factors((1, 1), (2, 2), (3, 3)) + [JobUpdate.of(4, {JobField.ADMIN_COMMENT: "a b"})]
    results = fed_backend(recorder, feeder).apply_many(updates, timeout=20)
    assert recorder.argvs == []
    assert [(r.ok, r.job_gone) for r in results] == [(False, True), (False, False), (False, False), (False, False)]
    assert results[1].message == results[2].message == \
        "unconfirmed: scontrol was killed after 20s with this line unanswered"
    assert results[3].message.startswith("not sent: ")


@pytest.mark.parametrize("value", ["abc", 1.5, True, "12"])
def test_an_integer_field_that_is_not_an_integer_is_refused_before_anything_is_sent(value):
    recorder, feeder = Recorder(), Feeder()
    cli = fed_backend(recorder, feeder)
    results = cli.apply_many(site_factors((1, 1), (3, 3)) + [JobUpdate.of(2, {JobField.SITE_FACTOR: value})])
    single = cli.apply(JobUpdate.of(2, {JobField.NICE: value}))
    assert [stdin for _, stdin, _ in feeder.calls] == ["update JobId=1 SiteFactor=1\nupdate JobId=3 SiteFactor=3\n"]
    assert recorder.argvs == []
    assert not results[2].ok and results[2].message.startswith("refused: SiteFactor=")
    assert not single.ok and single.message.startswith("refused: Nice=")


def test_a_backend_given_its_own_runner_writes_one_process_per_update():
    recorder = Recorder()
    SlurmCliBackend(SlurmSettings(), runner=recorder).apply_many(site_factors((1, 1), (2, 2)))
    assert recorder.argvs == [["scontrol", "update", "JobId=1", "SiteFactor=1"],
                              ["scontrol", "update", "JobId=2", "SiteFactor=2"]]


class ScontrolModel:
    """Slurm as scontrol shows it (lab facts, tests/integration/test_faults.py): jobs that are
    gone or running refuse an update with `<message> for job N`; one process per command, or
    lines on stdin, each line run whatever the lines before it did, exit 1 at the end if any failed.
    The fed form splits words on whitespace and keeps quotes: it is only given lines that have none."""

    def __init__(self, gone: set[int], running: set[int]) -> None:
        self.gone, self.running = gone, running
        self.held: dict[int, dict[str, str]] = {}

    def command(self, words: list[str]) -> str:
        verb, *rest = words
        if verb in ("hold", "release"):
            job = int(rest[0])
        else:
            assert verb == "update" and rest[0].startswith("JobId=")
            job = int(rest[0].removeprefix("JobId="))
        if job in self.gone:
            return f"Invalid job id specified for job {job}"
        if job in self.running and any(w.split("=")[0] in ("Features", "ExcNodeList", "Switches") for w in rest):
            return f"Job is no longer pending execution for job {job}"
        fields = self.held.setdefault(job, {})
        if verb == "update":
            for word in rest[1:]:
                key, _, value = word.partition("=")
                fields[key] = value
        else:
            fields["Priority"] = verb
        return ""

    def runner(self, argv, env, timeout) -> CommandResult:
        error = self.command(list(argv[1:]))
        return CommandResult(1 if error else 0, "", error + "\n" if error else "")

    def feeder(self, argv, env, stdin, timeout) -> FedResult:
        assert argv == ["scontrol"] or argv == ("scontrol",)
        errors = [e for e in (self.command(line.split()) for line in stdin.splitlines()) if e]
        return FedResult(1 if errors else 0, stdin, "".join(e + "\n" for e in errors))


VALUES = st.one_of(st.integers(-10**6, 10**6), st.sampled_from(["", "leaf_s1", "a b", "x'y", "n1,n2"]))
FIELDS = st.sampled_from([JobField.SITE_FACTOR, JobField.NICE, JobField.ADMIN_COMMENT, JobField.FEATURES,
                          JobField.PRIORITY])
UPDATES = st.lists(st.builds(
    lambda job, values: JobUpdate.of(job, values),
    st.integers(1, 6), st.dictionaries(FIELDS, st.one_of(VALUES, st.none()), min_size=1, max_size=3),
), max_size=12)


@settings(max_examples=300, deadline=None)
@given(UPDATES, st.sets(st.integers(1, 6), max_size=2), st.sets(st.integers(1, 6), max_size=2))
def test_a_batch_on_stdin_ends_exactly_as_one_process_per_write(updates, gone, running):
    updates = [u for u in updates if all(v is not None or k is JobField.PRIORITY for k, v in u.values)]
    fed, plain = ScontrolModel(gone, running), ScontrolModel(gone, running)
    batched = SlurmCliBackend(SlurmSettings(), runner=fed.runner, feeder=fed.feeder).apply_many(updates)
    one_by_one = [SlurmCliBackend(SlurmSettings(), runner=plain.runner).apply(u) for u in updates]
    assert [(r.ok, r.job_gone, r.message) for r in batched] == [(r.ok, r.job_gone, r.message) for r in one_by_one]
    assert fed.held == plain.held
