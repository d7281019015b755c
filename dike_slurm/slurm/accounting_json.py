"""Reading `sacct --json` dumps into run records, and `read_sacct_file`, which reads a dump file
of either format (dike_slurm/slurm/accounting.py: the records and the parsable2 reader)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any, BinaryIO

from dike_slurm.slurm.accounting import AccountingRecord, ReadResult, RowCaches, RowError, read_parsable2_lines
from dike_slurm.errors import InputError
from dike_slurm.domain.model import JobState
from dike_slurm.slurm.formats import (
    JOB_BASE_STATES,
    JOB_STATE_FLAGS,
    FormatError,
    array_task_text,
    detect,
    sacct_state_text,
)


def read_sacct_json(text: str, source: str) -> ReadResult:
    """Read `sacct --json` output: `{"meta": ..., "jobs": [...]}` of Slurm 22.05 (openapi
    dbv0.0.38) or 23.11 to 26.05 (data_parser v0.0.40+; see dike_slurm.slurm.formats).

    A format the `meta` block does not name as known is an InputError; an entry with a job
    state Slurm does not document is skipped and counted under its reason.
    """
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg}", source=source, line=exc.lineno) from None
    if not isinstance(document, dict) or not isinstance(document.get("jobs"), list):
        raise InputError('not sacct --json output: no "jobs" list at the top level', source=source)
    try:
        detect(document, "sacct --json")
    except FormatError as exc:
        raise InputError(str(exc), source=source) from None
    caches = RowCaches()
    records: list[AccountingRecord] = []
    skipped: Counter[str] = Counter()
    first_index: dict[str, int] = {}
    for index, job in enumerate(document["jobs"]):
        try:
            if not isinstance(job, dict):
                raise RowError("job entry is not an object")
            records.append(_record_from_json(job, caches))
        except RowError as exc:
            reason = str(exc)
            skipped[reason] += 1
            first_index.setdefault(reason, index)
    # For JSON the "line" of a skipped entry is its index in the jobs list.
    return ReadResult(tuple(records), len(document["jobs"]), dict(sorted(skipped.items())), source, first_index,
                      has_comment=True)


def _json_int(value: Any, what: str, *, zero_is_none: bool = False) -> int | None:
    """Integers as v0.0.38 prints them; newer plugins wrap them as {"set", "infinite", "number"}."""
    if isinstance(value, dict):
        if value.get("infinite"):
            return None
        if not value.get("set", True):
            return None
        value = value.get("number")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RowError(f"bad {what}")
    if isinstance(value, float) and not math.isfinite(value):  # json.loads accepts NaN and Infinity
        raise RowError(f"bad {what}: {value}")
    number = int(value)
    return None if zero_is_none and number == 0 else number


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _json_gpu_types(items: Any) -> tuple[str, ...]:
    """The GPU types a list of {type, name, count} TRES entries names (`gpu:a100`), sorted."""
    if not isinstance(items, list):
        return ()
    return tuple(sorted({item["name"][len("gpu:"):] for item in items if isinstance(item, dict)
                         and item.get("type") == "gres" and isinstance(item.get("name"), str)
                         and item["name"].startswith("gpu:")}))


def _json_tres(items: Any) -> tuple[int, int, int]:
    """(gpus, cpus, nodes) from a list of {type, name, count} TRES entries."""
    gpus_untyped: int | None = None
    gpus_typed = cpus = nodes = 0
    if not isinstance(items, list):
        return 0, 0, 0
    for item in items:
        if not isinstance(item, dict):
            continue
        kind, name, count = item.get("type"), item.get("name"), item.get("count")
        if not isinstance(count, int) or isinstance(count, bool):
            continue
        if kind == "cpu":
            cpus = count
        elif kind == "node":
            nodes = count
        elif kind == "gres" and isinstance(name, str):
            if name == "gpu":
                gpus_untyped = count
            elif name.startswith("gpu:"):
                gpus_typed += count
    return (gpus_untyped if gpus_untyped is not None else gpus_typed), cpus, nodes


def _record_from_json(job: dict[str, Any], caches: RowCaches) -> AccountingRecord:
    job_id = _json_int(job.get("job_id"), "job_id")
    if job_id is None:
        raise RowError("no job_id")
    array = job.get("array") if isinstance(job.get("array"), dict) else {}
    array_job_id = _json_int(array.get("job_id"), "array.job_id", zero_is_none=True)
    array_task_id = _json_int(array.get("task_id"), "array.task_id")
    tasks = array_task_text(array.get("task"))  # a pending array's tasks: "0-2", or the bitmap "0x7"
    if array_job_id is not None and array_task_id is not None:
        display = f"{array_job_id}_{array_task_id}"
    elif array_job_id is not None and tasks:
        display = f"{array_job_id}_[{tasks}]"
    else:
        display = str(job_id)
    state = job.get("state")
    current = state.get("current") if isinstance(state, dict) else state
    state_text = _json_text(sacct_state_text(current) if isinstance(current, list) else current)
    if not state_text:
        raise RowError("empty State")
    word = state_text.split(" ", 1)[0].upper()
    if word not in JOB_BASE_STATES and word not in JOB_STATE_FLAGS:
        raise RowError(f"unknown job state {word[:40]!r}")
    times = job.get("time") if isinstance(job.get("time"), dict) else {}
    submit = _json_int(times.get("submission"), "time.submission", zero_is_none=True)
    if submit is None:
        raise RowError("no Submit time")
    eligible = _json_int(times.get("eligible"), "time.eligible", zero_is_none=True)
    start = _json_int(times.get("start"), "time.start", zero_is_none=True)
    end = _json_int(times.get("end"), "time.end", zero_is_none=True)
    elapsed = _json_int(times.get("elapsed"), "time.elapsed") or 0
    limit_min = _json_int(times.get("limit"), "time.limit")
    tres = job.get("tres") if isinstance(job.get("tres"), dict) else {}
    alloc = _json_tres(tres.get("allocated"))
    requested = _json_tres(tres.get("requested"))
    used = alloc if start is not None and (alloc[0] or alloc[2]) else requested  # as for parsable2
    node_text = _json_text(job.get("nodes"))
    nodes = caches.hostlist(node_text.strip())
    if start is not None and not nodes and not (alloc[0] or alloc[2]) and elapsed <= 0:
        start = None  # start = end for a job cancelled while pending
    num_nodes = _json_int(job.get("allocation_nodes"), "allocation_nodes") or used[2] or requested[2] or len(nodes) or 1
    required = job.get("required") if isinstance(job.get("required"), dict) else {}
    cpus = used[1] or requested[1] or _json_int(required.get("CPUs"), "required.CPUs") or 1
    flags = job.get("flags")
    comment = job.get("comment")
    text = caches.text
    return AccountingRecord(
        job_id=job_id,
        display_id=display,
        array_job_id=array_job_id,
        array_task_id=array_task_id,
        name=_json_text(job.get("name")),
        user=text(_json_text(job.get("user"))),
        account=text(_json_text(job.get("account"))),
        partition=text(_json_text(job.get("partition"))),
        qos=text(_json_text(job.get("qos"))),
        state=JobState.parse(state_text),
        state_text=text(state_text),
        submit=float(submit),
        eligible=float(eligible) if eligible is not None else None,
        start=float(start) if start is not None else None,
        end=float(end) if end is not None else None,
        elapsed_s=max(0, elapsed),
        time_limit_s=limit_min * 60 if limit_min is not None else None,
        num_nodes=num_nodes,
        cpus=cpus,
        gpus=used[0],
        nodes=nodes,
        priority=_json_int(job.get("priority"), "priority"),
        flags=text(",".join(str(f) for f in flags) if isinstance(flags, list) else ""),
        comment=_json_text(comment.get("job") if isinstance(comment, dict) else comment),
        gpu_types=_json_gpu_types(tres.get("requested")),
        alloc_gpu_types=_json_gpu_types(tres.get("allocated")),
        constraints=text(_json_text(job.get("constraints")).strip()),
    )


def read_sacct_file(path: Path) -> ReadResult:
    """Read a dump file, JSON or parsable2 (sniffed from its first character).

    A parsable2 dump is read line by line: a year of history (a million rows, 300 MB) is never
    held in memory as text, only as records.
    """
    try:
        with path.open("rb") as handle:
            if _first_character(handle) in ("{", "["):
                return read_sacct_json(handle.read().decode("utf-8", errors="replace"), str(path))
            # Binary lines split at b"\n" only, as str.split("\n") does; no UTF-8 sequence
            # contains that byte, so decoding line by line gives the same text as decoding it whole.
            lines = (raw.decode("utf-8", errors="replace").removesuffix("\n") for raw in handle)
            return read_parsable2_lines(lines, str(path))
    except FileNotFoundError:
        raise InputError("no such file", source=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", source=str(path)) from None


def _first_character(handle: BinaryIO) -> str:
    """The first character that is not a BOM or white space (the handle is rewound)."""
    start = handle.read(4096).decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")[:1]
    handle.seek(0)
    return start
