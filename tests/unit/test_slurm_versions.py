"""What real Slurm 22.05, 24.11 and 26.05 print (tests/fixtures/slurm-VERSION, recorded on the lab
by tests/fixtures/record-slurm-json) is read into the same snapshot, and nothing is ever read
as "no jobs" because the format changed: an unknown format, a missing list or an unknown job
state is one clear error and the cycle writes nothing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import in_process

from dike_slurm.slurm.accounting_json import read_sacct_json
from dike_slurm.slurm.backends.cli import SlurmCliBackend
from dike_slurm.slurm.backends.commands import CommandResult
from dike_slurm.config import SlurmSettings
from dike_slurm.domain.model import JobState
from dike_slurm.slurm.formats import FormatError, array_task_text, job_base_state, sacct_state_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
VERSIONS = ("22.05", "24.11", "26.05")
NODE_READ = {"22.05": ["sinfo", "--json"], "24.11": ["scontrol", "show", "nodes", "--json"],
             "26.05": ["scontrol", "show", "nodes", "--json"]}


def fixture(version: str, name: str) -> str:
    return (FIXTURES / f"slurm-{version}" / name).read_text(encoding="utf-8")


class FixtureSlurm:
    """Answers each read with what that Slurm printed (overrides: file name -> text)."""

    def __init__(self, version: str, **overrides: str) -> None:
        self.version = version
        self.overrides = {k.replace("_json", ".json").replace("_txt", ".txt").replace("_", "-"): v
                          for k, v in overrides.items()}
        self.argvs: list[list[str]] = []

    def text(self, name: str) -> str:
        return self.overrides[name] if name in self.overrides else fixture(self.version, name)

    def __call__(self, argv, env, timeout) -> CommandResult:
        argv = list(argv)
        self.argvs.append(argv)
        if argv == ["squeue", "--json"]:
            return CommandResult(0, self.text("squeue.json"), "")
        if argv[:2] == ["squeue", "-h"]:
            return CommandResult(0, self.text("squeue-O.txt"), "")
        if argv[0] == "sprio":
            return CommandResult(0, self.text("sprio.txt"), "")
        if argv == ["sinfo", "--json"]:
            return CommandResult(0, self.text("sinfo.json"), "")
        if argv == ["scontrol", "show", "nodes", "--json"]:
            path = FIXTURES / f"slurm-{self.version}" / "scontrol-show-nodes.json"
            if "scontrol-show-nodes.json" not in self.overrides and not path.exists():
                return CommandResult(1, "", "scontrol: unrecognized option '--json'\n")
            return CommandResult(0, self.text("scontrol-show-nodes.json"), "")
        if argv == ["scontrol", "show", "topology"]:
            return CommandResult(0, self.text("topology.txt"), "")
        if argv[0] == "scontrol":  # writes
            return CommandResult(0, "", "")
        raise AssertionError(f"unexpected command {argv}")


def read(version: str, **overrides: str):
    slurm = FixtureSlurm(version, **overrides)
    backend = SlurmCliBackend(SlurmSettings(), runner=slurm, clock=lambda: 1796080000.0, job_read="json")
    return backend.read_cluster(), backend, slurm


def squeue_text(version: str) -> dict[int, str]:
    """`squeue -h -a -o '%i|%A|%T'` as printed: job id (%A) -> state (a pending array is one row)."""
    rows = [line.split("|") for line in fixture(version, "squeue.txt").splitlines() if line]
    return {int(job_id): state for _, job_id, state in rows}


def sinfo_text(version: str) -> dict[str, tuple[str, tuple[str, ...], str]]:
    """`sinfo -h -N -o '%N|%T|%f|%G'`: node -> (state, features, gres)."""
    rows = [line.split("|") for line in fixture(version, "sinfo.txt").splitlines() if line]
    return {name: (state, tuple(features.split(",")), gres) for name, state, features, gres in rows}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_job_and_node_slurm_listed_is_read(version):
    cluster, backend, slurm = read(version)
    assert slurm.argvs[:3] == [["squeue", "--json"],
                               ["squeue", "-h", "-a", "-t", "PD", "-O", "JobID:|,ReqSwitch:|,Wait4Switch:|"],
                               ["sprio", "-h", "-o", "%i|%S|%Y"]]
    assert slurm.argvs[3] == NODE_READ[version]
    assert backend.slurm_release.startswith(version)
    # the same jobs and states as squeue's own text output
    assert {j.job_id: j.state.value for j in cluster.jobs} == squeue_text(version)
    # the same nodes, states and features as sinfo's own text output (one line per node)
    listed = sinfo_text(version)
    assert sorted(n.name for n in cluster.nodes) == sorted(listed) == ["n1", "n2", "n3", "n4"]
    for node in cluster.nodes:
        state, features, gres = listed[node.name]
        assert node.features == features and node.gpus == int(gres.rsplit(":", 1)[1]) == 8
        assert node.available == (state != "drained"), (node.name, node.state, state)
    jobs, nodes = backend.last_counts
    assert jobs.read == len(cluster.jobs) and jobs.read + jobs.left_out == jobs.printed and not jobs.unreadable
    assert nodes.read == 4 and not nodes.unreadable


def comparable(version: str):
    """The snapshot with what differs by nature between two recordings (job ids, times) taken out."""
    cluster, _, _ = read(version)
    jobs = sorted(
        (j.name, j.user, j.state, j.gpus, j.num_nodes, j.cpus, j.account, j.partition, j.nodes, j.placement,
         j.nice, j.time_limit_s, j.requeueable, j.array_job_id is not None, j.comment)
        for j in cluster.jobs
    )
    # the base state and whether it schedules; flags such as PLANNED (backfill) come and go
    nodes = sorted((n.name, n.gpus, n.gpus_alloc, n.cpus, n.state.split("+")[0], n.available, n.features,
                    n.partitions) for n in cluster.nodes)
    return jobs, nodes, cluster.topology.leaves, len(cluster.site_factors)


def test_each_version_reads_into_the_same_snapshot():
    reference = comparable("22.05")
    jobs, nodes, leaves, _ = reference
    assert [j[0] for j in jobs] == ["niced", "placed", "requeued", "sweep", "wide"] and leaves == ("s1", "s2")
    by_name = {j[0]: j for j in jobs}
    assert by_name["wide"][2:5] == (JobState.RUNNING, 16, 2) and by_name["wide"][8] == ("n1", "n2")
    placed = by_name["placed"][9]
    assert (placed.max_switches, placed.switches_wait_s, placed.features, placed.exclude_nodes) == (
        1, 300, "leaf_s1", ("n3",))
    assert by_name["niced"][10] == 100 and by_name["requeued"][2] is JobState.PENDING
    assert ("n4", 8, 0, 16, "IDLE", False, ("leaf_s2",), ("gpu",)) in nodes
    assert ("n1", 8, 8, 16, "MIXED", True, ("leaf_s1",), ("gpu",)) in nodes
    for version in VERSIONS[1:]:
        assert comparable(version) == reference, version


@pytest.mark.parametrize("version", VERSIONS)
def test_sacct_json_reads_like_sacct_text(version):
    result = read_sacct_json(fixture(version, "sacct.json"), f"slurm-{version}/sacct.json")
    assert result.skipped == {} and result.rows == len(result.records)
    # `sacct -X --duplicates -o JobIDRaw,State` of the same window: same runs, same states
    rows = [line.split("|") for line in fixture(version, "sacct.txt").splitlines() if line]
    assert sorted((r.job_id, r.state_text.split()[0]) for r in result.records) == sorted(
        (int(job_id), state.split()[0]) for job_id, state in rows)
    names = {r.name: r for r in result.records}
    requeued = sorted((r for r in result.records if r.name == "requeued"), key=lambda r: r.submit or 0)
    assert [r.state for r in requeued] == [JobState.REQUEUED, JobState.PENDING]  # both runs (--duplicates)
    assert requeued[0].ran and requeued[0].gpus == 4
    sweep = names["sweep"]
    assert sweep.display_id == f"{sweep.job_id}_[0-2]"  # "0x7" read as the tasks 0-2
    assert names["wide"].gpus == 16 and names["wide"].nodes == ("n1", "n2")


def test_the_state_and_array_adapters():
    assert job_base_state("RUNNING") == "RUNNING"
    assert job_base_state(["PENDING", "REQUEUED"]) == "PENDING"
    assert job_base_state(["COMPLETING", "RUNNING"]) == "RUNNING"
    for bad in (["RUNNING", "NEW_FLAG"], "WAITING", [], "", None, 5):
        with pytest.raises(ValueError):
            job_base_state(bad)
    assert sacct_state_text(["PENDING", "REQUEUED"]) == "REQUEUED"
    assert sacct_state_text(["CANCELLED"]) == "CANCELLED" and sacct_state_text("CANCELLED by 0") == "CANCELLED by 0"
    assert [array_task_text(t) for t in ("0x7", "0x5", "0x1", "0x0", "0xA0F", "1-3", "0xzz", None)] == [
        "0-2", "0,2", "0", "", "0-3,9,11", "1-3", "0xzz", ""]


# ---------------------------------------------------------------- never a silent empty read


def modern(version: str = "24.11", **changes) -> str:
    document = json.loads(fixture(version, "squeue.json"))
    document.update(changes)
    return json.dumps(document)


def test_an_unknown_format_version_is_one_clear_error():
    document = json.loads(fixture("24.11", "squeue.json"))
    document["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.99"
    with pytest.raises(FormatError) as error:
        read("24.11", squeue_json=json.dumps(document))
    message = str(error.value)
    assert message.startswith("squeue --json: Slurm 24.11.5 printed JSON format 'data_parser/v0.0.99'")
    assert "\n" not in message and "v0.0.42" in message


def test_no_meta_block_is_an_error_not_a_guess():
    with pytest.raises(FormatError, match=r'^squeue --json: no "meta" block'):
        read("22.05", squeue_json=json.dumps({"jobs": []}))


def test_a_missing_list_is_an_error():
    with pytest.raises(FormatError, match=r"^squeue --json: no 'jobs' list at the top level of its JSON \(it has: "):
        read("24.11", squeue_json=modern(jobs=None))
    # 24.11's grouped sinfo in place of the per-node list: named, not read as zero nodes
    with pytest.raises(FormatError, match=r"^scontrol show nodes --json: no 'nodes' list .*sinfo"):
        read("24.11", scontrol_show_nodes_json=fixture("24.11", "sinfo.json"))


def _unknown_state(jobs: list) -> None:
    jobs[0]["job_state"] = ["RUNNING", "WARPED"]


@pytest.mark.parametrize("spoil, reason", [
    (_unknown_state, "unknown job state 'WARPED'"),
    (lambda jobs: jobs.append(jobs[0]), "job id listed twice"),
])
def test_a_job_that_cannot_be_read_stops_the_read_and_says_how_many(spoil, reason):
    document = json.loads(fixture("24.11", "squeue.json"))
    spoil(document["jobs"])
    with pytest.raises(FormatError) as error:
        read("24.11", squeue_json=json.dumps(document))
    printed = len(document["jobs"])
    assert str(error.value) == (
        f"squeue --json: Slurm printed {printed} jobs but only {printed - 1} could be read "
        f"(1 x {reason}); nothing is written this cycle")


def test_22_05_state_words_in_a_24_11_list_are_read_too():
    # v0.0.38 prints one word; if a site's plugin prints "RUNNING" in a list, that is the same job
    document = json.loads(fixture("22.05", "squeue.json"))
    for job in document["jobs"]:
        job["job_state"] = [job["job_state"]]
    cluster, _, _ = read("22.05", squeue_json=json.dumps(document))
    assert {j.job_id: j.state.value for j in cluster.jobs} == squeue_text("22.05")


def test_no_nodes_is_an_error():
    document = json.loads(fixture("22.05", "sinfo.json"))
    document["nodes"] = []
    with pytest.raises(FormatError, match=r"^sinfo --json: Slurm printed no nodes$"):
        read("22.05", sinfo_json=json.dumps(document))


def test_squeue_and_the_node_list_in_two_formats_is_an_error():
    with pytest.raises(FormatError, match="another JSON format than squeue --json"):
        read("22.05", sinfo_json=fixture("24.11", "scontrol-show-nodes.json"))


# ---------------------------------------------------------------- the engine: one line, no writes


STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> {log}
case "$(basename "$0") $1 $2" in
  "squeue --json "*) cat {dir}/squeue.json ;;
  "squeue -h"*) cat {fixtures}/squeue-O.txt ;;
  "sinfo --json "*) cat {fixtures}/sinfo.json ;;
  "scontrol show nodes") cat {fixtures}/scontrol-show-nodes.json ;;
  "sprio -h"*) cat {fixtures}/sprio.txt ;;
  "sacct --allusers"*) ;;
  "scontrol show topology") cat {fixtures}/topology.txt ;;
  "scontrol show config") cat {fixtures}/scontrol-show-config.txt ;;
  "scontrol show partition") cat {fixtures}/scontrol-show-partition.txt ;;
  "sacctmgr -nP show") cat {fixtures}/sacctmgr-show-qos.txt ;;
  "scontrol update"*) exit 0 ;;
  *) echo "unexpected: $0 $*" >&2; exit 1 ;;
esac
"""


