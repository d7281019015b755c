"""Job updates as lines on the stdin of one `scontrol`, and each line's outcome read back.

One `scontrol` reading `update JobId=N Key=Value ...` lines costs about a tenth of the client
CPU of one process per job (docs/engine.md, "Writes"). What scontrol does with such lines
(measured on the lab's Slurm 22.05, 24.11 and 26.05; pinned by tests/integration/test_faults.py):

- each line is one command, its words split on whitespace; quotes are kept in the value
  (`AdminComment="a b"` stores the quotes), so a value with whitespace, a quote or a control
  character cannot be a line: that update goes as a process of its own (argv, no shell);
- a failed update prints `<Slurm's message> for job N` on stderr, the lines after it still run,
  and the exit code is 1 at the end;
- `SiteFactor=abc` sets 0 and exits 0: integer fields are checked here before anything is sent;
- the lines are echoed on stdout (readline), which is not read.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from dike_slurm.domain.fields import FieldValue, JobField, JobUpdate, SwitchRequest
from dike_slurm.parsing.durations import format_duration
from dike_slurm.slurm.backends.base import WriteOutcome

MAX_LINE = 1024  # longer lines go alone: scontrol's own line buffer is not a limit we want to find
INTEGER_FIELDS = frozenset({JobField.SITE_FACTOR, JobField.PRIORITY, JobField.NICE})
# stderr of scontrol when the job ended or started meanwhile: not an engine failure
JOB_GONE = ("Invalid job id specified", "Job has already finished", "no longer pending")
_UNSAFE = re.compile(r"[\s\x00-\x1f\x7f'\"]")
_FOR_JOB = re.compile(r"^.*\S\s+for job (?P<job>\d+)$")


def refused(update: JobUpdate) -> str | None:
    """Why this update must not be sent at all (Slurm would read the value as 0), or None."""
    for key, value in update.values:
        if key in INTEGER_FIELDS and not (value is None and key is JobField.PRIORITY):
            if isinstance(value, bool) or not isinstance(value, int):
                return f"refused: {key.value}={value!r} is not an integer (Slurm would set 0)"
    return None


def value_text(value: FieldValue) -> str:
    """A field's value as scontrol reads it after `Key=`."""
    if isinstance(value, SwitchRequest):
        text = str(value.count)
        if value.count and value.wait_s is not None:
            text += "@" + format_duration(value.wait_s)
        return text
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def update_line(update: JobUpdate) -> str | None:
    """The stdin line for this update, or None when it must go as a process of its own (a value
    with whitespace, a quote or a control character, a Priority handed back, a line too long)."""
    words = [f"JobId={update.job_id}"]
    for key, value in update.values:
        if value is None:
            return None
        text = value_text(value)
        if _UNSAFE.search(text):
            return None
        words.append(f"{key.value}={text}")
    line = "update " + " ".join(words)
    return line if len(words) > 1 and len(line) <= MAX_LINE else None


def fed_command(scontrol: str, line: str) -> str:
    """How the audit shows a line fed to scontrol: a command an admin can run again."""
    return f"echo {shlex.quote(line)} | {shlex.quote(scontrol)}"


def stdin_text(lines: Sequence[str]) -> str:
    return "".join(line + "\n" for line in lines)


def outcomes(
    job_ids: Sequence[int], lines: Sequence[str], scontrol: str, returncode: int | None, stderr: str,
    killed_after: float | None = None,
) -> list[WriteOutcome | None]:
    """Each line's outcome from scontrol's stderr and exit code; None where it cannot be told
    (a stray message, an exit code no line explains): the caller writes that one again alone.

    `job_ids[i]` is the job of `lines[i]`, each job once. `killed_after`: scontrol was killed
    after that many seconds (the cycle deadline); a line without an error is then unconfirmed.
    """
    errors: dict[int, str] = {}
    stray = []
    batch = set(job_ids)
    for raw in stderr.splitlines():
        text = " ".join(raw.split())
        if not text:
            continue
        match = _FOR_JOB.match(text)
        if match and int(match["job"]) in batch and int(match["job"]) not in errors:
            errors[int(match["job"])] = text  # as a process of its own reports it
        else:
            stray.append(text)
    unexplained = bool(stray) or (killed_after is None and returncode != 0 and not errors)
    results: list[WriteOutcome | None] = []
    for job_id, line in zip(job_ids, lines):
        command = fed_command(scontrol, line)
        message = errors.get(job_id)
        if message is not None:
            results.append(WriteOutcome(False, command, message, job_gone=any(m in message for m in JOB_GONE)))
        elif killed_after is not None:
            results.append(WriteOutcome(
                False, command, f"unconfirmed: scontrol was killed after {killed_after:.3g}s with this line unanswered"))
        elif unexplained:
            results.append(None)
        else:
            results.append(WriteOutcome(True, command))
    return results


@dataclass(frozen=True)
class Round:
    """Part of `apply_many`'s updates: the lines fed to one scontrol (`fed`: indexes into the
    updates, each job once) and the updates written one process each after it, in order."""

    fed: tuple[int, ...]
    lines: tuple[str, ...]
    alone: tuple[int, ...]


def rounds(updates: Sequence[JobUpdate]) -> list[Round]:
    """Round k holds each job's k-th update, so a job's updates are written in their order; in a
    round, an update without a line goes alone, after the fed ones."""
    occurrence: dict[int, int] = {}
    parts: list[tuple[list[int], list[str], list[int]]] = []
    for i, update in enumerate(updates):
        k = occurrence.get(update.job_id, 0)
        occurrence[update.job_id] = k + 1
        if k == len(parts):
            parts.append(([], [], []))
        fed, lines, alone = parts[k]
        line = update_line(update)
        if line is None:
            alone.append(i)
        else:
            fed.append(i)
            lines.append(line)
    return [Round(tuple(fed), tuple(lines), tuple(alone)) for fed, lines, alone in parts]
