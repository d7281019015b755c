"""Tests of the synthetic workload generator (sim/tracegen/generate.py, sacct_writer.py, synthetic_cluster.py),
read back by the replay's reader."""

from __future__ import annotations

import io
import re
import shlex
from dataclasses import replace
from pathlib import Path

import hostlist
import pytest
import in_process

from dike_slurm.slurm.accounting import read_sacct_parsable2
from dike_slurm.slurm.accounting_json import read_sacct_file
from dike_slurm.domain.model import JobState
from dike_slurm.parsing.durations import format_duration, parse_duration, parse_timestamp
from dike_slurm.sim.tracegen import generate as tracegen
from dike_slurm.sim.tracegen.sacct_writer import (
    SACCT_COMMAND,
    SACCT_FIELDS,
    TIMELIMIT_PARTITION,
    TIMELIMIT_UNLIMITED,
    SacctRecord,
    format_mem,
    format_timelimit,
    tres_text,
    write_sacct_parsable2,
)
from dike_slurm.sim.tracegen.synthetic_cluster import ClusterSpec, write_slurm_conf, write_topology_conf
from dike_slurm.sim.eval.stats import trace_stats
from dike_slurm.sim.tracegen.workload_model import WorkloadModel

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "examples" / "sample"

HEADER = ("JobID|JobIDRaw|JobName|User|Account|Partition|QOS|State|Submit|Eligible|"
          "Start|End|Elapsed|ElapsedRaw|Timelimit|NNodes|NCPUS|NodeList|ReqTRES|"
          "AllocTRES|Priority|Flags")
TIME_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$")
ELAPSED_RE = re.compile(r"^(\d+-)?\d\d:[0-5]\d:[0-5]\d$")
STATE_RE = re.compile(r"^(COMPLETED|FAILED|TIMEOUT|NODE_FAIL|REQUEUED|CANCELLED by \d+)$")


def _dump(n_jobs: int, seed: int, cluster: ClusterSpec | None = None,
          model: WorkloadModel | None = None) -> str:
    buf = io.StringIO()
    write_sacct_parsable2(
        tracegen.generate_jobs(model or WorkloadModel(), n_jobs,
                               cluster or ClusterSpec(), seed), buf)
    return buf.getvalue()


def _stats(text: str, total_gpus: int | None = None) -> dict:
    """The statistics `dike-slurm trace stats` prints, through the replay's reader."""
    read = read_sacct_parsable2(text, "generated")
    assert read.skipped == {} and read.rows == len(read.records)
    return trace_stats(read, total_gpus=total_gpus)


def _rows(text: str) -> list[dict[str, str]]:
    lines = text.split("\n")
    assert lines[-1] == "", "output must end with a newline"
    header = lines[0].split("|")
    return [dict(zip(header, line.split("|"))) for line in lines[1:-1]]


@pytest.fixture(scope="module")
def dump5k() -> str:
    return _dump(5000, seed=3)


@pytest.fixture(scope="module")
def rows5k(dump5k: str) -> list[dict[str, str]]:
    return _rows(dump5k)


# ----------------------------------------------------------------------------- format


def test_same_seed_same_bytes_different_seed_differs():
    a = _dump(800, seed=42)
    b = _dump(800, seed=42)
    c = _dump(800, seed=43)
    assert a == b
    assert a != c


def test_header_is_exactly_the_documented_columns(dump5k):
    assert dump5k.split("\n", 1)[0] == HEADER
    assert "|".join(SACCT_FIELDS) == HEADER
    assert SACCT_COMMAND.endswith("--format=" + HEADER.replace("|", ","))
    assert "--parsable2" in SACCT_COMMAND


def test_every_row_has_the_same_number_of_fields(dump5k):
    lines = dump5k.split("\n")[:-1]
    counts = {line.count("|") for line in lines}
    assert counts == {len(SACCT_FIELDS) - 1}
    assert not any(line.endswith("|Flags|") for line in lines)  # parsable2: no trailing |


