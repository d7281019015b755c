"""GPU types (issue 33): a job's typed request and each node's type, read from every backend and
from sacct dumps, on what real Slurm printed on the two-type lab (tests/fixtures/gpu-types-VERSION:
n1 and n3 carry a100, n2 and n4 v100), and the simulator placing by type."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dike_slurm.slurm.accounting import read_sacct_parsable2
from dike_slurm.slurm.accounting_json import read_sacct_json
from dike_slurm.slurm.backends.base import ClusterState
from dike_slurm.slurm.backends.squeue_format import read_jobs, read_nodes
from dike_slurm.slurm.backends.squeue_json import job_from_squeue, node_from_sinfo
from dike_slurm.domain.model import Job, JobState, Node, Placement, Topology, constraint_gpu_types, may_use_gpus
from dike_slurm.slurm.slurm_conf import parse_slurm_conf
from dike_slurm.parsing.tres import parse_gres_gpu_types
from dike_slurm.sim.kernel.cluster import WrongGpuType
from dike_slurm.sim.kernel.trace import EXCLUDED_NO_GPU_TYPE, NOTE_TYPES_IGNORED, build_trace

from test_sim import job as trace_job
from test_sim import simulate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
VERSIONS = tuple(sorted(p.name.removeprefix("gpu-types-") for p in FIXTURES.glob("gpu-types-*")))
TOKEN = "^f00dcafe"

# What each recorded job asked for (its name -> the GPU types it may use); the README of each
# fixture folder names the sbatch options.
ASKED = {
    "typed-finished": ("a100",),
    "a100-running": ("a100",),
    "v100-running": ("v100",),
    "untyped-running": (),
    "feature-running": ("v100",),
    "a100-blocked": ("a100",),
    "either-blocked": ("a100", "v100"),
}
NODE_TYPES = {"n1": ("a100",), "n2": ("v100",), "n3": ("a100",), "n4": ("v100",)}


def test_versions_recorded():
    assert VERSIONS == ("22.05", "24.11", "26.05")


@pytest.mark.parametrize(
    "text, types",
    [
        ("gpu:a100:8", ("a100",)), ("gres:gpu:a100:8", ("a100",)), ("gres/gpu:a100:6", ("a100",)),
        ("gpu:8", ()), ("gres/gpu:8", ()), ("gpu:a100", ("a100",)), ("gpu:a100:8(S:0-1)", ("a100",)),
        ("gpu:a100:6(IDX:0-5)", ("a100",)), ("gpu:a100:8,gpu:v100:2", ("a100", "v100")), ("mps:100", ()),
        ("gpu", ()), ("", ()), ("gres/gpu:V100M16:1", ("V100M16",)), ("gpu:a100:2,mps:100,gpu:a100:1", ("a100",)),
    ],
)
def test_gres_types(text, types):
    assert parse_gres_gpu_types(text) == types


@pytest.mark.parametrize(
    "constraint, types",
    [
        ("a100", ("a100",)), ("a100|v100", ("a100", "v100")), ("v100&leaf_s1", ("v100",)),
        ("[a100|v100]", ("a100", "v100")), ("leaf_s1", ()), ("a100|leaf_s1", ()), ("", ()), ("a100*2", ("a100",)),
    ],
)
def test_constraint_types(constraint, types):
    assert constraint_gpu_types(constraint, frozenset({"a100", "v100"})) == types


def test_a_job_without_types_may_use_any_node_and_a_typed_one_only_its_types():
    assert may_use_gpus((), ("v100",)) and may_use_gpus((), ())
    assert may_use_gpus(("a100", "v100"), ("v100",))
    assert not may_use_gpus(("a100",), ("v100",))
    assert not may_use_gpus(("a100",), ())


def _fixture(version: str, name: str) -> str:
    return (FIXTURES / f"gpu-types-{version}" / name).read_text()


def _listed_jobs(version: str) -> dict[int, tuple[str, str, str]]:
    """squeue.txt: job id -> (state, tres_per_node as squeue -o %b prints it, features)."""
    out = {}
    for line in _fixture(version, "squeue.txt").splitlines():
        parts = line.split("|")  # the features may hold a `|` of their own
        out[int(parts[0])] = (parts[1], parts[2], "|".join(parts[3:-1]))
    return out


def _json_cluster(version: str) -> ClusterState:
    queue = json.loads(_fixture(version, "squeue.json"))
    jobs = tuple(job_from_squeue(entry, {}) for entry in queue["jobs"])
    nodes = tuple(node_from_sinfo(entry) for entry in json.loads(_fixture(version, "nodes.json"))["nodes"])
    return ClusterState(0.0, tuple(j for j in jobs if j.state.is_active), nodes, Topology())


def _lean_cluster(version: str) -> ClusterState:
    lean = read_jobs(_fixture(version, "squeue-O.txt"), TOKEN, "squeue -O",
                     _fixture(version, "squeue-o-excluded.txt"), TOKEN, "squeue -o")
    nodes, _ = read_nodes(_fixture(version, "sinfo-N-O.txt"), TOKEN, "sinfo -N -O")
    return ClusterState(0.0, lean.jobs, tuple(nodes.values()), Topology())


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("read", [_json_cluster, _lean_cluster], ids=["json", "lean"])
def test_squeue_and_sinfo_give_each_job_its_asked_types_and_each_node_its_type(version, read):
    cluster = read(version)
    listed = _listed_jobs(version)
    assert {j.job_id for j in cluster.jobs} == set(listed)  # the finished job has left squeue
    for job in cluster.jobs:
        assert job.gpu_types == ASKED[job.name], job.name
        state, per_node, features = listed[job.job_id]
        # the plain listing agrees: a typed %b names the type, an untyped one with a type constraint
        assert parse_gres_gpu_types(per_node) == job.gpu_types or (
            not parse_gres_gpu_types(per_node) and features != "(null)" and job.gpu_types)
    assert {n.name: n.gpu_types for n in cluster.nodes} == NODE_TYPES
    # the untyped job ran on an a100 node, whose type its allocation names: still any type asked
    untyped = next(j for j in cluster.jobs if j.name == "untyped-running")
    assert untyped.gpu_types == () and untyped.state is JobState.RUNNING


@pytest.mark.parametrize("version", VERSIONS)
def test_the_lean_read_and_the_json_read_agree_on_types(version):
    assert {j.job_id: j.gpu_types for j in _lean_cluster(version).jobs} == {
        j.job_id: j.gpu_types for j in _json_cluster(version).jobs}


@pytest.mark.parametrize("version", VERSIONS)
def test_sacct_dumps_give_the_requested_types_and_the_constraint(version):
    parsable = read_sacct_parsable2(_fixture(version, "sacct.txt"), "sacct.txt")
    dumped = read_sacct_json(_fixture(version, "sacct.json"), "sacct.json")
    # `a100|v100` in the last of three free-text columns (JobName, Comment, Constraints) cannot be
    # told from a `|` in the comment: that row is skipped and counted; the JSON dump has it
    assert parsable.skipped == {"wrong number of fields": 1} and not dumped.skipped
    for result in (parsable, dumped):
        by_name = {r.name: r for r in result.records}
        assert set(by_name) == set(ASKED) - ({"either-blocked"} if result is parsable else set())
        for name, record in by_name.items():
            typed = ASKED[name] if name not in ("feature-running", "either-blocked") else ()
            assert record.gpu_types == typed, name  # ReqTRES: the untyped job's AllocTRES is typed
        assert by_name["feature-running"].constraints == "v100"
    assert {r.name: r for r in dumped.records}["either-blocked"].constraints == "a100|v100"


@pytest.mark.parametrize("version", VERSIONS)
def test_the_labs_slurm_conf_gives_node_types_and_the_trace_resolves_constraints(version):
    conf = parse_slurm_conf(_fixture(version, "slurm-conf-excerpt.txt"))
    assert {n.name: n.gpu_types for n in conf.nodes} == NODE_TYPES
    # every job of the recording as if it had ended after a minute (the finished one ran 0 s)
    records = [replace(r, start=r.start or r.submit, end=(r.start or r.submit) + 60, elapsed_s=60, state=JobState.COMPLETED)
               for r in read_sacct_json(_fixture(version, "sacct.json"), "sacct.json").records]
    built = build_trace(records, conf)
    assert {j.name: j.gpu_types for j in built.jobs} == ASKED  # the constraints resolved against the nodes' types


def test_a_typed_job_on_a_cluster_without_types_runs_anywhere_and_a_missing_type_is_excluded():
    untyped = parse_slurm_conf("NodeName=n[1-2] Gres=gpu:8 CPUs=8\nPartitionName=gpu Nodes=n[1-2] Default=YES\n")
    typed = parse_slurm_conf("NodeName=n1 Gres=gpu:v100:8 CPUs=8\nNodeName=n2 Gres=gpu:a100:8 CPUs=8\n"
                             "PartitionName=gpu Nodes=n[1-2] Default=YES\n")
    records = read_sacct_parsable2(_fixture("22.05", "sacct.txt"), "sacct.txt").records
    finished = [replace(r, elapsed_s=60) for r in records if r.name == "typed-finished"]
    built = build_trace(finished, untyped)
    assert built.jobs[0].gpu_types == () and built.notes == {NOTE_TYPES_IGNORED: 1}
    built = build_trace(finished, typed)
    assert built.jobs[0].gpu_types == ("a100",)
    h100 = [replace(r, gpu_types=("h100",)) for r in finished]
    assert build_trace(h100, typed).excluded == {EXCLUDED_NO_GPU_TYPE: 1}


def test_a_constraint_naming_no_gpu_type_leaves_the_job_untyped():
    nodes = (Node("n1", 8, gpu_types=("a100",), features=("leaf_s1", "a100")),)
    jobs = (Job(1, "u", JobState.PENDING, 0.0, gpus=1, placement=Placement(features="leaf_s1")),
            Job(2, "u", JobState.PENDING, 0.0, gpus=1, placement=Placement(features="a100")))
    cluster = ClusterState(0.0, jobs, nodes, Topology())
    assert [j.gpu_types for j in cluster.jobs] == [(), ("a100",)]


# ----------------------------------------------------------------------------- the simulator

TWO_TYPES = ("NodeName=n[1,3] Gres=gpu:a100:8 CPUs=64 Feature=a100\nNodeName=n[2,4] Gres=gpu:v100:8 CPUs=64 Feature=v100\n"
             "PartitionName=gpu Nodes=n[1-4] Default=YES MaxTime=INFINITE\n")
NODE_OF = {"n1": "a100", "n2": "v100", "n3": "a100", "n4": "v100"}


def typed_trace():
    """V100 jobs first, so that an untyped choice would put the A100 jobs on v100 nodes."""
    return [
        trace_job(1, 0, 8, 600, gpu_types=("v100",)),
        trace_job(2, 0, 8, 600, gpu_types=("v100",)),
        trace_job(3, 1, 8, 300, gpu_types=("a100",)),
        trace_job(4, 1, 16, 300, nodes=2, gpu_types=("a100",)),  # waits for both a100 nodes
        trace_job(5, 2, 4, 100),  # untyped: any node
        trace_job(6, 2, 4, 100, gpu_types=("a100", "v100")),
    ]


def test_the_simulator_places_typed_jobs_on_their_type_only():
    results, simulator = simulate(typed_trace(), conf=TWO_TYPES)
    assert set(results) == {1, 2, 3, 4, 5, 6}
    assert simulator.stats.typed_starts == 5  # every typed start was checked
    # job 1 and 2 fill n2 and n4; job 3 takes an a100 node, job 4 both a100 nodes after job 3
    assert results[4].start >= results[3].end
    assert results[3].wait_s == 0  # an a100 node was free: no wait behind the v100 jobs


def test_the_invariant_fails_the_replay_when_the_simulator_breaks_it(monkeypatch):
    from dike_slurm.sim.kernel.cluster import SimCluster

    def ignore_types(self, partition, placement, gpu_types=()):
        return self.partition_masks.get(partition, self.all_nodes)  # a simulator that forgot the types

    monkeypatch.setattr(SimCluster, "allowed_mask", ignore_types)
    with pytest.raises(WrongGpuType, match=r"job 3 asked for GPU types a100 and was started on n[24] \(v100\)"):
        simulate([trace_job(1, 0, 8, 600, gpu_types=("a100",)), trace_job(2, 0, 8, 600, gpu_types=("a100",)),
                  trace_job(3, 1, 8, 300, gpu_types=("a100",))], conf=TWO_TYPES)


def test_untyped_traces_replay_as_before_on_a_typed_cluster():
    untyped = [trace_job(i, i, 8, 100 + i) for i in range(1, 7)]
    typed_cluster, _ = simulate(untyped, conf=TWO_TYPES)
    plain, _ = simulate(untyped, conf=TWO_TYPES.replace("gpu:a100:8", "gpu:8").replace("gpu:v100:8", "gpu:8"))
    assert {k: (r.start, r.end) for k, r in typed_cluster.items()} == {k: (r.start, r.end) for k, r in plain.items()}


# ----------------------------------------------------------------------------- the policies

def typed_snapshot(jobs, alloc):
    """snapshots.snapshot on the two-type lab's nodes: n1, n3 a100; n2, n4 v100 (one of each per leaf)."""
    from snapshots import snapshot

    base = snapshot(jobs, alloc=alloc)
    nodes = tuple(replace(n, gpu_types=NODE_TYPES[n.name], features=(*n.features, NODE_TYPES[n.name][0]))
                  for n in base.nodes)
    return replace(base, nodes=nodes)


