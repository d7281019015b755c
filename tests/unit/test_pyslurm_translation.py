"""The pyslurm backend's translation, with objects shaped as pyslurm 25.11 documents them.

pyslurm itself cannot be installed here (it builds only against Slurm 25.11, the lab runs
22.05), so a stand-in module with the documented classes and attribute names is used:
`pyslurm.Jobs.load()` / `pyslurm.Nodes.load()` (dict-like collections), `pyslurm.Job(id)`
with `modify(JobSubmitDescription)`, `hold()`, `release()`, `requeue()`, and
`pyslurm.db.Jobs.load(pyslurm.db.JobFilter(start_time=, end_time=))`.
"""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest

from dike_slurm.backends.base import JobField, JobUpdate, SwitchRequest
from dike_slurm.backends.pyslurm import (
    PyslurmBackend,
    PyslurmUnavailable,
    gres_gpus,
    job_from_pyslurm,
    node_from_pyslurm,
    record_from_pyslurm_db,
)
from dike_slurm.config import SlurmSettings
from dike_slurm.model import JobState, Placement


def pyslurm_job(**overrides):
    """A pyslurm.Job's documented attributes (read-only properties in pyslurm)."""
    fields = dict(
        id=63, name="train", user_name="dikeuser2", account="teaching", partition="gpu", qos="normal",
        state="PENDING", priority=11165, nice=100, submit_time=1796025920, eligible_time=1796025920,
        start_time=None, time_limit=None, num_nodes=2, cpus=2, allocated_nodes=None,
        excluded_nodes="n[3-4]", required_nodes=None, constraints=["leaf_s1"], required_switches=1, max_wait_time_switches=300,
        admin_comment="dike:level=0,attained=0.0gpuh", comment="$(reboot)", array_id=60, array_task_id=3,
        is_requeueable=True, gres_per_node={"gpu": 8}, state_reason="Priority",
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


def pyslurm_node(**overrides):
    fields = dict(
        name="n1", state="MIXED", configured_gres={"gpu": 8}, allocated_gres={"gpu": 3}, total_cpus=16,
        active_features=["leaf_s1"], available_features=["leaf_s1"], partitions=["gpu"],
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


def pyslurm_db_job(**overrides):
    fields = dict(
        id=53, name="train", user_name="dikeuser1", account="research", partition="gpu", qos="normal",
        state="REQUEUED", submit_time=1796025900, eligible_time=1796025900, start_time=1796025905,
        end_time=1796026505, elapsed_time=600, time_limit=525600, num_nodes=2, cpus=2, nodelist="n[1-2]",
        priority=11003, array_id=0, array_task_id=None, gres={"gpu": 16},
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


class FakePyslurm(ModuleType):
    """The parts of the pyslurm module the backend uses, recording every call."""

    def __init__(self, jobs, nodes, db_jobs, failures=None):
        super().__init__("pyslurm")
        self.__version__ = "25.11.0"
        self.calls = []
        failures = failures or {}
        outer = self

        class Job:
            def __init__(self, job_id):
                self.job_id = job_id

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

        class JobFilter:
            def __init__(self, **kwargs):
                outer.calls.append(("JobFilter", None, kwargs))

        self.db = SimpleNamespace(JobFilter=JobFilter, Jobs=SimpleNamespace(load=lambda query: {j.id: j for j in db_jobs}))


def test_a_pending_job_with_placement_and_an_array_task():
    job = job_from_pyslurm(pyslurm_job())
    assert (job.job_id, job.display_id, job.user, job.state) == (63, "60_3", "dikeuser2", JobState.PENDING)
    assert job.gpus == 16 and job.num_nodes == 2 and job.nice == 100 and job.time_limit_s is None
    assert job.placement == Placement(max_switches=1, switches_wait_s=300, features="leaf_s1",
                                      exclude_nodes=("n3", "n4"))
    assert job.comment == "$(reboot)"  # kept as data
    assert job.slurm_reason == "Priority"


def test_a_running_job_has_its_nodes_and_start():
    job = job_from_pyslurm(pyslurm_job(state="RUNNING", start_time=1796025930, allocated_nodes="n[1-2]",
                                       required_switches=0, constraints=[], excluded_nodes=None, required_nodes=None,
                                       gres_per_node={"gpu:a100": 4, "gpu:v100": 4}, time_limit=60))
    assert job.start_time == 1796025930.0 and job.nodes == ("n1", "n2")
    assert job.placement == Placement() and job.gpus == 16 and job.time_limit_s == 3600
    assert job.slurm_reason == ""  # a running job waits for nothing


def test_nodes_and_accounting_records():
    node = node_from_pyslurm(pyslurm_node(state="IDLE+DRAIN"))
    assert (node.gpus, node.gpus_alloc, node.features, node.partitions) == (8, 3, ("leaf_s1",), ("gpu",))
    assert not node.available
    record = record_from_pyslurm_db(pyslurm_db_job())
    assert (record.job_id, record.gpus, record.state, record.elapsed_s) == (53, 16, JobState.REQUEUED, 600)
    assert record.start == 1796025905.0 and record.end == 1796026505.0 and record.nodes == ("n1", "n2")
    pending = record_from_pyslurm_db(pyslurm_db_job(start_time=0, end_time=0, state="PENDING",
                                                    gres={"gpu:a100": 2}))
    assert pending.start is None and pending.end is None and pending.gpus == 2


def backend(fake) -> PyslurmBackend:
    return PyslurmBackend(SlurmSettings(), fake, clock=lambda: 1796026000.0)


def test_read_cluster_and_accounting_through_the_module():
    fake = FakePyslurm([pyslurm_job(), pyslurm_job(id=64, state="COMPLETED")], [pyslurm_node()], [pyslurm_db_job()])
    cli = backend(fake)
    state = cli.read_cluster()
    assert [j.job_id for j in state.jobs] == [63]
    assert state.admin_comments == {63: "dike:level=0,attained=0.0gpuh"} and state.site_factors == {}
    result = cli.accounting(1796025600.0, 1796026000.0)
    assert ("JobFilter", None, {"start_time": 1796025600, "end_time": 1796026000}) in fake.calls
    assert [r.job_id for r in result.records] == [53]
    assert cli.calls == 3


def test_writes_become_job_submit_descriptions():
    fake = FakePyslurm([], [], [])
    cli = backend(fake)
    update = JobUpdate.of(63, {
        JobField.SITE_FACTOR: 5000, JobField.ADMIN_COMMENT: "dike:level=1,attained=3.2gpuh",
        JobField.SWITCHES: SwitchRequest(1, 300), JobField.FEATURES: "", JobField.EXCLUDED_NODES: ("n3",),
    })
    assert cli.apply(update).ok
    assert fake.calls == [("modify", 63, {
        "site_factor": 5000, "admin_comment": "dike:level=1,attained=3.2gpuh",
        "switches": {"count": 1, "max_wait_time": "00:05:00"}, "constraints": "", "excluded_nodes": ["n3"],
    })]
    fake.calls.clear()
    assert cli.apply(JobUpdate.of(63, {JobField.PRIORITY: None})).ok
    assert fake.calls == [("hold", 63, None), ("release", 63, None)]
    assert cli.requeue(53).ok and fake.calls[-1] == ("requeue", 53, None)


def test_a_failed_rpc_is_an_outcome_not_an_exception():
    fake = FakePyslurm([], [], [], failures={("modify", 63): "Job is no longer pending execution"})
    outcome = backend(fake).apply(JobUpdate.of(63, {JobField.FEATURES: "leaf_s1"}))
    assert not outcome.ok and outcome.job_gone


def test_create_refuses_a_missing_or_mismatched_pyslurm(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # import fails
    with pytest.raises(PyslurmUnavailable, match="cannot be imported"):
        PyslurmBackend.create(SlurmSettings())
    old = FakePyslurm([], [], [])
    old.__version__ = "24.11.1"
    monkeypatch.setitem(sys.modules, "pyslurm", old)
    with pytest.raises(PyslurmUnavailable, match="pyslurm 24.11.1 is installed"):
        PyslurmBackend.create(SlurmSettings())
    monkeypatch.setitem(sys.modules, "pyslurm", FakePyslurm([], [], []))
    assert isinstance(PyslurmBackend.create(SlurmSettings()), PyslurmBackend)


class _TresGpu:
    """Stands in for pyslurm.db.tres.GPU (pyslurm 25.11.2: attributes count, type, id)."""

    def __init__(self, count: int, gpu_type: str | None = None) -> None:
        self.count = count
        self.type = gpu_type
        self.id = 1001


def test_gres_gpus_reads_the_shapes_pyslurm_25_11_gives():
    # Shapes described in issue 34 from a Slurm 25.11.7 + pyslurm 25.11.2 cluster (invented
    # values, not a recording): the old gres_gpus returned 0 for the last three.
    assert gres_gpus({"gpu": 8}) == 8
    assert gres_gpus({"gpu:a100": 4, "gpu:v100": 2}) == 6
    assert gres_gpus({"gres/gpu": 1}) == 1
    assert gres_gpus({"gres/gpu:a100": 2, "gres/mps": 100}) == 2
    assert gres_gpus({"gpu": _TresGpu(3)}) == 3
    assert gres_gpus({"gpu:a100": _TresGpu(2, "a100"), "gpu:v100": _TresGpu(1, "v100")}) == 3
    assert gres_gpus({"gpu": True, "mps": 4, "gpu:x": "2"}) == 0
    assert gres_gpus(None) == 0
