"""The pyslurm backend's translation, on pyslurm objects recorded on a real Slurm 25.11.

tests/fixtures/pyslurm-25.11 holds every attribute of the pyslurm.Job, pyslurm.Node and
pyslurm.db.Job objects of a two-type lab (Slurm 25.11.7, pyslurm 25.11.2; see its README), and
the command-line backend's read of the same cluster: the translation must agree with it. pyslurm
itself is not needed (it builds only against Slurm 25.11): the recorded objects come back as
namespaces with the same attributes. A stand-in module records the backend's calls for the
writes (its classes and methods as pyslurm 25.11 documents them).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from dike_slurm.slurm.backends.base import ClusterState, WriteOutcome
from dike_slurm.domain.fields import JobField, JobUpdate, SwitchRequest
from dike_slurm.slurm.backends.pyslurm import (
    PyslurmBackend,
    PyslurmUnavailable,
    gres_gpus,
    job_from_pyslurm,
    node_from_pyslurm,
    record_from_pyslurm_db,
)
from dike_slurm.config import SlurmSettings
from dike_slurm.errors import SlurmError
from dike_slurm.domain.model import JobState, Topology

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "pyslurm-25.11"


def revive(value: Any) -> Any:
    """A recorded value back as pyslurm gave it: its objects as namespaces of their attributes."""
    if isinstance(value, list):
        return [revive(v) for v in value]
    if isinstance(value, dict):
        if "__pyslurm__" in value:
            return SimpleNamespace(**{k: revive(v) for k, v in value.items() if k != "__pyslurm__"})
        return {k: revive(v) for k, v in value.items()}
    return value


def recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / f"{name}.json").read_text(encoding="utf-8"))


def recorded_objects(name: str) -> dict[str, SimpleNamespace]:
    return {key: SimpleNamespace(**revive(attributes)) for key, attributes in recorded(name).items()}


CLI = recorded("cli")


def by_name(objects: dict[str, SimpleNamespace], name: str) -> SimpleNamespace:
    (found,) = [o for o in objects.values() if o.name == name]
    return found


def test_every_job_reads_as_the_command_line_backend_reads_it():
    jobs = recorded_objects("jobs")
    nodes = [node_from_pyslurm(n) for n in recorded_objects("nodes").values()]
    translated = [job_from_pyslurm(j) for j in jobs.values()]
    # the constraint typing (--constraint=v100 names a GPU type) is ClusterState's, for every backend
    state = ClusterState(time=0.0, jobs=tuple(j for j in translated if j.state.is_active), nodes=tuple(nodes),
                         topology=Topology())
    assert sorted(str(j.job_id) for j in state.jobs) == sorted(CLI["jobs"])
    for job in state.jobs:
        want = CLI["jobs"][str(job.job_id)]
        got = {
            "gpus": job.gpus, "gpu_types": list(job.gpu_types), "num_nodes": job.num_nodes, "cpus": job.cpus,
            "state": job.state.value, "nodes": list(job.nodes), "slurm_reason": job.slurm_reason,
            "features": job.placement.features, "exclude_nodes": list(job.placement.exclude_nodes),
            "require_nodes": list(job.placement.require_nodes), "max_switches": job.placement.max_switches,
            "switches_wait_s": job.placement.switches_wait_s, "nice": job.nice, "requeueable": job.requeueable,
            "user": job.user, "account": job.account, "partition": job.partition, "qos": job.qos, "name": job.name,
            "array_job_id": job.array_job_id, "array_task_id": job.array_task_id, "time_limit_s": job.time_limit_s,
            "submit_time": job.submit_time, "admin_comment": jobs[str(job.job_id)].admin_comment or "",
        }
        assert got == want, job.name


def test_gpus_come_from_the_tracked_tres_not_gres_per_node():
    jobs = recorded_objects("jobs")
    # --gpus=2 asks per job: gres_per_node is {} and Job.gpus holds {'gpu': 2, 'gpu:v100': 2}
    per_job = by_name(jobs, "running_gpus_per_job")
    assert per_job.gres_per_node == {} and job_from_pyslurm(per_job).gpus == 2
    # -N2 --gres=gpu:a100:6: the total and the typed share name the same 12 GPUs
    two_nodes = by_name(jobs, "running_a100_2nodes")
    assert sorted(two_nodes.gpus) == ["gpu", "gpu:a100"] and two_nodes.gres_per_node == {"gres/gpu:a100": 6}
    assert job_from_pyslurm(two_nodes).gpus == 12 and job_from_pyslurm(two_nodes).gpu_types == ("a100",)


def test_a_typed_per_job_request_keeps_its_type():
    # --gpus=v100:2 asks per job: gres_per_node is {} and tres_per_job None (pyslurm 25.11.2), so a
    # read of gres_per_node alone gave no type; the requested TRES names it, as squeue's tres_per_job does
    job = by_name(recorded_objects("jobs"), "running_gpus_v100_per_job")
    assert job.gres_per_node == {} and job.tres_per_job is None
    assert job_from_pyslurm(job).gpu_types == ("v100",) and job_from_pyslurm(job).gpus == 2
    # an untyped request that was given a100s stays untyped: the type it got is not one it asked for
    untyped = by_name(recorded_objects("jobs"), "running_untyped")
    assert job_from_pyslurm(untyped).gpu_types == ()


def test_gres_gpus_counts_a_tres_dict_once():
    # The shapes recorded on Slurm 25.11.7: the gres_gpus of before this issue returned 0 for the
    # first two (keys gres/gpu, GPU objects), and the one of 9532a5a counted each TRES dict's GPUs
    # twice (the total and the typed share): 24, 16, 16.
    jobs, nodes, db_jobs = recorded_objects("jobs"), recorded_objects("nodes"), recorded_objects("db-jobs")
    assert gres_gpus(by_name(jobs, "running_untyped").gres_per_node) == 2  # {'gres/gpu': 2}
    assert gres_gpus(by_name(jobs, "running_a100_2nodes").gpus) == 12
    assert gres_gpus(nodes["n1"].allocated_gres) == CLI["nodes"]["n1"]["gpus_alloc"] == 8
    assert gres_gpus(by_name(db_jobs, "pending_a100_switches").gres) == 8
    assert gres_gpus(nodes["n2"].configured_gres) == 8  # {'gpu:v100': 8}: one entry per type
    assert gres_gpus({"gpu": True, "mps": 4}) == 0 and gres_gpus(None) == 0


def test_every_node_reads_as_the_command_line_backend_reads_it():
    for name, raw in recorded_objects("nodes").items():
        node = node_from_pyslurm(raw)
        got = {"gpus": node.gpus, "gpus_alloc": node.gpus_alloc, "cpus": node.cpus, "state": node.state,
               "features": list(node.features), "partitions": list(node.partitions),
               "gpu_types": list(node.gpu_types)}
        assert got == CLI["nodes"][name], name


def test_every_accounting_record_reads_as_sacct_reads_it():
    records = {str(r.job_id): r for r in map(record_from_pyslurm_db, recorded_objects("db-jobs").values())}
    assert sorted(records) == sorted(CLI["accounting"])
    for job_id, record in records.items():
        # sacct --parsable2 prints no Constraints (the engine's read leaves them ""): pyslurm's below
        want = {k: v for k, v in CLI["accounting"][job_id].items() if k != "constraints"}
        got = {"gpus": record.gpus, "gpu_types": list(record.gpu_types),
               "alloc_gpu_types": list(record.alloc_gpu_types), "state": record.state.value,
               "num_nodes": record.num_nodes, "cpus": record.cpus, "nodes": list(record.nodes),
               "user": record.user, "account": record.account}
        assert got == want, record.name
    constraints = {r.name: r.constraints for r in records.values() if r.constraints}
    assert constraints == {"running_constraint_v100": "v100", "pending_array": "a100|v100"}


class FakePyslurm(ModuleType):
    """The parts of the pyslurm module the backend uses, recording every call. `loaded` is what
    `Job.load(id)` gives (the job as Slurm holds it after the writes)."""

    def __init__(self, jobs=(), nodes=(), db_jobs=(), failures=None, loaded=None, tracked=None):
        super().__init__("pyslurm")
        self.__version__ = "25.11.2"
        self.calls = []
        failures = failures or {}
        loaded = loaded or {}
        outer = self

        class Job:
            def __init__(self, job_id):
                self.job_id = job_id

            @staticmethod
            def load(job_id):
                outer.calls.append(("load", job_id, None))
                return loaded[job_id]

            def _record(self, what, detail=None):
                outer.calls.append((what, self.job_id, detail))
                if (what, self.job_id) in failures:
                    raise RuntimeError(failures[(what, self.job_id)])

            def modify(self, description):
                self._record("modify", dict(description.fields))

            def hold(self):
                self._record("hold")

            def release(self):
                self._record("release")

            def requeue(self):
                self._record("requeue")

        class JobSubmitDescription:
            def __init__(self, **fields):
                self.fields = fields

        self.Job = Job
        self.JobSubmitDescription = JobSubmitDescription
        self.Jobs = SimpleNamespace(load=lambda: {j.id: j for j in jobs})
        self.Nodes = SimpleNamespace(load=lambda: {n.name: n for n in nodes})
        tres = recorded("config")["accounting_storage_tres"] if tracked is None else tracked
        self.slurmctld = SimpleNamespace(Config=SimpleNamespace(
            load=lambda: SimpleNamespace(accounting_storage_tres=tres)))

        class JobFilter:
            def __init__(self, **kwargs):
                outer.calls.append(("JobFilter", None, kwargs))

        self.db = SimpleNamespace(JobFilter=JobFilter, Jobs=SimpleNamespace(load=lambda query: {j.id: j for j in db_jobs}))


class FakeScontrol:
    """The command-line backend's write, recording the updates it is given."""

    def __init__(self, outcome: WriteOutcome | None = None) -> None:
        self.updates: list[JobUpdate] = []
        self.outcome = outcome
        self.calls = 0
        self.model = object()  # stands in for the SlurmPriorityModel it reads with commands

    def priority_model(self) -> object:
        return self.model

    def site_factors(self) -> dict[int, int]:  # sprio's SiteFactor of each eligible pending job
        self.calls += 1
        return {63: 5000}

    def describe(self, update: JobUpdate) -> str:
        return f"scontrol update JobId={update.job_id} " + " ".join(f.name for f in update.fields)

    def apply(self, update: JobUpdate) -> WriteOutcome:
        self.calls += 1
        self.updates.append(update)
        return self.outcome or WriteOutcome(True, self.describe(update))


