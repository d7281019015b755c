"""From accounting records to the jobs the simulator replays (one per job, in submit order)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dike_slurm.domain.model import JobState, Node, constraint_gpu_types, may_use_gpus
from dike_slurm.parsing.durations import format_duration, format_timestamp
from dike_slurm.slurm.accounting import AccountingRecord
from dike_slurm.slurm.slurm_conf import ClusterConf, Partition

# Reasons a job of the dump is not replayed (keys of TraceBuild.excluded).
EXCLUDED_NEVER_STARTED = "never started (pending or cancelled before start)"
EXCLUDED_STILL_RUNNING = "still running at the end of the dump"
EXCLUDED_CPU_ONLY = "no GPUs (CPU-only job)"
EXCLUDED_ZERO_RUN = "ran 0 seconds"
EXCLUDED_TOO_BIG = "larger than any node set of its partition"
EXCLUDED_NO_GPU_TYPE = "asks for GPU types no node of its partition has"
NOTE_TYPES_IGNORED = "GPU type asked for on a cluster without GPU types: any GPU serves"


def case_name(dump: Path) -> str:
    """What a dump is called: its folder's name for a case folder's sacct.txt
    (examples/corpus/philly-b436b2-s3/sacct.txt -> philly-b436b2-s3), else the file's stem."""
    return dump.resolve().parent.name if dump.stem == "sacct" else dump.stem


