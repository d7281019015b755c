"""A synthetic job history written exactly as ``sacct --parsable2`` prints it.

The format decisions, with their sources in the Slurm code, are listed in the docstring of
:func:`write_sacct_parsable2`; ``dike_slurm.slurm.accounting`` reads the text back.
"""

from __future__ import annotations

import functools
from datetime import date, timedelta
from typing import Iterable, NamedTuple, TextIO

from dike_slurm.parsing.durations import format_duration

#: The columns, in order, of the generated ``sacct.txt`` (``--format=`` list).
SACCT_FIELDS: tuple[str, ...] = (
    "JobID",
    "JobIDRaw",
    "JobName",
    "User",
    "Account",
    "Partition",
    "QOS",
    "State",
    "Submit",
    "Eligible",
    "Start",
    "End",
    "Elapsed",
    "ElapsedRaw",
    "Timelimit",
    "NNodes",
    "NCPUS",
    "NodeList",
    "ReqTRES",
    "AllocTRES",
    "Priority",
    "Flags",
)

#: The sacct invocation whose output :func:`write_sacct_parsable2` reproduces.
#: ``--duplicates`` is what makes sacct print every run of a requeued job (see
#: :func:`write_sacct_parsable2`); ``{start}``/``{end}`` are the dump window.
SACCT_COMMAND = (
    "sacct --allusers --allocations --duplicates --parsable2 "
    "-S {start} -E {end} --format=" + ",".join(SACCT_FIELDS)
)

#: ``SacctRecord.timelimit_min`` value printed as ``UNLIMITED`` (Slurm INFINITE).
TIMELIMIT_UNLIMITED = -1
#: ``SacctRecord.timelimit_min`` value printed as ``Partition_Limit`` (Slurm NO_VAL).
TIMELIMIT_PARTITION = -2

_DAY = 86400


# --------------------------------------------------------------------------- record


class SacctRecord(NamedTuple):
    """One row of ``sacct --allocations`` output, in typed form.

    Times are whole seconds since 1970-01-01T00:00:00 of the cluster's local
    wall clock (no time zone, as sacct prints them); ``None`` prints
    ``Unknown``.  ``timelimit_min`` is minutes, or :data:`TIMELIMIT_UNLIMITED`
    / :data:`TIMELIMIT_PARTITION`.  ``gpus`` (GPUs allocated or requested)
    is carried for convenience and is not a sacct column.
    """

    job_id: str
    job_id_raw: int
    job_name: str
    user: str
    account: str
    partition: str
    qos: str
    state: str
    submit: int | None
    eligible: int | None
    start: int | None
    end: int | None
    elapsed: int
    timelimit_min: int
    nnodes: int
    ncpus: int
    nodelist: str
    req_tres: str
    alloc_tres: str
    priority: int
    flags: str
    gpus: int


# --------------------------------------------------------------------------- formatting


_HMS: list[str] = []


def _hms_table() -> list[str]:
    """``HH:MM:SS`` for every second of a day (built once, ~5 MB): timestamps in bulk."""
    if not _HMS:
        _HMS.extend(f"{h:02d}:{m:02d}:{s:02d}"
                    for h in range(24) for m in range(60) for s in range(60))
    return _HMS


def format_timelimit(minutes: int) -> str:
    """sacct's Timelimit column: ``UNLIMITED``, ``Partition_Limit`` or
    Slurm's ``mins2time_str`` (``[D-]HH:MM:SS``)."""
    if minutes == TIMELIMIT_UNLIMITED:
        return "UNLIMITED"
    if minutes == TIMELIMIT_PARTITION:
        return "Partition_Limit"
    if minutes <= 0:
        return ""
    return format_duration(minutes * 60)


def format_mem(mb: int) -> str:
    """A memory TRES count (MB) as sacct prints it by default: divided by 1024
    while that stays exact (``convert_num_unit`` with CONVERT_NUM_UNIT_EXACT),
    so ``32768`` -> ``32G``, ``512000`` -> ``500G``, ``64000`` -> ``64000M``."""
    units = "MGTPE"
    unit = 0
    value = int(mb)
    while value >= 1024 and value % 1024 == 0 and unit < len(units) - 1:
        value //= 1024
        unit += 1
    return f"{value}{units[unit]}"


@functools.lru_cache(maxsize=8192)
def tres_text(cpus: int, mem_mb: int, nodes: int, gpus: int, gpu_type: str | None) -> str:
    """A TRES string as sacct prints it: ``name=count`` sorted by string
    (``slurm_char_list_to_xstr`` sorts), so typed GPUs come first:
    ``billing=8,cpu=8,gres/gpu:a100=4,gres/gpu=4,mem=32G,node=1``."""
    items = [f"billing={cpus}", f"cpu={cpus}", f"mem={format_mem(mem_mb)}", f"node={nodes}"]
    if gpus:
        items.append(f"gres/gpu={gpus}")
        if gpu_type:
            items.append(f"gres/gpu:{gpu_type}={gpus}")
    items.sort()
    return ",".join(items)


# --------------------------------------------------------------------------- writers