def _dike_params(**update):
    from dike_slurm.policies.dike import DikeParams

    return DikeParams(thresholds_gpuh=[1.0, 10.0], **{"steer_light_jobs": False, **update})


def test_a_blocked_a100_job_never_requeues_a_v100_job():
    import random

    from snapshots import pending, running

    from dike_slurm.policies.dike import DikePolicy

    hour = 3600.0
    params = _dike_params(preemption=True, min_runtime_s=600)
    full = {"n1": 8, "n2": 8, "n3": 8, "n4": 8}
    # the cheapest victims (level 2, just checkpointed) hold the v100 nodes; an a100 node holds a
    # dearer one (level 1, 15 minutes past its checkpoint)
    jobs = [
        running(10, "a", gpus=8, ran=11 * hour, node="n2", requeueable=True, gpu_types=("v100",)),
        running(11, "a", gpus=8, ran=11 * hour, node="n4", requeueable=True),  # untyped, on a v100 node
        running(12, "a", gpus=8, ran=900, node="n1", requeueable=True, attained_gpu_s=2 * 8 * hour),
        running(13, "b", gpus=8, ran=100 * hour, node="n3", requeueable=False),
        pending(1, "c", gpus=8, gpu_types=("a100",)),
    ]
    decisions = DikePolicy().decide(typed_snapshot(jobs, full), params, random.Random(0))
    assert [(r.job_id, r.for_job) for r in decisions.requeues] == [(12, 1)]  # the a100 node's job, not 10 or 11
    assert decisions.placement_of(1).placement == Placement(require_nodes=("n1",))
    # untyped, the same job takes the cheapest node whatever its type
    untyped = [*jobs[:4], pending(1, "c", gpus=8)]
    plain = DikePolicy().decide(typed_snapshot(untyped, full), params, random.Random(0))
    assert [r.job_id for r in plain.requeues] in ([10], [11])
    # no a100 victim at all: nobody is requeued for it, however cheap the v100 jobs are
    no_room = [*jobs[:2], replace(jobs[2], requeueable=False), *jobs[3:]]
    assert DikePolicy().decide(typed_snapshot(no_room, full), params, random.Random(0)).requeues == ()


