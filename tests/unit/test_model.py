"""The model's fast constructors build exactly what the dataclass constructor builds."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dike_slurm.domain.model import Job, JobState, Placement

_values = st.fixed_dictionaries(
    {"job_id": st.integers(1, 2**31), "user": st.text(max_size=8), "state": st.sampled_from(JobState),
     "submit_time": st.floats(0, 2e9)},
    optional={
        "gpus": st.integers(0, 64), "num_nodes": st.integers(1, 8), "account": st.text(max_size=8),
        "start_time": st.none() | st.floats(0, 2e9), "nodes": st.lists(st.text(max_size=4), max_size=3).map(tuple),
        "placement": st.builds(Placement, max_switches=st.none() | st.integers(1, 4)),
        "priority": st.none() | st.integers(0, 2**32), "requeueable": st.booleans(),
    },
)


@settings(max_examples=200, deadline=None)
@given(_values, _values)
def test_build_and_with_changes_equal_the_dataclass_constructors(values, other):
    job = Job.build(**values)
    assert job == Job(**values) and job.__dict__ == Job(**values).__dict__
    changes = {k: v for k, v in other.items() if k != "job_id"}
    assert job.with_changes(**changes) == dataclasses.replace(Job(**values), **changes)
    assert job == Job(**values)  # the original is untouched


def test_fast_constructors_keep_the_dataclass_guarantees():
    job = Job.build(job_id=1, user="u", state=JobState.PENDING, submit_time=0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.gpus = 3  # type: ignore[misc]
    with pytest.raises(TypeError, match="no field"):
        Job.build(job_id=1, user="u", state=JobState.PENDING, submit_time=0.0, gpu=3)
    with pytest.raises(TypeError, match="missing required field.*submit_time"):
        Job.build(job_id=1, user="u", state=JobState.PENDING)
    with pytest.raises(TypeError, match="no field"):
        job.with_changes(attained=1.0)
    assert hash(job) == hash(Job(job_id=1, user="u", state=JobState.PENDING, submit_time=0.0))
