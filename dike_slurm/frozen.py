"""Frozen dataclass instances built in one step.

A frozen dataclass's `__init__` sets each field with `object.__setattr__`, one call per field. The
engine builds tens of thousands of Jobs, JobPlans, OwnedFields and JobMemories a cycle, and that
showed in the profile: filling the instance dict at once is 2.5-6x faster. It is only the same
object when the caller gives every field and the class has no `__post_init__` and no slots: the
classes built here are listed in `FROZEN_RECORDS`, and tests/unit/test_frozen.py holds each of
them to that and, for each builder, to equality with the constructor.
"""

from __future__ import annotations

from typing import TypeVar

_T = TypeVar("_T")

_new = object.__new__
_set = object.__setattr__


def frozen_record(cls: type[_T], values: dict[str, object]) -> _T:
    """`cls(**values)` for a frozen dataclass listed by frozen_records; `values` must name every
    field and becomes the instance's dict (the caller gives up the dict)."""
    record = _new(cls)
    _set(record, "__dict__", values)
    return record


def frozen_records() -> tuple[type, ...]:
    """The classes built with frozen_record (imported late: they import this module)."""
    from dike_slurm.model import Job
    from dike_slurm.backends.base import JobUpdate
    from dike_slurm.cycle_plan import JobPlan, PlannedWrite
    from dike_slurm.state_records import JobMemory, OwnedField

    return Job, JobPlan, JobUpdate, PlannedWrite, JobMemory, OwnedField