def test_the_node_hold_holds_only_nodes_of_the_blocked_jobs_type():
    import random

    from snapshots import pending, running

    from dike_slurm.policies.dike import DikePolicy

    hour = 3600.0
    params = _dike_params(preemption=False, hold_nodes="blocked")
    # every node half busy; the v100 nodes' jobs are the youngest (likeliest to end first): an
    # untyped hold would take a v100 node, the a100 job's hold must take an a100 node
    jobs = [
        running(10, "a", gpus=4, ran=40 * hour, node="n1"), running(11, "a", gpus=4, ran=hour, node="n2"),
        running(12, "a", gpus=4, ran=40 * hour, node="n3"), running(13, "a", gpus=4, ran=hour, node="n4"),
        pending(1, "c", gpus=8, waited=7200, gpu_types=("a100",), comment="dike:comm=high"),
        pending(2, "d", gpus=2, waited=60),
    ]
    alloc = {f"n{i}": 4 for i in range(1, 5)}
    decisions = DikePolicy().decide(typed_snapshot(jobs, alloc), params, random.Random(0))
    held = decisions.placement_of(2)
    assert held is not None and "held for blocked heavy job 1" in held.reason
    assert set(held.placement.exclude_nodes) <= {"n1", "n3"} and held.placement.exclude_nodes
    untyped = [*jobs[:4], replace(jobs[4], gpu_types=()), jobs[5]]
    plain = DikePolicy().decide(typed_snapshot(untyped, alloc), params, random.Random(0))
    assert set(plain.placement_of(2).placement.exclude_nodes) <= {"n2", "n4"}