def test_n_jobs_is_the_number_of_distinct_raw_ids(rows5k):
    assert len({r["JobIDRaw"] for r in rows5k}) == 5000
    raws = [int(r["JobIDRaw"]) for r in rows5k]
    assert raws == sorted(raws), "sacct prints rows ordered by job id"


def test_field_formats(rows5k):
    for r in rows5k:
        for col in ("Submit", "Eligible", "Start", "End"):
            assert TIME_RE.match(r[col]), (col, r[col])
        assert r["Submit"] <= r["Eligible"] <= r["Start"] <= r["End"]
        assert ELAPSED_RE.match(r["Elapsed"]), r["Elapsed"]
        assert format_duration(int(r["ElapsedRaw"])) == r["Elapsed"]
        assert STATE_RE.match(r["State"]), r["State"]
        assert r["Timelimit"] in ("UNLIMITED", "Partition_Limit") or ELAPSED_RE.match(
            r["Timelimit"])
        assert r["Partition"] == "gpu" and r["QOS"] == "normal"
        assert r["Flags"] in ("", "SchedSubmit", "SchedMain", "SchedBackfill")
        assert int(r["Priority"]) > 0


def test_timestamps_are_consistent_with_elapsed(rows5k):
    from datetime import datetime
    for r in rows5k:
        start = datetime.fromisoformat(r["Start"])
        end = datetime.fromisoformat(r["End"])
        assert (end - start).total_seconds() == int(r["ElapsedRaw"])


def test_tres_strings_are_sorted_and_typed(rows5k):
    typed = 0
    for r in rows5k:
        for col in ("ReqTRES", "AllocTRES"):
            if not r[col]:
                continue
            items = r[col].split(",")
            assert items == sorted(items)
            keys = [i.split("=")[0] for i in items]
            assert {"billing", "cpu", "mem", "node"} <= set(keys)
            assert re.fullmatch(r"\d+[MGT]", dict(i.split("=") for i in items)["mem"])
        alloc = dict(i.split("=") for i in r["AllocTRES"].split(",")) if r["AllocTRES"] else {}
        if "gres/gpu" in alloc:
            # typed GPUs are accounted (AccountingStorageTRES=gres/gpu,gres/gpu:a100)
            assert alloc["gres/gpu:a100"] == alloc["gres/gpu"]
            assert int(alloc["cpu"]) == int(r["NCPUS"])
            assert int(alloc["node"]) == int(r["NNodes"])
        if "gres/gpu:a100=" in r["ReqTRES"]:
            typed += 1
    assert typed > 0


def test_examples_of_the_documented_format():
    assert format_timelimit(60) == "01:00:00"
    assert format_timelimit(1440) == "1-00:00:00"
    assert format_timelimit(TIMELIMIT_UNLIMITED) == "UNLIMITED"
    assert format_timelimit(TIMELIMIT_PARTITION) == "Partition_Limit"
    assert format_mem(32768) == "32G"
    assert format_mem(512000) == "500G"
    assert format_mem(64000) == "64000M"
    assert tres_text(8, 32768, 1, 4, "a100") == \
        "billing=8,cpu=8,gres/gpu:a100=4,gres/gpu=4,mem=32G,node=1"
    assert tres_text(8, 32768, 1, 4, None) == "billing=8,cpu=8,gres/gpu=4,mem=32G,node=1"


def test_unknown_times_and_refused_pipe():
    rec = SacctRecord(
        "7", 7, "pending", "u", "a", "gpu", "normal", "PENDING", 0, 0, None, None, 0,
        60, 1, 0, "None assigned", "billing=1,cpu=1,mem=1G,node=1", "", 1, "", 0)
    buf = io.StringIO()
    assert write_sacct_parsable2([rec], buf) == 1
    row = _rows(buf.getvalue())[0]
    assert row["Submit"] == "1970-01-01T00:00:00"
    assert row["Start"] == "Unknown" and row["End"] == "Unknown"
    with pytest.raises(ValueError):
        write_sacct_parsable2([rec._replace(job_name="a|b")], io.StringIO())
    with pytest.raises(ValueError):
        write_sacct_parsable2([rec._replace(job_name="a\nb")], io.StringIO())


