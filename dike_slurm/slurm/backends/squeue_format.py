"""The cycle's lean read: `squeue -O` and `sinfo -N -O` with only the fields the engine uses.

`squeue --json` prints about 3 KB per job (every key Slurm has); the engine reads 29 of them.
The formatted reads print those fields only, in the same layout on Slurm 22.05 to 26.05.

Job names, comments, admin comments and Features (`--constraint=a|b`) are user-typed text
that may hold any separator, a newline included. Every field therefore ends with a token
drawn at random for each call (squeue's `-O type:suffix`), so that a record and its fields are
found by that token alone: no text typed before the call can hold it, and a hostile name can
never shift a column or forge a line. The token is in squeue's command line, which other users
can read in /proc while squeue runs; a user who read it and renamed a job within those
milliseconds would at most break the count of fields per line (an error: the cycle writes
nothing) or, with a whole forged line, add a job for one cycle that Slurm does not know (the
writes to it fail as "job gone"); a forged line for a job that exists is listed twice, an error.
(The format could travel in SQUEUE_FORMAT2 instead, unreadable to others, but wrappers that
clear the environment, sudo's env_reset or the lab's chroot wrappers, drop it.)

The header line (no `-h`) proves the command printed the format asked for: an empty or cut
output, or a field this Slurm does not know, is an error naming the command, never "no jobs".
squeue prints an unset name, comment or admin comment as `(null)`; one typed as exactly that
reads as empty, which is what the JSON holds for an unset one.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields, replace

from dike_slurm.domain.fields import SwitchRequest
from dike_slurm.errors import InputError
from dike_slurm.frozen import frozen_record
from dike_slurm.domain.model import NO_PLACEMENT, Job, JobState, Node, Placement
from dike_slurm.parsing.durations import parse_duration, parse_timestamp
from dike_slurm.parsing.hostlists import expand_hostlist
from dike_slurm.parsing.tres import parse_gres_gpu_types, parse_gres_gpus, parse_tres, requested_gpu_types
from dike_slurm.slurm.formats import FormatError, ReadCount, job_base_state

# squeue -O names, in the order they are printed; the free text comes last.
JOB_FIELDS = (
    "JobID", "ArrayJobID", "ArrayTaskID", "State", "UserName", "Account", "Partition", "QOS",
    "SubmitTime", "EligibleTime", "StartTime", "TimeLimit", "NumNodes", "NumCPUs", "tres-alloc",
    "tres-per-job", "tres-per-node", "Feature", "ReqNodes", "NodeList", "ReqSwitch", "Wait4Switch",
    "PriorityLong", "Nice", "Requeue", "Reason", "Name", "Comment", "admin_comment",
)
# ExcNodeList is not among squeue's -O fields (22.05 to 26.05): `-o %x` prints it.
EXCLUDED_FIELDS = ("%A", "%x")
NODE_FIELDS = ("NodeList", "PartitionName", "CPUs", "Gres", "GresUsed", "StateComplete", "Features", "features_act")
_NODE_NAME, _NODE_PARTITION, _NODE_CPUS, _GRES, _GRES_USED, _NODE_STATE, _NODE_FEATURES, _ACTIVE_FEATURES = range(8)

# What squeue and sinfo print for a field that is not set (free text: `(null)` only, so that a
# comment typed as "N/A" stays one).
_UNSET = frozenset({"", "(null)", "N/A"})
_NULL = "(null)"
_NO_REASON = frozenset({"", "None", "(null)"})
_UNSET_TIMES = frozenset({"", "N/A", "Unknown", "None", "0"})
_NO_SWITCHES = SwitchRequest(0)


def new_token() -> str:
    """A field terminator nobody can have typed into a job: `^` and 8 random hex digits.

    It starts with a character that is no digit and no dot (squeue reads `type:[.][size]suffix`)
    and holds no comma (which separates the fields).
    """
    return "^" + secrets.token_hex(4)


def job_format(token: str) -> str:
    """The `squeue -O` argument: every field with the token as its suffix (no padding)."""
    return ",".join(f"{name}:{token}" for name in JOB_FIELDS)


def excluded_format(token: str) -> str:
    return "".join(f"{code}{token}" for code in EXCLUDED_FIELDS)


def node_format(token: str) -> str:
    return ",".join(f"{name}:{token}" for name in NODE_FIELDS)


def records(text: str, token: str, names: tuple[str, ...], command: str, first_title: str) -> list[list[str]]:
    """The records of a header-led output whose every field (`names`) ends with `token`.

    Split once on the token: record i holds fields [i*width, (i+1)*width), every record after
    the header starts with the newline that ended the previous one, and the output ends with a
    newline. Anything else (no header, a cut line, a field count that does not add up, a field
    this Slurm does not know: squeue prints an empty title for it and exits 0) is a FormatError
    naming the command.
    """
    width = len(names)
    parts = text.split(token)
    count, rest = divmod(len(parts) - 1, width)
    if not text.strip():
        raise FormatError(f"{command}: Slurm printed nothing, not even its header line")
    if rest or parts[-1] != "\n" or parts[0].strip() != first_title:
        raise FormatError(
            f"{command}: its output is not {width} fields per line under a {first_title!r} header "
            f"({len(parts) - 1} fields in {text.count(chr(10))} lines)"
        )
    unknown = [name for name, title in zip(names, parts[:width]) if not title.strip()]
    if unknown:
        raise FormatError(f"{command}: this Slurm does not print the field(s) {', '.join(unknown)}")
    rows = [parts[i * width : (i + 1) * width] for i in range(1, count)]
    for row in rows:
        if row[0][:1] != "\n":
            raise FormatError(f"{command}: a line of its output does not start where the previous one ended")
        row[0] = row[0][1:]
    return rows


def join_records(rows: list[list[str]], token: str) -> str:
    """The inverse of `records`: lines of fields each ending with `token` (the header is rows[0]);
    what squeue prints, for the tests and the benchmark."""
    return "".join("".join(field + token for field in row) + "\n" for row in rows)


def _text(value: str) -> str:
    return "" if value in _UNSET else value


@functools.lru_cache(maxsize=65536)
def _when(text: str) -> float | None:
    """Epoch seconds of a squeue time: digits under SLURM_TIME_FORMAT=%s, else ISO taken as UTC."""
    if text in _UNSET_TIMES:
        return None
    if text.isdigit():
        return float(text)
    return parse_timestamp(text)


def _hosts(value: str) -> tuple[str, ...]:
    try:
        return expand_hostlist(value)
    except InputError:
        return ()


def _placement(switch: SwitchRequest, features: str | None, exclude: tuple[str, ...], require: tuple[str, ...]) -> Placement:
    if not switch.count and features is None and not exclude and not require:
        return NO_PLACEMENT
    return Placement(
        max_switches=switch.count or None, switches_wait_s=switch.wait_s if switch.count else None,
        features=features, exclude_nodes=exclude, require_nodes=require,
    )


def _switch_request(count: str, wait: str) -> SwitchRequest:
    if not count.isdigit() or count == "0":
        return _NO_SWITCHES
    try:
        return SwitchRequest(int(count), parse_duration(wait))
    except InputError:
        return SwitchRequest(int(count), None)


# The base states squeue prints most; other words go through job_base_state (flags, unknown words).
_STATES = {state.value: state for state in (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED)}
_ACTIVE = frozenset(_STATES.values())
# Job's fields with their defaults: each job's instance dict is filled in one step, as Job.build
# does (50,000 jobs a cycle), without its checks of the keys, which are fixed here.
_JOB_DEFAULTS = {f.name: f.default for f in fields(Job) if f.default is not MISSING}


def job_from_fields(row: list[str], excluded: Mapping[int, str]) -> Job:
    """One `squeue -O JOB_FIELDS` record as the domain Job; ValueError (or InputError) if unreadable.

    Built as `squeue_json.job_from_squeue` builds it from the JSON (tests/unit/test_lean_read.py
    holds the two equal on generated queues and on the recorded output of every Slurm version).
    """
    (job_text, array_job, task, state_text, user, account, partition, qos, submit, eligible, start, limit,
     node_text, cpus, tres, per_job, per_node, features, req_nodes, nodes, switches, wait, priority, nice,
     requeue, reason, name, comment, _admin_comment) = row
    job_id = int(job_text)
    state = _STATES.get(state_text) or JobState.parse(job_base_state(state_text))
    node_count = int(node_text or 0) or 1
    # tres-alloc: the allocated TRES of a started job, the requested ones of a pending job
    gpus = parse_tres(tres).gpus if tres not in _UNSET else 0
    if not gpus:
        gpus = parse_gres_gpus(_text(per_job)) or parse_gres_gpus(_text(per_node)) * node_count
    array_job_id = int(array_job) if task not in _UNSET else None
    running = state is JobState.RUNNING
    exclude = excluded.get(job_id)
    switch = _switch_request(switches, wait) if state is JobState.PENDING and switches != "0" else _NO_SWITCHES
    if switch.count or exclude or features not in _UNSET or req_nodes not in _UNSET:
        placement = _placement(switch, _text(features) or None, _hosts(exclude) if exclude else (),
                               _hosts(req_nodes) if req_nodes not in _UNSET else ())
    else:
        placement = NO_PLACEMENT
    values = dict(_JOB_DEFAULTS)
    values.update(
        job_id=job_id,
        user=user,
        state=state,
        submit_time=_when(submit) or 0.0,
        gpus=gpus,
        num_nodes=node_count,
        cpus=int(cpus or 0) or 1,
        account=account if account not in _UNSET else "",
        partition=partition if partition not in _UNSET else "",
        qos=qos if qos not in _UNSET else "",
        name=name if name != _NULL else "",
        comment=comment if comment != _NULL else "",
        array_job_id=array_job_id,
        array_task_id=int(task) if array_job_id is not None and task.isdigit() else None,
        eligible_time=_when(eligible),
        start_time=_when(start) if running else None,
        time_limit_s=parse_duration(limit),
        nodes=_hosts(nodes) if running else (),
        placement=placement,
        priority=int(priority) if priority.lstrip("-").isdigit() else None,
        nice=int(nice) if nice.lstrip("-").isdigit() else 0,
        requeueable=requeue in ("1", "yes"),
        gpu_types=requested_gpu_types(_text(per_job), _text(per_node)),
        slurm_reason=reason if state is JobState.PENDING and reason not in _NO_REASON else "",
    )
    return frozen_record(Job, values)


@dataclass(frozen=True)
class LeanJobs:
    """The active jobs of one lean read and what Slurm holds in their AdminComment; `by_record`:
    every Job read, by its record's text (for the next read, `read_jobs(known=...)`)."""

    jobs: tuple[Job, ...]
    admin_comments: dict[int, str]
    count: ReadCount
    by_record: dict[str, Job]