def test_steering_never_sends_a_typed_light_job_where_its_type_has_no_room():
    import random

    from snapshots import pending, running

    from dike_slurm.policies.dike import DikePolicy

    params = _dike_params(preemption=False, steer_light_jobs=True)
    # leaf s2 (n3 a100, n4 v100) idle: steering keeps light jobs off it; on s1 only the v100 node has room
    jobs = [
        running(10, "a", gpus=8, node="n1"), running(11, "a", gpus=2, node="n2"),
        pending(1, "c", gpus=2, gpu_types=("a100",)), pending(2, "c", gpus=2, gpu_types=("v100",)), pending(3, "c", gpus=2),
    ]
    decisions = DikePolicy().decide(typed_snapshot(jobs, {"n1": 8, "n2": 2}), params, random.Random(0))
    assert decisions.placement_of(1) is None  # steered off s2 it could run nowhere: left alone
    for job_id in (2, 3):
        assert decisions.placement_of(job_id).placement.exclude_nodes == ("n3", "n4")


# ----------------------------------------------------------------------------- service by TRESBillingWeights

def test_billing_weights_are_slurms_sum_and_equal_where_unset():
    from dike_slurm.domain.slurm_priority import GpuBilling, parse_billing_weights

    assert parse_billing_weights("", "x") is None
    lab = parse_billing_weights("CPU=0,GRES/gpu:a100=2.0,GRES/gpu:v100=1.0", "x")
    assert lab == GpuBilling(None, {"a100": 2.0, "v100": 1.0})
    assert (lab.weight(("a100",)), lab.weight(("v100",)), lab.weight(("p100",)), lab.weight(())) == (2.0, 1.0, 1.0, 1.0)
    # a typed GPU is two TRES, gres/gpu and gres/gpu:TYPE: Slurm bills both
    both = parse_billing_weights("cpu=1,gres/gpu=3,gres/gpu:h100=5", "x")
    assert (both.weight(("h100",)), both.weight(("v100",)), both.weight(())) == (8.0, 3.0, 3.0)
    assert parse_billing_weights("CPU=1.0,Mem=0.25G", "x").weight(("a100",)) == 1.0  # no GPU weight: equal
    with pytest.raises(Exception, match="not a number"):
        parse_billing_weights("GRES/gpu:a100=two", "x")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_labs_billing_weights_come_from_slurm_conf_and_scontrol(version):
    from dike_slurm.slurm.backends.site_priority import partitions_from_scontrol
    from dike_slurm.domain.slurm_priority import build_model

    model = parse_slurm_conf(_fixture(version, "slurm-conf-excerpt.txt")).priority_model({}, "slurm.conf")
    assert (model.gpu_weight("gpu", ("a100",)), model.gpu_weight("gpu", ("v100",))) == (2.0, 1.0)
    partitions, nodes, cpus = partitions_from_scontrol(_fixture(version, "scontrol-show-partition-o.txt"))
    live = build_model({}, partitions, nodes, cpus, {}, "scontrol show partition -o")
    assert (live.gpu_weight("gpu", ("a100",)), live.gpu_weight("gpu", ("v100",))) == (2.0, 1.0)
    assert live.gpu_weight("elsewhere", ("a100",)) == 1.0  # a partition the site does not weigh