# ----------------------------------------------------------------------------- quirks


def test_cancelled_before_start_rows(rows5k):
    pending = [r for r in rows5k if r["NodeList"] == "None assigned"]
    assert pending
    for r in pending:
        assert r["State"].startswith("CANCELLED by ")
        assert r["Start"] == r["End"] and r["ElapsedRaw"] == "0"
        assert r["AllocTRES"] == "" and r["NCPUS"] == "0" and r["Flags"] == ""
        req = dict(i.split("=") for i in r["ReqTRES"].split(","))
        assert r["NNodes"] == req["node"]
    assert any(r["Timelimit"] == "Partition_Limit" for r in pending)
    # Partition_Limit only ever shows on jobs that never started
    assert all(r["NodeList"] == "None assigned"
               for r in rows5k if r["Timelimit"] == "Partition_Limit")


def test_requeued_jobs_have_two_records(rows5k):
    by_raw: dict[str, list[dict[str, str]]] = {}
    for r in rows5k:
        by_raw.setdefault(r["JobIDRaw"], []).append(r)
    requeued = [v for v in by_raw.values() if len(v) > 1]
    assert requeued
    for first, last in requeued:
        assert first["State"] == "REQUEUED" and last["State"] != "REQUEUED"
        assert first["JobID"] == last["JobID"]
        assert last["Submit"] > first["Submit"] and last["Submit"] >= first["End"]
        assert last["Start"] >= first["End"]
    assert sum(r["State"] == "REQUEUED" for r in rows5k) == len(requeued)


def test_requeue_duplicates_can_be_switched_off():
    model = replace(WorkloadModel(), emit_requeue_duplicates=False)
    rows = _rows(_dump(3000, seed=3, model=model))
    full = _rows(_dump(3000, seed=3))
    assert not any(r["State"] == "REQUEUED" for r in rows)
    assert rows == [r for r in full if r["State"] != "REQUEUED"]


def test_array_tasks(rows5k):
    tasks = [r for r in rows5k if "_" in r["JobID"]]
    assert tasks
    arrays: dict[str, list[dict[str, str]]] = {}
    for r in tasks:
        arrays.setdefault(r["JobID"].split("_")[0], []).append(r)
    for array_id, members in arrays.items():
        # a requeued task has two rows with the same JobID and JobIDRaw
        idx = sorted({int(m["JobID"].split("_")[1]) for m in members})
        assert idx == list(range(len(idx)))
        raws = {int(m["JobIDRaw"]) for m in members}
        assert int(array_id) in raws  # the array's own id is one task's raw id
        assert len(raws) == len(idx)
        assert len({(m["JobID"], m["JobIDRaw"]) for m in members}) == len(idx)
        assert len({m["JobName"] for m in members}) == 1
        first_rows = {}
        for m in members:  # a requeued task's final run has a new Submit
            first_rows.setdefault(m["JobID"], m)
        assert len({m["Submit"] for m in first_rows.values()}) == 1


def test_cpu_only_jobs_and_hostile_names(rows5k):
    cpu_only = [r for r in rows5k if "gres/gpu" not in r["ReqTRES"]]
    assert cpu_only and all(r["Partition"] == "gpu" for r in cpu_only)
    names = {r["JobName"] for r in rows5k}
    assert {"exp;rm -rf /", "$(shutdown -h now)", "résumé_модель_模型",
            "<script>alert(1)</script>"} <= names
    assert not any("|" in n or "\n" in n for n in names)


# ----------------------------------------------------------------------------- workload shape


