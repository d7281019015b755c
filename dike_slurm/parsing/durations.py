"""Slurm durations and timestamps as printed by sacct, squeue and scontrol."""

from __future__ import annotations

import functools
import re
from datetime import datetime, timezone

from dike_slurm.errors import InputError

UNLIMITED_WORDS = frozenset({"UNLIMITED", "INFINITE", "PARTITION_LIMIT", "NONE", ""})

# Slurm time formats (sbatch(1) --time): "minutes", "minutes:seconds", "hours:minutes:seconds",
# "days-hours", "days-hours:minutes", "days-hours:minutes:seconds". sacct adds fractional
# seconds to some fields (e.g. "00:00:01.234").
_DURATION = re.compile(
    r"^(?:(?P<days>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+(?:\.\d+)?))?$"
)


@functools.lru_cache(maxsize=4096)  # every pending job's Wait4Switch, mostly the same few strings
def parse_duration(text: str) -> int | None:
    """Seconds for a Slurm duration; None for UNLIMITED / Partition_Limit / INFINITE."""
    raw = text.strip()
    if raw.upper() in UNLIMITED_WORDS:
        return None
    match = _DURATION.match(raw)
    if not match:
        raise InputError(f"not a Slurm duration: {text!r}")
    days = int(match["days"]) if match["days"] else 0
    a, b, c = match["a"], match["b"], match["c"]
    parts = [x for x in (a, b, c) if x is not None]
    if match["days"] is not None:
        # days-hours[:minutes[:seconds]]
        hours = int(parts[0])
        minutes = int(parts[1]) if len(parts) > 1 else 0
        seconds = float(parts[2]) if len(parts) > 2 else 0.0
    elif len(parts) == 1:
        hours, minutes, seconds = 0, int(parts[0]), 0.0
    elif len(parts) == 2:
        hours, minutes, seconds = 0, int(parts[0]), float(parts[1])
    else:
        hours, minutes, seconds = int(parts[0]), int(parts[1]), float(parts[2])
    return int(round(((days * 24 + hours) * 60 + minutes) * 60 + seconds))


def format_duration(seconds: int | None) -> str:
    """The inverse of parse_duration in Slurm's own [D-]HH:MM:SS form."""
    if seconds is None:
        return "UNLIMITED"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


_UNSET_TIMES = frozenset({"UNKNOWN", "NONE", "N/A", ""})


def parse_timestamp(text: str) -> float | None:
    """Epoch seconds for a Slurm timestamp (`2026-01-05T10:00:00`, local time taken as UTC).

    None for `Unknown`, `None`, `N/A`. Slurm prints local time without a zone; the replay only
    needs differences, so UTC is assumed consistently.
    """
    raw = text.strip()
    if raw.upper() in _UNSET_TIMES:
        return None
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise InputError(f"not a Slurm timestamp: {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def format_timestamp(epoch: float) -> str:
    """Slurm's timestamp format for epoch seconds (UTC)."""
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