@pytest.mark.parametrize("version", VERSIONS)
def test_a_runs_service_is_weighed_by_the_type_it_held(version):
    from dike_slurm.slurm.usage import current_runs, decayed_usage, job_service, runs_from_records

    model = parse_slurm_conf(_fixture(version, "slurm-conf-excerpt.txt")).priority_model({}, "slurm.conf")
    records = read_sacct_json(_fixture(version, "sacct.json"), "sacct.json").records
    runs = {r.job_id: r for r in runs_from_records(records, model)}
    by_name = {r.name: r.job_id for r in records}
    # AllocTRES: the untyped job ran on an a100 node and is charged as a100
    assert {name: runs[by_name[name]].weight for name in ("a100-running", "v100-running", "untyped-running",
                                                            "feature-running")} == {
        "a100-running": 2.0, "v100-running": 1.0, "untyped-running": 2.0, "feature-running": 1.0}
    assert all(r.weight == 1.0 for r in runs_from_records(records))  # the site's weights unknown: equal
    cluster = _json_cluster(version)
    running = [j for j in cluster.jobs if j.state is JobState.RUNNING]
    now = max(j.start_time for j in running) + 100.0
    node_types = {n.name: n.gpu_types for n in cluster.nodes}
    current = {r.job_id: r for r in current_runs(cluster.jobs, model, node_types)}
    service = job_service(current.values(), now)
    assert len(running) == 4
    for job in running:
        weight = 2.0 if NODE_TYPES[job.nodes[0]] == ("a100",) else 1.0
        assert service[job.job_id].attained_gpu_s == pytest.approx(job.gpus * weight * (now - job.start_time))
    plain = decayed_usage(current_runs(cluster.jobs), now, 3600.0)
    weighed = decayed_usage(current.values(), now, 3600.0)
    assert weighed["root"] > plain["root"] > 0