# Joins a record's fields (and its ExcNodeList) into the text a Job is known by between reads.
# Slurm's fields are C strings: no NUL in them, so the joined text names one record only (a
# record whose fields hold a NUL anyway is read afresh, never looked up).
_JOIN = "\0"
_JOINS = len(JOB_FIELDS)  # the NULs of a joined record: one after each field but the last, one before ExcNodeList


def joined_records(text: str, token: str, names: tuple[str, ...], first_title: str) -> list[str] | None:
    """The records after the header as `records` reads them, each as its fields joined with NUL,
    in two passes over the whole text (a replace and a split) instead of one list per record;
    None when this cannot vouch for the result (then `records` reads the text, or says what is
    wrong with it).

    With no NUL in the text, the NULs that replace the token are the field ends, and a record
    ends where a NUL is followed by a newline. A field that begins with a newline splits its
    record in two, each with too few fields: that, or anything else out of line, is None.
    """
    width = len(names)
    if _JOIN in text or token not in text:
        return None
    chunks = text.replace(token, _JOIN).split(_JOIN + "\n")
    if chunks[-1] != "":
        return None
    titles = chunks[0].split(_JOIN)
    if len(titles) != width or titles[0].strip() != first_title or not all(t.strip() for t in titles):
        return None
    del chunks[0], chunks[-1]
    if any(chunk.count(_JOIN) != width - 1 for chunk in chunks):
        return None
    return chunks