def backend(fake, scontrol=None) -> PyslurmBackend:
    return PyslurmBackend(SlurmSettings(), fake, scontrol=scontrol or FakeScontrol(), clock=lambda: 1796026000.0)


def test_read_cluster_and_accounting_through_the_module():
    jobs, nodes, db_jobs = recorded_objects("jobs"), recorded_objects("nodes"), recorded_objects("db-jobs")
    fake = FakePyslurm(jobs.values(), nodes.values(), db_jobs.values())
    pyslurm = backend(fake)
    state = pyslurm.read_cluster()
    assert sorted(str(j.job_id) for j in state.jobs) == sorted(CLI["jobs"])  # finished_a100 is not active
    held = by_name(jobs, "held_nice").id
    assert state.admin_comments[held] == "dike:level=1,attained=0.5gpuh" and state.site_factors == {63: 5000}
    result = pyslurm.accounting(1796025600.0, 1796026000.0)
    assert ("JobFilter", None, {"start_time": 1796025600, "end_time": 1796026000}) in fake.calls
    assert sorted(str(r.job_id) for r in result.records) == sorted(CLI["accounting"])
    assert pyslurm.calls == 5  # the configuration once, jobs, nodes, sprio, accounting


def test_a_cluster_without_gpu_tres_is_refused_with_one_line():
    tracked = [t for t in recorded("config")["accounting_storage_tres"] if not t.startswith("gres/gpu")]
    pyslurm = backend(FakePyslurm(recorded_objects("jobs").values(), tracked=tracked))
    for read in (pyslurm.read_cluster, lambda: pyslurm.accounting(0.0, 1.0)):
        with pytest.raises(SlurmError, match="AccountingStorageTRES=cpu,mem,energy,node,billing,fs/disk,vmem,pages "
                                             "does not track gres/gpu") as error:
            read()
        assert "\n" not in str(error.value) and "slurm.backend = 'cli'" in str(error.value)