@pytest.mark.parametrize("version", VERSIONS)
def test_explain_shows_the_weight_a_jobs_gpu_type_is_charged(version, tmp_path):
    """`explain` on the recorded two-type lab: a running job's GPU-hour counts its nodes' type's
    weight from the partition's TRESBillingWeights (scontrol show partition -o), a pending job's
    the weight of each type it may run on; where the site weighs no GPU, every one counts 1."""
    from fakes import FakeBackend
    from dike_slurm.slurm.backends.site_priority import partitions_from_scontrol
    from dike_slurm.cli.explain import explain, explain_lines
    from dike_slurm.config import Config
    from dike_slurm.cycle.engine import Engine
    from dike_slurm.domain.slurm_priority import build_model
    from dike_slurm.store.state import StateStore

    cluster = _json_cluster(version)
    partitions, nodes, cpus = partitions_from_scontrol(_fixture(version, "scontrol-show-partition-o.txt"))
    live = build_model({}, partitions, nodes, cpus, {}, "scontrol show partition -o")
    now = max(j.start_time for j in cluster.jobs if j.start_time is not None) + 100.0
    by_name = {j.name: j.job_id for j in cluster.jobs}

    def documents(model, state):
        config = Config.model_validate({"engine": {"state_db": str(tmp_path / state)}})
        engine = Engine(config, FakeBackend(cluster.jobs, cluster.nodes, time=now, priority=model),
                        StateStore(config.engine.state_db, read_only=True))
        return {name: explain(engine, (job_id, None), str(job_id)) for name, job_id in by_name.items()}

    weighed = documents(live, "weighed.sqlite")
    charged = {name: d["job"]["billing"] for name, d in weighed.items()}
    set_by = "partition gpu's TRESBillingWeights"
    assert charged["a100-running"] == {"set_by": set_by, "run_gpu_types": ["a100"], "weight": 2.0,
                                       "weights": {"a100": 2.0}}
    assert charged["v100-running"]["weight"] == charged["feature-running"]["weight"] == 1.0
    # an untyped job is charged the type of the nodes Slurm gave it
    untyped = cluster.jobs[[j.name for j in cluster.jobs].index("untyped-running")]
    assert charged["untyped-running"]["weight"] == (2.0 if NODE_TYPES[untyped.nodes[0]] == ("a100",) else 1.0)
    assert charged["a100-blocked"] == {"set_by": set_by, "run_gpu_types": None, "weight": None,
                                       "weights": {"a100": 2.0}}
    assert charged["either-blocked"]["weights"] == {"a100": 2.0, "v100": 1.0}
    text = "\n".join(explain_lines(weighed["a100-running"]))
    assert ("a GPU-hour of its run counts 2 in its service and fair share (a100 GPUs, by partition gpu's "
            "TRESBillingWeights)") in text
    assert ("a GPU-hour will count, by the type of the nodes it gets: a100 2, v100 1 in its service and fair "
            "share (by partition gpu's TRESBillingWeights)") in "\n".join(explain_lines(weighed["either-blocked"]))
    plain = documents(None, "plain.sqlite")  # the site's weights unknown: every GPU counts 1
    assert plain["a100-running"]["job"]["billing"] == {"set_by": None, "run_gpu_types": ["a100"], "weight": 1.0,
                                                       "weights": {"a100": 1.0}}
    assert "every GPU counts 1" in "\n".join(explain_lines(plain["a100-blocked"]))