@dataclass(frozen=True, slots=True)
class TraceJob:
    """A job to replay: what was asked for and how long it ran (all runs summed)."""

    job_id: int
    display_id: str
    user: str
    account: str
    partition: str  # a partition of the simulated cluster ("" = every node)
    qos: str
    name: str
    comment: str
    submit: float
    eligible_delay_s: float  # Eligible - Submit of the first record (--begin, dependencies)
    duration_s: float  # run time on a consolidated allocation: sum of the trace's runs
    time_limit_s: int | None  # None: unlimited
    gpus: int
    num_nodes: int
    cpus: int
    array_job_id: int | None = None
    array_task_id: int | None = None
    gpu_types: tuple[str, ...] = ()  # the GPU types it may run on (typed ReqTRES or constraint); () any
    final_state: str = "COMPLETED"  # how its last run ended in the dump (a JobState value)

    @property
    def gpus_per_node(self) -> int:
        return -(-self.gpus // self.num_nodes)

    @property
    def cpus_per_node(self) -> int:
        return -(-self.cpus // self.num_nodes)


@dataclass(frozen=True)
class Unfinished:
    """The GPU jobs that had not ended when the dump was taken (a dump taken while jobs run), by
    what the replay does with each. `dump_end` is the dump's last time (a submit, start or end):
    the waits so far are measured to it, so they are at least what they were."""

    dump_end: float | None = None
    pending_waits_s: tuple[float, ...] = ()  # never started, pending at the end: left out; wait so far
    running_waits_s: tuple[float, ...] = ()  # running at the end: left out; wait before it started
    pending_again: int = 0  # ran, was requeued, pending again: replayed with the run time it had

    @property
    def left_out(self) -> int:
        return len(self.pending_waits_s) + len(self.running_waits_s)

    def as_dict(self) -> dict:
        """summary.json's `unfinished_at_dump_end`."""
        return {
            "dump_end": format_timestamp(self.dump_end) if self.dump_end is not None else None,
            "pending_left_out": len(self.pending_waits_s),
            "pending_wait_so_far_s": _mean_max(self.pending_waits_s),
            "running_left_out": len(self.running_waits_s),
            "running_wait_s": _mean_max(self.running_waits_s),
            "pending_again_replayed": self.pending_again,
        }

    def sentence(self) -> str:
        """What the replay did with them, in one sentence ("" when every job had ended)."""
        if not self.left_out and not self.pending_again:
            return ""
        parts = []
        if self.pending_waits_s:
            parts.append(f"{_jobs(len(self.pending_waits_s))} still pending (waited {_waits(self.pending_waits_s)} so far)")
        if self.running_waits_s:
            parts.append(f"{_jobs(len(self.running_waits_s))} running (waited {_waits(self.running_waits_s)} before starting)")
        text = f"The dump was taken while jobs ran (its last time: {format_timestamp(self.dump_end)})"  # type: ignore[arg-type]
        if parts:
            text += (f": {' and '.join(parts)} at its end {'is' if self.left_out == 1 else 'are'} left out of the "
                     "replay, whose waits and JCTs therefore do not include them")
        if self.pending_again:
            text += (f"{';' if parts else ':'} {_jobs(self.pending_again)} requeued and pending again "
                     f"{'is' if self.pending_again == 1 else 'are'} replayed with the run time {'it' if self.pending_again == 1 else 'they'} had")
        return text + "."

    def caveat(self) -> str:
        """A line under the verdict when jobs are left out ("" when none is)."""
        if not self.left_out:
            return ""
        return (f"These figures leave out the {_jobs(self.left_out)} still pending or running when the dump was "
                "taken (see its input above).")


def _jobs(count: int) -> str:
    return f"{count:,} GPU job{'' if count == 1 else 's'}"


def _waits(waits: tuple[float, ...]) -> str:
    if len(waits) == 1:
        return format_duration(round(waits[0]))
    return f"{format_duration(round(sum(waits) / len(waits)))} on average, the longest {format_duration(round(max(waits)))}"


def _mean_max(values: tuple[float, ...]) -> dict[str, float] | None:
    return {"mean": sum(values) / len(values), "max": max(values)} if values else None


@dataclass(frozen=True)
class TraceBuild:
    """The replayable jobs (sorted by submit time, then id), what was left out, by reason, and the
    jobs that had not ended when the dump was taken."""

    jobs: tuple[TraceJob, ...]
    records: int
    excluded: dict[str, int]
    notes: dict[str, int]  # replayed, but adjusted (e.g. unknown partition mapped to the default)
    unfinished: Unfinished = field(default_factory=Unfinished)


def build_trace(records: Iterable[AccountingRecord], conf: ClusterConf) -> TraceBuild:
    """Group the runs of each job, keep the GPU jobs that ran and fit the cluster, sort by submit.

    A job's GPU types are those its ReqTRES names, else those its constraint names among the
    cluster's. On a cluster whose slurm.conf gives no GPU type, a typed job runs on any GPU (noted).
    """
    runs: dict[int, list[AccountingRecord]] = {}
    count = 0
    for record in records:
        runs.setdefault(record.job_id, []).append(record)
        count += 1
    room = _Room.of(conf)
    excluded: Counter[str] = Counter()
    notes: Counter[str] = Counter()
    jobs: list[TraceJob] = []
    unfinished: list[tuple[list[AccountingRecord], TraceJob | str]] = []
    for job_id, job_runs in runs.items():
        job_runs.sort(key=lambda r: (r.submit or 0.0, r.start or 0.0))
        job = _trace_job(job_id, job_runs, room, notes)
        if isinstance(job, str):
            excluded[job] += 1
        else:
            jobs.append(job)
        if _had_not_ended(job_runs):
            unfinished.append((job_runs, job))
    jobs.sort(key=lambda j: (j.submit, j.job_id))
    return TraceBuild(tuple(jobs), count, dict(sorted(excluded.items())), dict(sorted(notes.items())),
                      _unfinished(unfinished, _last_time(runs.values())) if unfinished else Unfinished())


def _had_not_ended(job_runs: list[AccountingRecord]) -> bool:
    """A GPU job still pending, running or suspended at the dump's end, or requeued and not run
    since (sacct says REQUEUED for a job pending again after a requeue)."""
    return job_runs[-1].gpus > 0 and (
        any(r.state.is_active for r in job_runs) or job_runs[-1].state is JobState.REQUEUED)


def _last_time(runs: Iterable[list[AccountingRecord]]) -> float:
    """The dump's last time: its latest submit, start or end."""
    return max(t for job_runs in runs for r in job_runs for t in (r.submit, r.start, r.end) if t is not None)


def _unfinished(jobs: list[tuple[list[AccountingRecord], TraceJob | str]], dump_end: float) -> Unfinished:
    """The unfinished jobs by what the replay did with them: the pending and running ones are left
    out (their EXCLUDED_ reason), a job requeued and pending again is replayed with its runs so far."""
    pending, running, again = [], [], 0
    for job_runs, job in jobs:
        submit = job_runs[0].submit
        if job == EXCLUDED_NEVER_STARTED:
            pending.append(dump_end - submit if submit is not None else 0.0)
        elif job == EXCLUDED_STILL_RUNNING:
            start = next(r.start for r in job_runs if r.start is not None)
            running.append(start - submit if submit is not None else 0.0)  # type: ignore[operator]
        elif isinstance(job, TraceJob):
            again += 1
    return Unfinished(dump_end, tuple(pending), tuple(running), again)


@dataclass
class _Room:
    """What fits the cluster: each partition's usable nodes ("" for every node) and its biggest
    node, and per (partition, GPU types) the nodes with those types."""

    known: dict[str, Partition]
    default_partition: str
    members_of: dict[str, list[Node]]
    biggest: dict[str, tuple[int, int, int]]  # partition -> (max GPUs/node, max CPUs/node, nodes)
    cluster_types: frozenset[str]
    # (partition, GPU types) -> (max GPUs per usable node, usable nodes); None: no node has those types
    typed_room: dict[tuple[str, tuple[str, ...]], tuple[int, int] | None] = field(default_factory=dict)

    @classmethod
    def of(cls, conf: ClusterConf) -> _Room:
        known = {p.name: p for p in conf.partitions}
        node_by_name = {n.name: n for n in conf.nodes}
        members_of: dict[str, list[Node]] = {}
        biggest: dict[str, tuple[int, int, int]] = {}
        for name, partition in [("", None), *known.items()]:
            members = [node_by_name[n] for n in partition.nodes] if partition else list(conf.nodes)
            members = members_of[name] = [n for n in members if n.available]
            biggest[name] = (
                max((n.gpus for n in members), default=0),
                max((n.cpus for n in members), default=0),
                len(members),
            )
        return cls(known, next((p.name for p in conf.partitions if p.default), ""), members_of, biggest,
                   frozenset(t for n in conf.nodes for t in n.gpu_types))

    def typed(self, partition: str, gpu_types: tuple[str, ...]) -> tuple[int, int] | None:
        typed = (partition, gpu_types)
        if typed not in self.typed_room:  # the same few (partition, types) for every typed job
            usable = [n for n in self.members_of[partition] if may_use_gpus(gpu_types, n.gpu_types)]
            self.typed_room[typed] = (max(n.gpus for n in usable), len(usable)) if usable else None
        return self.typed_room[typed]


def _trace_job(job_id: int, job_runs: list[AccountingRecord], room: _Room, notes: Counter[str]) -> TraceJob | str:
    """The job to replay from its runs (sorted), or why it is left out (an EXCLUDED_ reason)."""
    started = [r for r in job_runs if r.start is not None]
    if not started:
        return EXCLUDED_NEVER_STARTED
    last = started[-1]
    if last.end is None and last.state.is_active:
        return EXCLUDED_STILL_RUNNING
    if last.gpus <= 0:
        return EXCLUDED_CPU_ONLY
    duration = float(sum(r.elapsed_s for r in started))
    if duration <= 0:
        return EXCLUDED_ZERO_RUN
    first = job_runs[0]
    partition = _partition_of(last.partition, room.known, room.default_partition, notes)
    gpu_types = last.gpu_types or constraint_gpu_types(last.constraints, room.cluster_types)
    max_gpus, max_cpus, node_count = room.biggest[partition]
    if gpu_types and not room.cluster_types:
        notes[NOTE_TYPES_IGNORED] += 1
        gpu_types = ()
    elif gpu_types:
        typed = room.typed(partition, gpu_types)
        if typed is None:
            return EXCLUDED_NO_GPU_TYPE
        max_gpus, node_count = typed
    num_nodes = max(1, last.num_nodes)
    gpus_per_node = -(-last.gpus // num_nodes)
    if gpus_per_node > max_gpus or num_nodes > node_count:
        return EXCLUDED_TOO_BIG
    cpus = max(1, last.cpus)
    if -(-cpus // num_nodes) > max_cpus:
        notes["CPUs per node capped at the node size"] += 1
        cpus = max_cpus * num_nodes
    limit = last.time_limit_s
    if limit is None and partition and room.known[partition].max_time_s is not None:
        limit = room.known[partition].max_time_s
    submit = first.submit if first.submit is not None else last.start
    eligible = first.eligible if first.eligible is not None else submit
    return TraceJob(
        job_id=job_id,
        display_id=last.display_id,
        user=last.user or "(unknown)",
        account=last.account,
        partition=partition,
        qos=last.qos,
        name=last.name,
        comment=last.comment,
        submit=float(submit),  # type: ignore[arg-type]
        eligible_delay_s=max(0.0, float(eligible) - float(submit)),  # type: ignore[arg-type]
        duration_s=duration,
        time_limit_s=limit,
        gpus=last.gpus,
        num_nodes=num_nodes,
        cpus=cpus,
        array_job_id=last.array_job_id,
        array_task_id=last.array_task_id,
        gpu_types=gpu_types,
        final_state=last.state.value,
    )


def _partition_of(name: str, known: dict, default: str, notes: Counter[str]) -> str:
    """The job's partition in the simulated cluster; unknown ones map to the default partition."""
    if name in known:
        return name
    for candidate in name.split(","):  # a job submitted to several partitions
        if candidate in known:
            return candidate
    if known:
        notes["partition not in slurm.conf: default partition used"] += 1
    return default