class _TimeFormatter:
    """``%FT%T`` of naive local seconds, caching the date part per day."""

    def __init__(self) -> None:
        self._days: dict[int, str] = {}
        self._hms = _hms_table()

    def __call__(self, t: int | None) -> str:
        if t is None:
            return "Unknown"
        day, sod = divmod(t, _DAY)
        ds = self._days.get(day)
        if ds is None:
            if len(self._days) > 100000:
                self._days.clear()
            ds = (date(1970, 1, 1) + timedelta(days=day)).isoformat() + "T"
            self._days[day] = ds
        return ds + self._hms[sod]


def write_sacct_parsable2(records: Iterable[SacctRecord], fh: TextIO) -> int:
    """Write records exactly as ``sacct --parsable2`` prints them; return the count.

    The output is what :data:`SACCT_COMMAND` (Slurm 22.05 and later) prints:
    a header row of the :data:`SACCT_FIELDS` names, then one row per record,
    ``|``-separated with no trailing separator (``--parsable2``), ``\\n`` line
    ends.  The file handle should be opened with ``encoding="utf-8"`` (sacct
    prints job names as stored, so unicode names are raw UTF-8).

    Format decisions, with their source in the Slurm code:

    * Times are ``%FT%T`` (``2026-01-05T10:00:00``), local time, no zone
      (``slurm_make_time_str``, src/common/parse_time.c).  A time of 0 prints
      ``Unknown`` (still-pending jobs: Start and End; running jobs: End);
      ``None`` is printed only for NO_VAL, which job records never carry.
    * A job cancelled while pending has no start time in the database;
      slurmdbd reports it with Start = End = the cancel time
      (``if (!job->start || job->start > job->end) job->start = job->end`` in
      src/plugins/accounting_storage/mysql/as_mysql_jobacct_process.c), so
      sacct shows the cancel time as Start, ``00:00:00`` as Elapsed,
      ``None assigned`` as NodeList, an empty AllocTRES, NCPUS 0 (CPU count is
      read from AllocTRES) and NNodes from ReqTRES (print.c, PRINT_NNODES).
    * Elapsed is ``secs2time_str``: ``[D-]HH:MM:SS``; Timelimit is
      ``mins2time_str``, or ``UNLIMITED`` (INFINITE), or ``Partition_Limit``
      (NO_VAL: a job submitted without ``--time`` that never started; once it
      starts Slurm resolves the limit, ``UNLIMITED`` under ``MaxTime=INFINITE``)
      (src/sacct/print.c, PRINT_TIMELIMIT).
    * State is ``job_state_string``; cancelled jobs print ``CANCELLED by
      <uid>`` (print.c, PRINT_STATE).
    * TRES strings are ``name=count`` joined by ``,`` after a string sort
      (``slurmdb_make_tres_string_from_simple`` collects them into a list
      that ``slurm_char_list_to_xstr`` sorts), so ``gres/gpu:a100=4`` sorts
      before ``gres/gpu=4``; memory is converted like ``convert_num_unit``
      with CONVERT_NUM_UNIT_EXACT (sacct's default): ``mem=32G``, ``mem=500G``.
    * Flags is ``SchedSubmit``/``SchedMain``/``SchedBackfill`` for started
      jobs, and empty for jobs never scheduled (flags 0 print nothing,
      print.c PRINT_FLAGS).
    * Requeued jobs: every run has its own database row; sacct orders rows
      ``by id_job, time_submit`` and, without ``--duplicates``, prints only
      the last one (as_mysql_jobacct_process.c).  With ``--duplicates`` the
      earlier run appears first with State ``REQUEUED``, and the next run has
      a new Submit time (job_mgr.c resets ``submit_time`` so "the restarted
      job looks like a new job").
    * Array tasks print ``<array id>_<task>``; JobIDRaw is the task's own id.
    * sacct does not escape ``|`` or newlines in any field (job names are
      printed raw).  Such a name would corrupt the dump, so this writer
      refuses it with ``ValueError``.
    """
    fmt_time = _TimeFormatter()
    fh.write("|".join(SACCT_FIELDS) + "\n")
    buf: list[str] = []
    count = 0
    for r in records:
        for text in (r.job_name, r.user, r.account):
            if "|" in text or "\n" in text or "\r" in text:
                raise ValueError(
                    f"field {text!r} of job {r.job_id} contains '|' or a newline, "
                    "which sacct --parsable2 cannot represent")
        buf.append("|".join((
            r.job_id, str(r.job_id_raw), r.job_name, r.user, r.account, r.partition,
            r.qos, r.state, fmt_time(r.submit), fmt_time(r.eligible), fmt_time(r.start),
            fmt_time(r.end), format_duration(r.elapsed), str(r.elapsed),
            format_timelimit(r.timelimit_min), str(r.nnodes), str(r.ncpus), r.nodelist,
            r.req_tres, r.alloc_tres, str(r.priority), r.flags,
        )))
        count += 1
        if len(buf) >= 8192:
            buf.append("")
            fh.write("\n".join(buf))
            buf.clear()
    if buf:
        buf.append("")
        fh.write("\n".join(buf))
    return count