_types = st.lists(st.sampled_from(["a100", "v100", "h100"]), min_size=1, max_size=2, unique=True).map(tuple)


@settings(max_examples=60, deadline=None)
@given(nodes=st.lists(st.tuples(st.sampled_from(["a100", "v100"]), st.sampled_from([4, 8]), st.booleans()),
                      min_size=1, max_size=6),
       jobs=st.lists(st.tuples(_types, st.integers(1, 16), st.integers(1, 3), st.booleans()), min_size=1,
                     max_size=30))
def test_typed_jobs_are_kept_as_the_nodes_of_their_partition_and_types_allow(nodes, jobs):
    """build_trace works out a (partition, types) pair's usable nodes once: each typed job is kept or
    excluded exactly as a look at its partition's nodes, job by job, says."""
    lines = [f"NodeName=n{i} Gres=gpu:{kind}:{gpus} CPUs=64" for i, (kind, gpus, _) in enumerate(nodes)]
    small = [f"n{i}" for i, (_, _, in_small) in enumerate(nodes) if in_small] or ["n0"]
    lines += [f"PartitionName=all Nodes={','.join(f'n{i}' for i in range(len(nodes)))} Default=YES",
              f"PartitionName=small Nodes={','.join(small)}"]
    conf = parse_slurm_conf("\n".join(lines) + "\n")
    (finished,) = [replace(r, elapsed_s=60) for r in read_sacct_parsable2(_fixture("22.05", "sacct.txt"),
                                                                            "sacct.txt").records
                   if r.name == "typed-finished"]
    records = [replace(finished, job_id=1000 + i, display_id=str(1000 + i), gpu_types=types, gpus=gpus,
                       num_nodes=count, partition="small" if in_small else "all")
               for i, (types, gpus, count, in_small) in enumerate(jobs)]
    built = build_trace(records, conf)
    members = {"all": conf.nodes, "small": [n for n in conf.nodes if n.name in small]}
    kept = set()
    for record in records:
        usable = [n for n in members[record.partition] if may_use_gpus(record.gpu_types, n.gpu_types)]
        if usable and -(-record.gpus // record.num_nodes) <= max(n.gpus for n in usable) \
                and record.num_nodes <= len(usable):
            kept.add(record.job_id)
    assert {job.job_id for job in built.jobs} == kept
    assert sum(built.excluded.values()) == len(records) - len(kept)
