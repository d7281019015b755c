"""Slurm job field values compared and shown: whether Slurm holds a wanted value, whether a
placement field is unused, and a value as the audit and the commands print it."""

from __future__ import annotations

from dike_slurm.domain.fields import FieldValue, JobField, SwitchRequest


def values_match(key: JobField, current: FieldValue, wanted: FieldValue) -> bool:
    """Whether Slurm holds the wanted value (Slurm caps a Switches wait at max_switch_wait)."""
    if key is JobField.SWITCHES:
        assert isinstance(current, SwitchRequest) and isinstance(wanted, SwitchRequest)
        if current.count != wanted.count:
            return False
        if not wanted.count or wanted.wait_s is None or current.wait_s is None:
            return True
        return current.wait_s <= wanted.wait_s
    if key in (JobField.EXCLUDED_NODES, JobField.REQUIRED_NODES):
        return set(current or ()) == set(wanted or ())  # type: ignore[arg-type]
    return current == wanted


def is_unset(key: JobField, value: FieldValue) -> bool:
    """A placement field the job does not use (no user request to preserve)."""
    if key is JobField.SWITCHES:
        return isinstance(value, SwitchRequest) and value.count == 0
    return not value


def describe_value(value: FieldValue) -> str:
    if isinstance(value, SwitchRequest):
        return f"{value.count}@{value.wait_s}s" if value.count and value.wait_s is not None else str(value.count)
    if isinstance(value, tuple):
        return ",".join(value) or "''"
    if value is None:
        return "(Slurm's own)"
    return repr(value) if isinstance(value, str) else str(value)