def test_the_replay_reader_reads_every_row_as_written(dump5k, rows5k):
    read = read_sacct_parsable2(dump5k, "generated")
    assert read.skipped == {} and read.rows == len(rows5k) == len(read.records)
    for record, row in zip(read.records, rows5k):
        assert record.job_id == int(row["JobIDRaw"]) and record.display_id == row["JobID"]
        assert (record.name, record.user, record.account) == (row["JobName"], row["User"], row["Account"])
        assert record.state_text == row["State"] and record.state is not JobState.OTHER
        assert record.submit == parse_timestamp(row["Submit"]) and record.end == parse_timestamp(row["End"])
        assert record.elapsed_s == int(row["ElapsedRaw"])
        assert record.time_limit_s == parse_duration(row["Timelimit"])
        assert record.num_nodes == int(row["NNodes"])
        assert record.nodes == tuple(hostlist.expand_hostlist(row["NodeList"])) or row["NodeList"] == "None assigned"
        assert record.ran == bool(row["AllocTRES"])
        gpus = re.search(r"gres/gpu=(\d+)", row["AllocTRES"] or row["ReqTRES"])
        assert record.gpus == (int(gpus.group(1)) if gpus else 0)


def test_gpu_size_mix_and_heavy_tail(dump5k, rows5k):
    stats = _stats(dump5k, total_gpus=128)
    assert stats["jobs"] == 5000
    assert stats["one_gpu_job_share"] > 0.5
    assert stats["multi_node_gpu_hour_share"] > 0.35
    assert stats["run_time_hours"]["p99"] > 20 * stats["run_time_hours"]["p50"]
    assert stats["users"] >= 20
    sizes = {}
    for r in rows5k:
        m = re.search(r"gres/gpu=(\d+)", r["ReqTRES"])
        if m and r["State"] != "REQUEUED":
            g = int(m.group(1))
            sizes[g] = sizes.get(g, 0) + 1
    assert {1, 2, 4, 8, 16, 32, 64} <= set(sizes)
    assert sizes[1] > sizes[2] > sizes[16] > sizes[64]
    # larger jobs run longer
    def median_runtime(pred):
        v = sorted(int(r["ElapsedRaw"]) for r in rows5k
                   if r["AllocTRES"] and pred(int(r["NNodes"])))
        return v[len(v) // 2]
    assert median_runtime(lambda n: n > 1) > median_runtime(lambda n: n == 1)


def test_users_have_unequal_demand(rows5k):
    per_user: dict[str, int] = {}
    for r in rows5k:
        per_user[r["User"]] = per_user.get(r["User"], 0) + 1
    counts = sorted(per_user.values(), reverse=True)
    assert counts[0] > 5 * counts[len(counts) // 2]


def test_offered_load_follows_target():
    cluster = ClusterSpec()
    loads = []
    for seed in (1, 2, 3, 4):
        loads.append(_stats(_dump(4000, seed, cluster), total_gpus=cluster.total_gpus)["offered_load"])
    mean = sum(loads) / len(loads)
    assert 0.75 < mean < 1.3, loads
    half = replace(WorkloadModel(), target_load=0.5)
    stats = _stats(_dump(4000, 1, cluster, half), total_gpus=cluster.total_gpus)
    assert stats["submit_span_days"] > 1.5 * _stats(_dump(4000, 1, cluster))["submit_span_days"]


# ----------------------------------------------------------------------------- cluster files


def _conf_nodes(slurm_conf: str) -> set[str]:
    nodes: set[str] = set()
    for line in slurm_conf.splitlines():
        if line.startswith("NodeName="):
            spec = line.split()[0].split("=", 1)[1]
            nodes.update(hostlist.expand_hostlist(spec))
    return nodes


def _leaf_nodes(topology_conf: str) -> list[str]:
    out: list[str] = []
    for line in topology_conf.splitlines():
        if line.startswith("SwitchName=") and " Nodes=" in line:
            out.extend(hostlist.expand_hostlist(line.split(" Nodes=")[1].split()[0]))
    return out


def _files(cluster: ClusterSpec) -> tuple[str, str]:
    a, b = io.StringIO(), io.StringIO()
    write_slurm_conf(cluster, a)
    write_topology_conf(cluster, b)
    return a.getvalue(), b.getvalue()


@pytest.mark.parametrize("cluster", [
    ClusterSpec(),
    ClusterSpec(nodes=10, nodes_per_leaf=4, gpus_per_node=4),
    ClusterSpec.benchmark(),
], ids=["sample", "partial-leaf", "benchmark"])
def test_topology_covers_every_node_once(cluster):
    slurm_conf, topo = _files(cluster)
    conf_nodes = _conf_nodes(slurm_conf)
    leaves = _leaf_nodes(topo)
    assert len(conf_nodes) == cluster.nodes
    assert sorted(leaves) == sorted(conf_nodes)
    assert len(leaves) == len(set(leaves))
    assert f"Gres=gpu:{cluster.gpu_type}:{cluster.gpus_per_node}" in slurm_conf
    assert "TopologyPlugin=topology/tree" in slurm_conf
    assert "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP" in slurm_conf
    # every switch but the top one has exactly one parent
    parents: dict[str, int] = {}
    names = []
    for line in topo.splitlines():
        if line.startswith("SwitchName="):
            names.append(line.split()[0].split("=", 1)[1])
            if " Switches=" in line:
                for child in hostlist.expand_hostlist(line.split(" Switches=")[1]):
                    parents[child] = parents.get(child, 0) + 1
    tops = [n for n in names if n not in parents]
    assert len(tops) == 1
    assert all(v == 1 for v in parents.values())
    assert set(parents) | set(tops) == set(names)


def test_benchmark_cluster_has_four_switch_levels():
    c = ClusterSpec.benchmark()
    assert c.nodes == 2000 and c.total_gpus == 16000
    levels = c.switch_tree()
    assert [len(level) for level in levels] == [100, 20, 4, 1]
    with pytest.raises(ValueError):
        ClusterSpec(nodes=2000, nodes_per_leaf=20, switch_fanout=5, switch_levels=5)


def test_nodelist_hosts_exist_in_slurm_conf(rows5k):
    slurm_conf, _ = _files(ClusterSpec())
    conf_nodes = _conf_nodes(slurm_conf)
    for r in rows5k:
        if r["NodeList"] == "None assigned":
            continue
        hosts = hostlist.expand_hostlist(r["NodeList"])
        assert len(hosts) == int(r["NNodes"]) == len(set(hosts))
        assert set(hosts) <= conf_nodes
        assert hostlist.collect_hostlist(hosts) == r["NodeList"]


_UNITS = {"M": 1, "G": 1024, "T": 1024 ** 2}


@pytest.mark.parametrize("cluster", [
    ClusterSpec(nodes=3, gpus_per_node=4, nodes_per_leaf=2),
    ClusterSpec(nodes=5, gpus_per_node=3, nodes_per_leaf=2),
    ClusterSpec(nodes=4, gpus_per_node=8, cpus_per_node=2, real_memory_mb=1000,
                         nodes_per_leaf=2),
], ids=["3x4", "5x3", "few-cpus-tiny-memory"])
def test_jobs_never_exceed_the_cluster(cluster):
    rows = _rows(_dump(2000, seed=5, cluster=cluster))
    assert len({r["JobIDRaw"] for r in rows}) == 2000
    for r in rows:
        req = dict(i.split("=") for i in r["ReqTRES"].split(","))
        g = int(req.get("gres/gpu", 0))
        n = int(r["NNodes"])
        assert g <= cluster.gpus_per_node * n <= cluster.total_gpus
        if g > cluster.gpus_per_node:
            assert g % cluster.gpus_per_node == 0
        assert int(req["cpu"]) <= cluster.cpus_per_node * n
        mem = int(req["mem"][:-1]) * _UNITS[req["mem"][-1]]
        assert mem <= cluster.real_memory_mb * n


# ----------------------------------------------------------------------------- bundled sample


def _documented_command() -> list[str]:
    readme = (SAMPLE / "README.md").read_text(encoding="utf-8")
    lines = [l.strip() for l in readme.splitlines()
             if l.strip().startswith("dike-slurm trace generate ")]
    assert len(lines) == 1, "README.md must give exactly one regeneration command"
    argv = shlex.split(lines[0])[1:]
    assert "--out" in argv
    return argv


def test_bundled_sample_is_what_the_documented_command_writes(tmp_path):
    argv = _documented_command()
    argv[argv.index("--out") + 1] = str(tmp_path)
    result = in_process.dike_slurm(*argv, cwd=REPO)
    assert result.returncode == 0, result.stderr
    for name in ("sacct.txt", "slurm.conf", "topology.conf"):
        assert (tmp_path / name).read_bytes() == (SAMPLE / name).read_bytes(), name


def test_bundled_sample_shape():
    stats = trace_stats(read_sacct_file(SAMPLE / "sacct.txt"), total_gpus=128)
    assert stats["skipped_rows"] == {}
    assert 2000 <= stats["jobs"] <= 3000
    assert 7 <= stats["submit_span_days"] <= 10
    assert 0.9 <= stats["offered_load"] <= 1.1
    text = (SAMPLE / "sacct.txt").read_text(encoding="utf-8")
    for needle in ("|REQUEUED|", "|None assigned|", "|UNLIMITED|", "|Partition_Limit|",
                   "gres/gpu:a100=", "exp;rm -rf /", "$(shutdown -h now)", "résumé",
                   "|NODE_FAIL|", "|TIMEOUT|", "|FAILED|"):
        assert needle in text, needle
    assert re.search(r"^\d+_\d+\|", text, re.M)  # array tasks
    assert re.search(r"\|billing=\d+,cpu=\d+,mem=\d+[MG],node=1\|", text)  # CPU-only jobs


# ----------------------------------------------------------------------------- shuffled twins

from hypothesis import given, strategies as st  # noqa: E402

from dike_slurm.sim.kernel.trace import TraceJob  # noqa: E402
from dike_slurm.sim.tracegen.shuffle import shuffle_identities  # noqa: E402


@given(st.lists(st.tuples(st.sampled_from(["u1", "u2", "u3"]), st.sampled_from(["a.sh", "b.sh", "c"]),
                          st.integers(1, 8), st.floats(1, 1e5)), max_size=30),
       st.integers(0, 10))
def test_a_shuffled_twin_moves_users_and_names_across_jobs_and_keeps_everything_else(rows, seed):
    """Invented jobs. The twin has the same jobs in the same order with the same asks and run times;
    the (user, account) pairs and the names are the originals', each permuted; the same seed gives
    the same twin."""
    jobs = tuple(
        TraceJob(job_id=i, display_id=str(i), user=user, account=f"acct-{user}", partition="gpu", qos="normal",
                 name=name, comment=f"c{i}", submit=float(i), eligible_delay_s=0.0, duration_s=duration,
                 time_limit_s=None, gpus=gpus, num_nodes=1, cpus=gpus)
        for i, (user, name, gpus, duration) in enumerate(rows))
    twin = shuffle_identities(jobs, seed)
    assert [replace(t, user=j.user, account=j.account, name=j.name) for t, j in zip(twin, jobs)] == list(jobs)
    assert sorted((t.user, t.account) for t in twin) == sorted((j.user, j.account) for j in jobs)
    assert all(t.account == f"acct-{t.user}" for t in twin)  # a user keeps its account
    assert sorted(t.name for t in twin) == sorted(j.name for j in jobs)
    assert shuffle_identities(jobs, seed) == twin