def held_job(**changes: Any) -> SimpleNamespace:
    """The recorded pending job pending_a100_switches (ExcNodeList n3, Switches 1@5:00) as Slurm holds it."""
    job = by_name(recorded_objects("jobs"), "pending_a100_switches")
    return SimpleNamespace(**{**vars(job), **changes})


def test_writes_pyslurm_cannot_make_go_through_scontrol_and_are_read_back():
    job = held_job()
    assert (job.excluded_nodes, job.required_switches, job.constraints) == ("n3", 1, [])
    fake, scontrol = FakePyslurm(loaded={job.id: job}), FakeScontrol()
    update = JobUpdate.of(job.id, {
        JobField.SITE_FACTOR: 5000, JobField.ADMIN_COMMENT: "dike:level=1,attained=3.2gpuh",
        JobField.SWITCHES: SwitchRequest(1, 600), JobField.FEATURES: "", JobField.EXCLUDED_NODES: ("n3",),
    })
    pyslurm = backend(fake, scontrol)
    outcome = pyslurm.apply(update)
    assert outcome.ok, outcome
    assert pyslurm.calls == 3  # modify, scontrol update, the read-back
    assert fake.calls == [("modify", job.id, {"site_factor": 5000, "admin_comment": "dike:level=1,attained=3.2gpuh",
                                             "excluded_nodes": ["n3"]}),
                          ("load", job.id, None)]
    # Switches (pyslurm's _set_switches bug) and the cleared Features: scontrol
    assert scontrol.updates == [JobUpdate.of(job.id, {JobField.SWITCHES: SwitchRequest(1, 600), JobField.FEATURES: ""})]
    assert outcome.command.endswith("; scontrol update JobId=%d SWITCHES FEATURES" % job.id)
    # Switches are compared by count: Slurm stores 1@00:10:00 as 1@00:05:00 (max_switch_wait)


