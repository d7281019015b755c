"""dike_slurm.frozen builds each listed frozen dataclass as its constructor would: the classes
have no __post_init__ and no slots, so an instance is its dict, and each of the builders that
use it gives what the constructor gives (the builders' own equivalence tests:
test_state_fast_read.py for the store's reads, test_lean_read.py for the lean read's Jobs)."""

from __future__ import annotations

import dataclasses

import pytest

from dike_slurm.domain.fields import JobField, JobUpdate
from dike_slurm.frozen import frozen_record
from dike_slurm.domain.model import Job, JobState
from dike_slurm.cycle.plan import JobPlan, PlannedWrite
from dike_slurm.cycle.reconcile import _job_plan, _job_update, _planned_write
from dike_slurm.store.records import JobMemory, OwnedField

# the classes built with frozen_record
FROZEN_RECORDS = (Job, JobPlan, JobUpdate, PlannedWrite, JobMemory, OwnedField)


@pytest.mark.parametrize("cls", FROZEN_RECORDS, ids=lambda c: c.__name__)
def test_each_record_is_a_frozen_dataclass_whose_instance_is_its_dict(cls):
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    assert not hasattr(cls, "__post_init__"), f"{cls.__name__}.__post_init__ would be skipped by frozen_record"
    assert "__slots__" not in cls.__dict__, f"{cls.__name__} has slots: it has no instance dict to fill"


def test_a_record_equals_and_hashes_as_the_constructor():
    values = {"job_id": 7, "values": ((JobField.NICE, 5),)}
    built = frozen_record(JobUpdate, dict(values))
    assert built == JobUpdate(**values) and hash(built) == hash(JobUpdate(**values))
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.job_id = 8  # type: ignore[misc]


def test_the_reconcile_builders_equal_the_constructors():
    job = Job(job_id=3, user="u", state=JobState.PENDING, submit_time=0.0, gpus=1)
    update = _job_update(3, ((JobField.NICE, 5),))
    assert update == JobUpdate(3, ((JobField.NICE, 5),))
    write = _planned_write(3, update, _job_update(3, ((JobField.NICE, 0),)), ((JobField.NICE, 0),), (), "why", 2,
                           ((JobField.NICE, 0),), "priority")
    assert write == PlannedWrite(3, update, JobUpdate(3, ((JobField.NICE, 0),)), ((JobField.NICE, 0),), (), "why",
                                 2, ((JobField.NICE, 0),))
    assert write.kind == PlannedWrite(3, update, update, (), (), "", 0, ()).kind == "priority"
    values = dict(job=job, managed=True, note="", level=1, reason="r", promoted=False, value_now=0, value_wanted=5,
                  placement_wanted=None, writes=(write,), hands_off=(), hands_off_reason="", outside_window=False)
    plan = _job_plan(**values)
    assert plan == JobPlan(**values)


def test_job_build_and_with_changes_equal_the_constructor_and_replace():
    job = Job.build(job_id=3, user="u", state=JobState.PENDING, submit_time=0.0, gpus=1)
    assert job == Job(job_id=3, user="u", state=JobState.PENDING, submit_time=0.0, gpus=1)
    assert job.with_changes(gpus=4, nice=9) == dataclasses.replace(job, gpus=4, nice=9)
    with pytest.raises(TypeError, match="no field"):
        job.with_changes(gpu=4)
