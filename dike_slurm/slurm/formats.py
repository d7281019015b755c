"""Which JSON a Slurm prints, and small table-driven adapters from each format to one shape.

Slurm's `--json` output is written by a versioned data_parser plugin, named in the `meta`
block of every document:

* 22.05 prints openapi v0.0.38 (`meta.plugin.type` = `openapi/v0.0.38`, sacct `openapi/dbv0.0.38`);
* 23.11 to 24.11 print data_parser v0.0.40 to v0.0.42 (`meta.plugin.data_parser`), 25.x
  v0.0.43/44 and 26.05 v0.0.45, all of the same family.

The two families differ in the few fields the engine reads (checked on real 22.05.8 and 24.11.5
output, tests/fixtures/slurm-VERSION/; 26.05.5 prints what 24.11.5 does):

| what | v0.0.38 (22.05) | v0.0.40+ (24.11) |
|---|---|---|
| squeue `job_state` | `"RUNNING"` | `["RUNNING"]` (base state, then flags) |
| numbers | plain | `{"set", "infinite", "number"}` |
| nodes | `sinfo --json` `nodes`: one per node | `sinfo --json` groups nodes: `scontrol show nodes --json` |
| node `state` | `"idle"` + `state_flags` | `["IDLE", "DRAIN"]` |
| node features | `"a,b"` | `["a", "b"]` |
| sacct `state.current` | `"REQUEUED"` | `["PENDING", "REQUEUED"]` |
| sacct pending array `array.task` | `"0-2"` | `"0x7"` (a bitmap) |

A document whose format is not in FORMATS, that lacks the list the engine reads, or that holds
a job state this module does not know, is a FormatError: one line naming the command and what
is wrong. Nothing is ever read as "no jobs" because its shape changed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dike_slurm.errors import SlurmError


class FormatError(SlurmError):
    """Slurm printed JSON in a format (or with a value) this version of dike-slurm cannot read."""


@dataclass(frozen=True)
class SlurmFormat:
    """One family of Slurm's JSON output and how to read it."""

    family: str  # "v0.0.38" or "v0.0.40+"
    nodes_argv: tuple[str, ...]  # the command (after its name) that lists one record per node
    nodes_command: str  # its program: sinfo or scontrol
    state_lists: bool  # job/node states are lists (base state first, then flags)


LEGACY = SlurmFormat("v0.0.38", ("--json",), "sinfo", False)
MODERN = SlurmFormat("v0.0.40+", ("show", "nodes", "--json"), "scontrol", True)

# data_parser version -> (format, the Slurm release whose real output is in tests/fixtures, or
# "" where the version is read by its family's rules but was not met on a real cluster).
# v0.0.39 (23.02) is not listed: its output is refused with a clear error, not guessed at.
FORMATS: Mapping[str, tuple[SlurmFormat, str]] = {
    "v0.0.38": (LEGACY, "22.05.8"),
    "dbv0.0.38": (LEGACY, "22.05.8"),
    "v0.0.40": (MODERN, ""),
    "v0.0.41": (MODERN, ""),
    "v0.0.42": (MODERN, "24.11.5"),
    "v0.0.43": (MODERN, ""),
    "v0.0.44": (MODERN, ""),
    "v0.0.45": (MODERN, "26.05.5"),
}

# Slurm's job base states and state flags (https://slurm.schedmd.com/job_state_codes.html).
JOB_BASE_STATES = frozenset({
    "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
    "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
})
JOB_STATE_FLAGS = frozenset({
    "COMPLETING", "CONFIGURING", "EXPEDITING", "LAUNCH_FAILED", "POWER_UP_NODE", "RECONFIG_FAIL",
    "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "REQUEUE_CRON", "RESIZING", "RESV_DEL_HOLD", "REVOKED",
    "SIGNALING", "SPECIAL_EXIT", "STAGE_OUT", "STOPPED", "UPDATE_DB",
})
# Flags that sacct and squeue print instead of the base state (as `sacct --parsable2` does).
_SHOWN_FLAGS = ("REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT", "REVOKED", "RESV_DEL_HOLD")

_VERSION = re.compile(r"(db)?v\d+\.\d+\.\d+$")


def detect(document: Mapping[str, Any], command: str) -> SlurmFormat:
    """The format of one `--json` document, from its `meta` block; FormatError if unknown."""
    meta = document.get("meta")
    if not isinstance(meta, dict):
        raise FormatError(f"{command}: no \"meta\" block in the JSON: cannot tell which Slurm format it is")
    plugin = meta.get("plugin") if isinstance(meta.get("plugin"), dict) else {}
    name = str(plugin.get("data_parser") or plugin.get("type") or "")
    match = _VERSION.search(name)
    found = FORMATS.get(match.group(0)) if match else None
    if found is None:
        release = slurm_release(document) or "unknown"
        known = ", ".join(sorted(FORMATS))
        raise FormatError(
            f"{command}: Slurm {release} printed JSON format {name or 'with no name'!r}, which this "
            f"dike-slurm cannot read (it reads {known})"
        )
    return found[0]