def test_values_pyslurm_does_not_send_go_through_scontrol():
    # pyslurm 25.11.2 sends neither nice 0 nor site_factor 0 (`if self.nice:`), nor '' for AdminComment:
    # the engine's reverts (seen on the 25.11 lab: Nice stayed 77)
    fake, scontrol = FakePyslurm(), FakeScontrol()
    zeros = {JobField.SITE_FACTOR: 0, JobField.NICE: 0, JobField.ADMIN_COMMENT: ""}
    assert backend(fake, scontrol).apply(JobUpdate.of(63, {**zeros, JobField.PRIORITY: 0})).ok
    assert fake.calls == [("modify", 63, {"priority": 0})] and scontrol.updates == [JobUpdate.of(63, zeros)]


def test_signals_are_named_as_python_names_them():
    fake = FakePyslurm()
    fake.Job.send_signal = lambda self, name, steps: self._record("send_signal", (name, steps))
    pyslurm = backend(fake)
    assert pyslurm.signal(63, "USR1").ok and pyslurm.signal(63, "SIGTERM").ok and pyslurm.signal(63, "10").ok
    assert [c[2] for c in fake.calls] == [("SIGUSR1", "batch"), ("SIGTERM", "batch"), ("10", "batch")]


def test_array_task_0_is_not_the_pending_tasks_record():
    # pyslurm reads task 0 as None (0 is "unset" to it); the record of the pending tasks lists them
    jobs, db_jobs = recorded_objects("jobs"), recorded_objects("db-jobs")
    for pending in (by_name(jobs, "pending_array"), by_name(db_jobs, "pending_array")):
        task0 = SimpleNamespace(**{**vars(pending), "array_tasks_waiting": None})
        translate = job_from_pyslurm if pending in jobs.values() else record_from_pyslurm_db
        assert (translate(pending).array_task_id, translate(task0).array_task_id) == (None, 0)
    assert record_from_pyslurm_db(SimpleNamespace(**{**vars(by_name(db_jobs, "pending_array")),
                                                     "array_tasks_waiting": None})).display_id == f"{pending.id}_0"


