"""Reading Slurm job accounting (`sacct --parsable2` and `sacct --json` dumps) into run records.

One `AccountingRecord` is one allocation record: one run of a job. A requeued job has one
record per run only when the dump was taken with `--duplicates`, in either format (without it,
Slurm 24.11's JSON holds only the last run; 22.05's happened to hold them all).
Job steps (`123.batch`, `123.0`, `123.extern`) are not runs and are skipped; so is every row
that cannot be read, each counted under its reason in `ReadResult.skipped`.

Columns (parsable2 header names, any order, any case; extra columns are ignored):

* required: `JobID` or `JobIDRaw` (at least one), `User`, `State`, `Submit`, `Start`,
  one of `End` / `ElapsedRaw` / `Elapsed`, one of `AllocTRES` / `ReqTRES`.
* optional: `JobName`, `Account`, `Partition`, `QOS`, `Eligible`, `Timelimit` (missing:
  unlimited), `NNodes`, `NCPUS`, `NodeList`, `Priority`, `Flags`, `Comment`.

The parser is the standard library's `str.split`: measured against pandas `read_csv` on a
million-row dump (bench/accounting_read.py), it is faster once each row is turned into a
record, and it can repair rows whose job name or comment contains the `|` separator (sacct
does not escape it).

The JSON reader and `read_sacct_file` (a dump file of either format) are in
dike_slurm/slurm/accounting_json.py; both readers share the record type, the per-read caches
(interned users, parsed TRES), the row-level error type and the skip counting defined here.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from dike_slurm.domain.model import JobState
from dike_slurm.errors import InputError
from dike_slurm.parsing.durations import parse_duration, parse_timestamp
from dike_slurm.parsing.hostlists import expand_hostlist
from dike_slurm.parsing.tres import Tres, parse_tres
from dike_slurm.slurm.formats import JOB_BASE_STATES, JOB_STATE_FLAGS


@dataclass(frozen=True, slots=True)
class AccountingRecord:
    """One allocation record (one run of a job) as sacct reports it; times in epoch seconds."""

    job_id: int  # JobIDRaw: unique per array task
    display_id: str = ""  # JobID as sacct prints it: `123`, `123_4`, `123_[5-9]`
    array_job_id: int | None = None
    array_task_id: int | None = None
    name: str = ""
    user: str = ""
    account: str = ""
    partition: str = ""
    qos: str = ""
    state: JobState = JobState.OTHER
    state_text: str = ""  # e.g. `CANCELLED by 1234`
    submit: float | None = None
    eligible: float | None = None
    start: float | None = None  # None: never started
    end: float | None = None  # None: still running (or pending)
    elapsed_s: int = 0
    time_limit_s: int | None = None  # None: UNLIMITED or Partition_Limit
    num_nodes: int = 1
    cpus: int = 1
    gpus: int = 0  # AllocTRES when the run started, else ReqTRES
    nodes: tuple[str, ...] = ()
    priority: int | None = None
    flags: str = ""
    comment: str = ""
    gpu_types: tuple[str, ...] = ()  # the GPU types ReqTRES names (gres/gpu:a100=4); () for any
    alloc_gpu_types: tuple[str, ...] = ()  # the GPU types the run held (AllocTRES), what Slurm bills
    constraints: str = ""  # the job's feature constraint (--constraint), "" when none or not dumped

    @property
    def ran(self) -> bool:
        """The record is a run that started (it has a start time)."""
        return self.start is not None


@dataclass(frozen=True)
class ReadResult:
    """The records of a dump, the number of data rows read, and the rows skipped by reason."""

    records: tuple[AccountingRecord, ...]
    rows: int
    skipped: dict[str, int]
    source: str
    first_skipped_line: dict[str, int] = field(default_factory=dict)  # reason -> first line number
    has_comment: bool = False  # the dump carries the jobs' Comment (sacct --json always does)


# Skip reasons (the keys of ReadResult.skipped).
SKIP_STEP = "job step (not an allocation)"
SKIP_FIELD_COUNT = "wrong number of fields"
SKIP_REPEATED_HEADER = "repeated header row"
SKIP_NO_ARRAY_RAW_ID = "array task without JobIDRaw"

_FREE_TEXT_COLUMNS = frozenset(
    {"jobname", "comment", "admincomment", "systemcomment", "workdir", "submitline", "constraints", "wckey", "reason"}
)
_JOB_ID = re.compile(
    r"^(?P<base>\d+)"
    r"(?:_(?:(?P<task>\d+)|\[(?P<range>[^\]]*)\]))?"
    r"(?:\+(?P<het>\d+))?"
    r"(?:\.(?P<step>.+))?$"
)
_EPOCH = datetime(1970, 1, 1)


def _timestamp(text: str) -> float | None:
    """parse_timestamp with a fast path for the usual `2026-01-05T10:00:00` form."""
    if text[:1].isdigit():
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return parse_timestamp(text)  # raises the parser's own message
        if moment.tzinfo is None:
            return (moment - _EPOCH).total_seconds()
        return moment.timestamp()
    return parse_timestamp(text)


class RowError(Exception):
    """A row that cannot be read: the message is the skip reason."""


V = TypeVar("V")


def _memoised(cache: dict[str, V], parse: Callable[[str], V], text: str, column: str) -> V:
    """parse(text), kept in cache; a value the parser refuses is a RowError naming the column."""
    try:
        return cache[text]
    except KeyError:
        pass
    try:
        value = parse(text)
    except InputError:
        raise RowError(f"bad {column}") from None
    cache[text] = value
    return value


class RowCaches:
    """Memoised parses of the values that repeat across rows (limits, TRES, node lists)."""

    def __init__(self) -> None:
        self.durations: dict[str, int | None] = {}
        self.tres: dict[str, Tres] = {}
        self.hosts: dict[str, tuple[str, ...]] = {}
        self.strings: dict[str, str] = {}
        self.states: dict[str, JobState] = {}

    def duration(self, text: str, column: str) -> int | None:
        return _memoised(self.durations, parse_duration, text, column)

    def parse_tres(self, text: str, column: str) -> Tres:
        return _memoised(self.tres, parse_tres, text, column)

    def hostlist(self, text: str) -> tuple[str, ...]:
        try:
            return self.hosts[text]
        except KeyError:
            pass
        try:
            value = tuple(sys.intern(h) for h in expand_hostlist(text))
        except InputError:
            raise RowError("bad NodeList") from None
        self.hosts[text] = value
        return value

    def state(self, text: str) -> JobState:
        try:
            return self.states[text]
        except KeyError:
            value = self.states[text] = JobState.parse(text)
            return value

    def text(self, value: str) -> str:
        """One shared copy of repeated strings (users, accounts, states) to keep memory low."""
        return self.strings.setdefault(value, value)


def _parse_job_id(display: str, raw: str | None) -> tuple[int, int | None, int | None, bool]:
    """(job_id, array_job_id, array_task_id, is_step) from JobID and JobIDRaw."""
    match = _JOB_ID.match(display) if display else None
    raw_match = _JOB_ID.match(raw) if raw else None
    if match is None and raw_match is None:
        raise RowError("bad JobID")
    is_step = bool((match and match["step"]) or (raw_match and raw_match["step"]))
    array_job_id = array_task_id = None
    if match is not None and (match["task"] is not None or match["range"] is not None):
        array_job_id = int(match["base"])
        array_task_id = int(match["task"]) if match["task"] is not None else None
    if raw_match is not None:
        job_id = int(raw_match["base"])
    elif array_task_id is not None and not is_step:
        raise RowError(SKIP_NO_ARRAY_RAW_ID)
    else:
        job_id = int(match["base"])  # type: ignore[index]
    return job_id, array_job_id, array_task_id, is_step


def _int_or_none(text: str, column: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise RowError(f"bad {column}") from None


class _Header:
    """Column positions of one parsable2 header, and which ones are present."""

    def __init__(self, names: list[str], source: str) -> None:
        self.names = names
        self.width = len(names)
        lowered = [n.strip().lower() for n in names]
        self.lowered = lowered
        self.index = {name: i for i, name in reversed(list(enumerate(lowered)))}
        self.free_text_columns = [i for i, name in enumerate(lowered) if name in _FREE_TEXT_COLUMNS]
        self.state_column = self.index.get("state")
        missing = []
        if "jobid" not in self.index and "jobidraw" not in self.index:
            missing.append("JobID (or JobIDRaw)")
        for name, label in (("user", "User"), ("state", "State"), ("submit", "Submit"), ("start", "Start")):
            if name not in self.index:
                missing.append(label)
        if not {"end", "elapsedraw", "elapsed"} & self.index.keys():
            missing.append("End (or ElapsedRaw/Elapsed)")
        if not {"alloctres", "reqtres"} & self.index.keys():
            missing.append("AllocTRES (or ReqTRES)")
        if missing:
            raise InputError(
                "sacct header lacks required column(s) " + ", ".join(missing)
                + "; dump with the command in docs/replay.md",
                source=source,
                line=1,
            )



def _looks_like_header(line: str) -> bool:
    words = {w.strip().lower() for w in line.split("|")}
    return bool(words & {"jobid", "jobidraw"}) and "state" in words


def read_sacct_parsable2(text: str, source: str) -> ReadResult:
    """Read a `sacct --parsable2` dump (header row first); see the module docstring for columns."""
    return read_parsable2_lines(iter(text.split("\n")), source)


def read_parsable2_lines(lines: Iterator[str], source: str) -> ReadResult:
    """The parsable2 reader over lines split at "\n" only (a lone "\r" stays inside its field)."""
    number = 0
    header_line = None
    for line in lines:
        number += 1
        if line.strip():
            header_line = line.lstrip("\ufeff").rstrip("\r")
            break
    if header_line is None:
        raise InputError("empty sacct dump", source=source)
    if not _looks_like_header(header_line):
        raise InputError(
            "no sacct header row (JobID|...|State|...): dump with --parsable2 and without --noheader",
            source=source,
            line=number,
        )
    header = _Header(header_line.split("|"), source)
    caches = RowCaches()
    records: list[AccountingRecord] = []
    skipped: Counter[str] = Counter()
    first_line: dict[str, int] = {}
    rows = 0
    for line in lines:
        number += 1
        if line.endswith("\r"):
            line = line[:-1]
        if not line.strip():
            continue
        rows += 1
        try:
            if line == header_line:
                raise RowError(SKIP_REPEATED_HEADER)
            record = _record_from_row(dict(zip(header.lowered, _split_row(line, header))), caches)
        except RowError as exc:
            reason = str(exc)
            skipped[reason] += 1
            first_line.setdefault(reason, number)
            continue
        if record is not None:
            records.append(record)
    return ReadResult(tuple(records), rows, dict(sorted(skipped.items())), source, first_line,
                      has_comment="comment" in header.index)


def _split_row(line: str, header: _Header) -> list[str]:
    """The row's fields; a `|` inside a free-text column (JobName, Comment, ...) is rejoined. With
    more than one such column, the one whose rejoining leaves a Slurm job state in the State
    column is chosen; a row where that does not decide is skipped."""
    fields = line.split("|")
    extra = len(fields) - header.width
    if extra == 0:
        return fields
    if extra > 0:
        splits = [fields[:at] + ["|".join(fields[at : at + extra + 1])] + fields[at + extra + 1 :]
                  for at in header.free_text_columns]
        if len(splits) > 1 and header.state_column is not None:
            splits = [split for split in splits if _is_state(split[header.state_column])]
        if len(splits) == 1:
            return splits[0]
    raise RowError(SKIP_FIELD_COUNT)


def _is_state(text: str) -> bool:
    word = text.strip().split(" ", 1)[0].upper()
    return word in JOB_BASE_STATES or word in JOB_STATE_FLAGS


def _record_from_row(row: dict[str, str], caches: RowCaches) -> AccountingRecord:
    """One record from a row keyed by lower-case column name."""
    get = row.get
    display = get("jobid", "").strip()
    raw = get("jobidraw", "").strip() or None
    job_id, array_job_id, array_task_id, is_step = _parse_job_id(display, raw)
    if is_step:
        raise RowError(SKIP_STEP)
    state_text = get("state", "").strip()
    if not state_text:
        raise RowError("empty State")
    try:
        submit = _timestamp(get("submit", "").strip())
        eligible = _timestamp(get("eligible", "").strip())
    except InputError:
        raise RowError("bad Submit/Eligible timestamp") from None
    try:
        start = _timestamp(get("start", "").strip())
        end = _timestamp(get("end", "").strip())
    except InputError:
        raise RowError("bad Start/End timestamp") from None
    if submit is None:
        raise RowError("no Submit time")
    elapsed_raw = get("elapsedraw", "").strip()
    if elapsed_raw:
        elapsed = _int_or_none(elapsed_raw, "ElapsedRaw") or 0
    elif get("elapsed", "").strip():
        elapsed = caches.duration(get("elapsed", "").strip(), "Elapsed") or 0
    elif start is not None and end is not None:
        elapsed = int(round(end - start))
    else:
        elapsed = 0
    limit_text = get("timelimit", "UNLIMITED").strip()
    time_limit = caches.duration(limit_text, "Timelimit")
    alloc_text = get("alloctres", "").strip()
    requested = caches.parse_tres(get("reqtres", "").strip(), "ReqTRES")
    # A run's AllocTRES is what it held; a job that never started (or was cancelled as it
    # started: an AllocTRES without nodes or GPUs) has only its request.
    alloc = caches.parse_tres(alloc_text, "AllocTRES")
    used = alloc if start is not None and (alloc.nodes or alloc.gpus) else requested
    nodes = caches.hostlist(get("nodelist", "").strip())
    if start is not None and not nodes and not (alloc.nodes or alloc.gpus) and elapsed <= 0:
        start = None  # sacct prints Start = End for a job cancelled while pending
    num_nodes = _int_or_none(get("nnodes", ""), "NNodes") or used.nodes or requested.nodes or len(nodes) or 1
    cpus = _int_or_none(get("ncpus", ""), "NCPUS") or used.cpus or requested.cpus or 1
    text = caches.text
    return AccountingRecord(
        job_id=job_id,
        display_id=display or str(job_id),
        array_job_id=array_job_id,
        array_task_id=array_task_id,
        name=get("jobname", ""),
        user=text(get("user", "").strip()),
        account=text(get("account", "").strip()),
        partition=text(get("partition", "").strip()),
        qos=text(get("qos", "").strip()),
        state=caches.state(state_text),
        state_text=text(state_text),
        submit=submit,
        eligible=eligible,
        start=start,
        end=end,
        elapsed_s=max(0, elapsed),
        time_limit_s=time_limit,
        num_nodes=num_nodes,
        cpus=cpus,
        gpus=used.gpus,
        nodes=nodes,
        priority=_int_or_none(get("priority", ""), "Priority"),
        flags=text(get("flags", "").strip()),
        comment=get("comment", ""),
        gpu_types=tuple(name for name, _ in requested.gpu_types),
        alloc_gpu_types=tuple(name for name, _ in alloc.gpu_types),
        constraints=text(get("constraints", "").strip()),
    )