def run_engine(tmp_path: Path, version: str, squeue_json: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "squeue.json").write_text(squeue_json)
    log = tmp_path / "calls.log"
    for name in ("squeue", "sinfo", "sprio", "sacct", "scontrol", "sacctmgr"):
        script = bin_dir / name
        script.write_text(STUB.format(log=log, dir=tmp_path, fixtures=FIXTURES / f"slurm-{version}"))
        script.chmod(0o755)
    config = tmp_path / "dike.toml"
    config.write_text(f'[engine]\nstate_db = "{tmp_path}/state/state.sqlite"\n[slurm]\nbin_dir = "{bin_dir}"\n'
                      '[policies.dike]\nthresholds_gpuh = [0.02, 0.2]\n')
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "DIKE_CONFIG": str(config)}
    result = in_process.dike_slurm("run", "--once", "--apply", env=env, cwd=tmp_path)
    return result, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("version", ["24.11", "26.05"])
def test_a_cycle_on_newer_slurm_reads_every_job_and_writes(tmp_path, version):
    result, calls = run_engine(tmp_path, version, fixture(version, "squeue.json"))
    assert result.returncode == 0, result.stderr
    assert "scontrol show nodes --json" in calls and not any(c.startswith("sinfo") for c in calls)
    assert any(c.startswith("scontrol update") for c in calls), result.stdout
    assert f"{len(squeue_text(version))} jobs in scope" in result.stdout, result.stdout


def test_an_unknown_format_stops_the_cycle_in_one_line_before_any_write(tmp_path):
    document = json.loads(fixture("24.11", "squeue.json"))
    document["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.99"
    result, calls = run_engine(tmp_path, "24.11", json.dumps(document))
    assert result.returncode in (1, 2) and "Traceback" not in result.stderr
    # the stub refuses the lean squeue -O (one warning line), so the JSON is read: its error is one line
    lines = [line for line in result.stderr.strip().splitlines() if "squeue -O refused" not in line]
    assert len(lines) == 1 and "squeue --json" in lines[0] and "v0.0.99" in lines[0], result.stderr
    assert calls and not any(c.startswith("scontrol update") for c in calls)
    assert not any(c.startswith("scontrol show nodes") for c in calls)  # stopped at the first read