def read_jobs(
    text: str, token: str, command: str, excluded_text: str, excluded_token: str, excluded_command: str,
    known: Mapping[str, Job] | None = None,
) -> LeanJobs:
    """Every record of the lean squeue read (`text`, and the ExcNodeList of `squeue -o %A%x` in
    `excluded_text`): active jobs read, finished ones left out, the rest an error
    (ReadCount.check) that names the command. `known`: the previous read's `by_record`; a record
    printed exactly as then is that read's Job (job_from_fields is a function of the record),
    found without splitting the record into its fields."""
    joined = joined_records(text, token, JOB_FIELDS, "JOBID")
    rows: list[list[str]] | None = None
    if joined is None:
        rows = records(text, token, JOB_FIELDS, command, "JOBID")
        joined = [_JOIN.join(row) for row in rows]
    excluded_rows = joined_records(excluded_text, excluded_token, EXCLUDED_FIELDS, "JOBID")
    excluded_pairs = (
        [row.partition(_JOIN)[::2] for row in excluded_rows] if excluded_rows is not None
        else records(excluded_text, excluded_token, EXCLUDED_FIELDS, excluded_command, "JOBID")
    )
    excluded = {int(job_id): nodes for job_id, nodes in excluded_pairs if nodes not in _UNSET and job_id.isdigit()}
    count = ReadCount(command, printed=len(joined))
    jobs: list[Job] = []
    comments: dict[int, str] = {}
    known = known or {}
    by_record: dict[str, Job] = {}
    for index, fields in enumerate(joined):
        row = rows[index] if rows is not None else None
        try:
            # the fields joined, then ExcNodeList: the text a Job is known by between reads
            record = fields + _JOIN + excluded.get(int(row[0] if row is not None else fields[:fields.find(_JOIN)]), "")
            job = known.get(record)
            if job is None:
                if row is None:
                    row = fields.split(_JOIN)
                job = job_from_fields(row, excluded)
        except (ValueError, InputError) as exc:
            count.skip(_reason(exc))
            continue
        if record.count(_JOIN) == _JOINS:
            by_record[record] = job
        job_id = job.job_id
        if job.state not in _ACTIVE:
            count.left_out += 1
        elif job_id in comments:
            count.skip("job id listed twice")
        else:
            jobs.append(job)
            comment = row[-1] if row is not None else fields[fields.rfind(_JOIN) + 1:]
            comments[job_id] = comment if comment != _NULL else ""
    count.read = len(jobs)
    count.check("jobs")
    return LeanJobs(tuple(jobs), comments, count, by_record)