def test_a_running_job_carries_no_switches():
    two_nodes = by_name(recorded_objects("jobs"), "running_a100_2nodes")
    assert job_from_pyslurm(SimpleNamespace(**{**vars(two_nodes), "required_switches": 1})).placement.max_switches is None


def test_a_write_slurm_did_not_take_fails_on_reading_back():
    job = held_job()  # Slurm kept ExcNodeList=n3
    outcome = backend(FakePyslurm(loaded={job.id: job})).apply(JobUpdate.of(job.id, {JobField.EXCLUDED_NODES: ()}))
    assert not outcome.ok and "EXCLUDED_NODES is ('n3',), not ()" in outcome.message
    cleared = held_job(excluded_nodes=None)
    assert backend(FakePyslurm(loaded={job.id: cleared})).apply(JobUpdate.of(job.id, {JobField.EXCLUDED_NODES: ()})).ok


def test_the_sites_priority_model_is_read_with_slurms_commands():
    # TRESBillingWeights weigh a run's GPUs: without the model every GPU weighed 1 (seen on the 25.11 lab)
    scontrol = FakeScontrol()
    assert backend(FakePyslurm(), scontrol).priority_model() is scontrol.model


def test_writes_without_placement_are_not_read_back():
    fake = FakePyslurm()
    pyslurm = backend(fake)
    assert pyslurm.apply(JobUpdate.of(63, {JobField.PRIORITY: None})).ok
    assert fake.calls == [("hold", 63, None), ("release", 63, None)]
    assert pyslurm.requeue(53).ok and fake.calls[-1] == ("requeue", 53, None)


def test_a_failed_rpc_or_scontrol_is_an_outcome_not_an_exception():
    fake = FakePyslurm(failures={("modify", 63): "Job is no longer pending execution"})
    outcome = backend(fake).apply(JobUpdate.of(63, {JobField.FEATURES: "leaf_s1"}))
    assert not outcome.ok and outcome.job_gone
    refused = FakeScontrol(WriteOutcome(False, "scontrol ...", "Invalid job id specified", job_gone=True))
    outcome = backend(FakePyslurm(), refused).apply(JobUpdate.of(63, {JobField.SWITCHES: SwitchRequest(1, 300)}))
    assert not outcome.ok and outcome.job_gone and outcome.message == "Invalid job id specified"


def test_create_refuses_a_missing_or_mismatched_pyslurm(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # import fails
    with pytest.raises(PyslurmUnavailable, match="cannot be imported"):
        PyslurmBackend.create(SlurmSettings())
    old = FakePyslurm()
    old.__version__ = "24.11.1"
    monkeypatch.setitem(sys.modules, "pyslurm", old)
    with pytest.raises(PyslurmUnavailable, match="pyslurm 24.11.1 is installed"):
        PyslurmBackend.create(SlurmSettings())
    monkeypatch.setitem(sys.modules, "pyslurm", FakePyslurm())
    created = PyslurmBackend.create(SlurmSettings())
    assert isinstance(created, PyslurmBackend) and created.scontrol.name == "cli"


def test_a_job_cancelled_before_it_started_counts_its_requested_gpus():
    # Seen on Slurm 25.11.7 (test_pyslurm_lab): a pending job cancelled before it started has an
    # allocated TRES without GPUs, and pyslurm's db.Job.gres takes the allocated TRES when there is
    # one (pyslurm 25.11.2, db/job.pyx: `allocated_tres or requested_tres`). The record below is the
    # recorded pending job with that allocated TRES put in (invented from what the lab showed).
    pending = by_name(recorded_objects("db-jobs"), "pending_a100_switches")
    no_gpus = SimpleNamespace(**{**vars(pending.requested_tres), "gres": {}})
    cancelled = SimpleNamespace(**{**vars(pending), "state": "CANCELLED", "gres": {}, "allocated_tres": no_gpus})
    assert record_from_pyslurm_db(cancelled).gpus == record_from_pyslurm_db(pending).gpus == 8
    assert record_from_pyslurm_db(cancelled).gpu_types == ("a100",)