def slurm_release(document: Mapping[str, Any]) -> str | None:
    """`22.05.8` from `meta.Slurm.release` (v0.0.38) or `meta.slurm.release` (v0.0.40+)."""
    meta = document.get("meta")
    if not isinstance(meta, dict):
        return None
    for key in ("slurm", "Slurm"):
        block = meta.get(key)
        if isinstance(block, dict) and isinstance(block.get("release"), str):
            return block["release"]
    return None


def entries(document: Mapping[str, Any], key: str, command: str) -> list[Any]:
    """The top-level list `key`; FormatError when it is missing or not a list."""
    items = document.get(key)
    if not isinstance(items, list):
        present = ", ".join(sorted(str(k) for k in document)) or "nothing"
        raise FormatError(f"{command}: no {key!r} list at the top level of its JSON (it has: {present})")
    return items


def _words(value: Any) -> list[str]:
    if isinstance(value, str):
        return [w for w in value.replace("+", " ").split() if w]
    if isinstance(value, list):
        return [w for w in value if isinstance(w, str)]
    return []


def job_base_state(value: Any) -> str:
    """The base state of a job (`"RUNNING"` or `["PENDING", "REQUEUED"]` -> PENDING).

    Raises ValueError naming the value when it holds no base state or a word Slurm does not
    document (the caller turns that into an error: a job never silently becomes OTHER).
    """
    if type(value) is str and value in JOB_BASE_STATES:  # the common cases first: once per job
        return value
    if type(value) is list and len(value) == 1 and value[0] in JOB_BASE_STATES:
        return value[0]
    words = [w.upper() for w in _words(value)]
    unknown = [w for w in words if w not in JOB_BASE_STATES and w not in JOB_STATE_FLAGS]
    if unknown:
        raise ValueError(f"unknown job state {unknown[0]!r}")
    for word in words:
        if word in JOB_BASE_STATES:
            return word
    if words:  # a flag alone (22.05 squeue prints e.g. "COMPLETING" when that is all it knows)
        return words[0]
    raise ValueError(f"no job state in {value!r}")


def sacct_state_text(value: Any) -> str:
    """sacct's state as `sacct --parsable2` prints it: a shown flag (REQUEUED) wins over the base state."""
    if isinstance(value, str):
        return value
    words = [w.upper() for w in _words(value)]
    for flag in _SHOWN_FLAGS:
        if flag in words:
            return flag
    for word in words:
        if word in JOB_BASE_STATES:
            return word
    return " ".join(words)


def node_state(entry: Mapping[str, Any]) -> str:
    """A node's state words joined with '+' (`IDLE+DRAIN`), from either family's fields."""
    state = entry.get("state")
    if isinstance(state, list):
        words = [str(w).upper() for w in state if isinstance(w, str)]
    else:
        words = [state.upper()] if isinstance(state, str) and state else []
        words += [str(f).upper() for f in entry.get("state_flags") or [] if isinstance(f, str)]
    return "+".join(words or ["UNKNOWN"])


def feature_list(value: Any) -> tuple[str, ...]:
    """Node features: `"a,b"` (v0.0.38) or `["a", "b"]` (v0.0.40+)."""
    if isinstance(value, str):
        return tuple(f for f in value.split(",") if f)
    if isinstance(value, list):
        return tuple(f for f in value if isinstance(f, str) and f)
    return ()


def array_task_text(value: Any) -> str:
    """The pending tasks of an array as a range list: `"0-2"` as is, the bitmap `"0x7"` as `"0-2"`."""
    if not isinstance(value, str):
        return ""
    if not value.lower().startswith("0x"):
        return value
    try:
        bits = int(value, 16)
    except ValueError:
        return value
    ranges: list[str] = []
    index = 0
    while bits:
        if bits & 1:
            start = index
            while bits & 1:
                bits >>= 1
                index += 1
            ranges.append(str(start) if index - 1 == start else f"{start}-{index - 1}")
        else:
            bits >>= 1
            index += 1
    return ",".join(ranges)


@dataclass
class ReadCount:
    """What one command printed and what became of it: every entry is read, left out (with a
    reason the engine expects, e.g. a finished job) or unreadable (counted by reason)."""

    command: str
    printed: int = 0
    read: int = 0
    left_out: int = 0
    unreadable: dict[str, int] | None = None

    def skip(self, reason: str) -> None:
        self.unreadable = self.unreadable or {}
        self.unreadable[reason] = self.unreadable.get(reason, 0) + 1

    def check(self, what: str) -> None:
        """FormatError unless every printed entry was read or deliberately left out."""
        unreadable = sum((self.unreadable or {}).values())
        if unreadable or self.read + self.left_out != self.printed:
            counted = sorted((self.unreadable or {}).items(), key=lambda item: (-item[1], item[0]))
            reasons = "; ".join(f"{n} x {r}" for r, n in counted[:3]) + ("; ..." if len(counted) > 3 else "")
            raise FormatError(
                f"{self.command}: Slurm printed {self.printed} {what} but only {self.read + self.left_out} "
                f"could be read ({reasons or 'count mismatch'}); nothing is written this cycle"
            )
