"""Slurm's job fields as the engine writes them: which fields (`JobField`), their values
(`FieldValue`), one job's update (`JobUpdate`), and the one mapping between a `Placement` and
the placement fields (`Switches`, `Features`, `ExcNodeList`, `ReqNodeList`)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Union

from dike_slurm.domain.model import Placement


class JobField(enum.Enum):
    """A job attribute the engine may write; the value is Slurm's `scontrol update` key."""

    SITE_FACTOR = "SiteFactor"
    PRIORITY = "Priority"
    NICE = "Nice"
    ADMIN_COMMENT = "AdminComment"
    SWITCHES = "Switches"
    FEATURES = "Features"
    EXCLUDED_NODES = "ExcNodeList"
    REQUIRED_NODES = "ReqNodeList"

    # Members are singletons compared by identity, so identity hashing is exact; Enum's own
    # __hash__ (hash of the name, in Python) dominated the diff at 50k jobs.
    __hash__ = object.__hash__

    @property
    def is_placement(self) -> bool:
        """Placement fields can be changed on pending jobs only."""
        return self in PLACEMENT_FIELDS


PLACEMENT_FIELDS = frozenset({JobField.SWITCHES, JobField.FEATURES, JobField.EXCLUDED_NODES, JobField.REQUIRED_NODES})
PLACEMENT_ORDER = tuple(sorted(PLACEMENT_FIELDS, key=lambda f: f.value))  # the order they are checked in
_FIELD_RANK = {f: i for i, f in enumerate(JobField)}


@dataclass(frozen=True)
class SwitchRequest:
    """Slurm's `Switches=COUNT@WAIT`; COUNT 0 means no constraint."""

    count: int
    wait_s: int | None = None


# int: SiteFactor, Priority, Nice. str: AdminComment, Features (""= none).
# SwitchRequest: Switches. tuple of node names: ExcNodeList, ReqNodeList (() = none).
# None (Priority only): hand the priority back to Slurm (hold + release).
FieldValue = Union[int, str, SwitchRequest, tuple[str, ...], None]


def placement_fields(placement: Placement) -> dict[JobField, FieldValue]:
    """The fields a wanted placement sets (the ones it leaves unset are not wanted)."""
    values: dict[JobField, FieldValue] = {}
    if placement.max_switches is not None:
        values[JobField.SWITCHES] = SwitchRequest(placement.max_switches, placement.switches_wait_s)
    if placement.features is not None:
        values[JobField.FEATURES] = placement.features
    if placement.exclude_nodes:
        values[JobField.EXCLUDED_NODES] = tuple(placement.exclude_nodes)
    if placement.require_nodes:
        values[JobField.REQUIRED_NODES] = tuple(placement.require_nodes)
    return values


def placement_value(placement: Placement, key: JobField) -> FieldValue:
    """What a job carrying `placement` holds in the placement field `key` (the unset value if none)."""
    if key is JobField.SWITCHES:
        return SwitchRequest(placement.max_switches or 0, placement.switches_wait_s if placement.max_switches else None)
    if key is JobField.FEATURES:
        return placement.features or ""
    if key is JobField.REQUIRED_NODES:
        return tuple(placement.require_nodes)
    return tuple(placement.exclude_nodes)


def with_placement_field(placement: Placement, key: JobField, value: FieldValue) -> Placement:
    """The placement after Slurm took `key=value` (the inverse of `placement_fields`)."""
    if key is JobField.SWITCHES:
        assert isinstance(value, SwitchRequest)
        return replace(placement, max_switches=value.count or None, switches_wait_s=value.wait_s if value.count else None)
    if key is JobField.FEATURES:
        return replace(placement, features=str(value) or None)
    if key is JobField.EXCLUDED_NODES:
        return replace(placement, exclude_nodes=tuple(value or ()))  # type: ignore[arg-type]
    if key is JobField.REQUIRED_NODES:
        return replace(placement, require_nodes=tuple(value or ()))  # type: ignore[arg-type]
    return placement


@dataclass(frozen=True)
class JobUpdate:
    """New values for some fields of one job, written together in one call."""

    job_id: int
    values: tuple[tuple[JobField, FieldValue], ...]

    @classmethod
    def of(cls, job_id: int, values: Mapping[JobField, FieldValue]) -> JobUpdate:
        items = tuple(values.items())
        # built for every pending job each cycle, almost always already in order: check, do not sort
        if all(_FIELD_RANK[a] < _FIELD_RANK[b] for (a, _), (b, _) in zip(items, items[1:])):
            return cls(job_id, items)
        return cls(job_id, tuple(sorted(items, key=lambda item: _FIELD_RANK[item[0]])))

    @property
    def fields(self) -> tuple[JobField, ...]:
        return tuple(f for f, _ in self.values)

    def get(self, wanted: JobField) -> FieldValue:
        for key, value in self.values:
            if key is wanted:
                return value
        raise KeyError(wanted)
