"""Slurm's options as `scontrol show config` prints them, and the SchedulerParameters among them.

Keys are lower-cased: slurm.conf's parameter names are case-insensitive, and Slurm looks the
SchedulerParameters words up case-insensitively too.
"""

from __future__ import annotations

from collections.abc import Mapping

from dike_slurm.errors import InputError

DEFAULT_BF_MAX_JOB_TEST = 500
DEFAULT_QUEUE_DEPTH = 100
DEFAULT_DEPTH = DEFAULT_BF_MAX_JOB_TEST  # the depth of a site whose SchedulerParameters set none of these


def parse_show_config(text: str) -> dict[str, str]:
    """`scontrol show config` as {key lower-case: value}.

    Lines are `Key = value` (the key padded with spaces); Slurm prints `(null)` for an unset
    value, read as "". The first occurrence of a key wins: slurm.conf's options come first, the
    plugins' own sections (cgroup, MPI, ...) after them.
    """
    options: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key or " " in key:
            continue
        value = value.strip()
        options.setdefault(key.lower(), "" if value == "(null)" else value)
    return options


def option_int(value: str, key: str, source: str | None = None, line: int | None = None) -> int:
    """An integer `key=value`, or an InputError naming the key and the value."""
    try:
        return int(value)
    except ValueError:
        raise InputError(f"{key}={value!r} is not an integer", source=source, line=line) from None


def scheduler_parameters(raw: str) -> dict[str, str]:
    """`SchedulerParameters=a=1,b,c=2` as {key lower-case: value} (flags map to ""). An option given
    twice reads as its first value: Slurm finds each option with a search from the start of the
    string (`xstrcasestr(sched_params, "bf_max_job_test=")` in backfill.c)."""
    parameters: dict[str, str] = {}
    for item in raw.split(","):
        key, _, value = item.strip().partition("=")
        if key:
            parameters.setdefault(key.lower(), value.strip())
    return parameters


def _count(parameters: Mapping[str, str], key: str, default: int) -> int:
    """A whole-number parameter, Slurm's default when absent; anything else is an InputError."""
    raw = parameters.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise InputError(f"SchedulerParameters {key}={raw!r} is not a whole number")
    return value


def scheduler_depth(parameters: Mapping[str, str]) -> int:
    """How many pending jobs of one partition Slurm's passes look at: backfill's
    `bf_max_job_test` (capped by `bf_max_job_part`), or `default_queue_depth` if it is larger."""
    backfill = _count(parameters, "bf_max_job_test", DEFAULT_BF_MAX_JOB_TEST)
    per_partition = _count(parameters, "bf_max_job_part", 0)
    if per_partition:
        backfill = min(backfill, per_partition)
    return max(backfill, _count(parameters, "default_queue_depth", DEFAULT_QUEUE_DEPTH), 1)