def read_nodes(text: str, token: str, command: str) -> tuple[dict[str, Node], ReadCount]:
    """`sinfo -N -O NODE_FIELDS`: one line per node and partition, merged into one Node each."""
    rows = records(text, token, NODE_FIELDS, command, "NODELIST")
    if not rows:
        raise FormatError(f"{command}: Slurm printed no nodes")
    count = ReadCount(command, printed=len(rows))
    nodes: dict[str, Node] = {}
    for row in rows:
        name = row[_NODE_NAME]
        partition = _text(row[_NODE_PARTITION])
        known = nodes.get(name)
        if known is not None:  # the same node in another partition
            if partition and partition not in known.partitions:
                nodes[name] = replace(known, partitions=(*known.partitions, partition))
            count.left_out += 1
            continue
        try:
            if not name or name in _UNSET:
                raise ValueError("node without name")
            active = _text(row[_ACTIVE_FEATURES]) or _text(row[_NODE_FEATURES])
            nodes[name] = Node(
                name=name,
                gpus=parse_gres_gpus(_text(row[_GRES])),
                gpus_alloc=parse_gres_gpus(_text(row[_GRES_USED])),
                cpus=int(row[_NODE_CPUS] or 0) or 1,
                state=node_state_words(row[_NODE_STATE]),
                features=tuple(f for f in active.split(",") if f),
                partitions=(partition,) if partition else (),
                gpu_types=parse_gres_gpu_types(_text(row[_GRES])),
            )
        except (ValueError, InputError) as exc:
            count.skip(_reason(exc))
            continue
        count.read += 1
    count.check("nodes")
    return nodes, count


def node_state_words(text: str) -> str:
    """sinfo's StateComplete (`idle+drain`, `mixed*`) as the JSON readers spell it: `IDLE+DRAIN`.

    sinfo marks a node that does not respond with a trailing `*` (the JSON: NOT_RESPONDING).
    """
    words = text.strip().upper()
    if words.endswith("*"):
        words = words.rstrip("*") + "+NOT_RESPONDING"
    return words or "UNKNOWN"


def _reason(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 80 else text[:77] + "..."


TokenSource = Callable[[], str]
