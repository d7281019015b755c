"""The pyslurm backend (extra `[pyslurm]`): Slurm's C API through pyslurm 25.11.

pyslurm builds only against the matching Slurm release (pyslurm 25.11 needs Slurm 25.11), so
this backend is chosen only when `import pyslurm` works and its version is 25.11; otherwise
`PyslurmBackend.create` says why and which backend to use instead. The translation from
pyslurm objects to the domain model follows pyslurm's documented attributes (`pyslurm.Job`,
`pyslurm.Node`, `pyslurm.db.Job`, `pyslurm.JobSubmitDescription`) and is unit-tested with
objects of that shape; it has not been run against a live Slurm 25.11 here (see
docs/engine.md).

What pyslurm cannot give: SiteFactor (as with scontrol, the engine relies on what it wrote),
the switch tree (read from topology.conf), and earlier runs of requeued jobs (the database
API returns the last run; the engine keeps earlier ones in its state store).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

from dike_slurm.accounting import AccountingRecord, ReadResult
from dike_slurm.backends.base import (
    Backend,
    ClusterState,
    JobField,
    JobUpdate,
    SwitchRequest,
    WriteOutcome,
)
from dike_slurm.config import SlurmSettings
from dike_slurm.errors import DikeError, InputError, SlurmError
from dike_slurm.model import Job, JobState, Node, Placement, Topology
from dike_slurm.parsing.durations import format_duration
from dike_slurm.parsing.hostlists import expand_hostlist
from dike_slurm.parsing.slurm_conf import parse_topology_conf

SUPPORTED_RELEASE = "25.11"
_JOB_GONE = ("Invalid job id", "already finished", "no longer pending")


class PyslurmUnavailable(DikeError):
    """pyslurm is missing or built for another Slurm release."""


def _int(value: Any) -> int | None:
    """pyslurm returns None for unset/unlimited numbers, and sometimes the word UNLIMITED."""
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _epoch(value: Any) -> float | None:
    number = _int(value)
    return float(number) if number else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _hosts(value: Any) -> tuple[str, ...]:
    if isinstance(value, (list, tuple)):
        return tuple(str(v) for v in value)
    try:
        return expand_hostlist(_text(value))
    except InputError:
        return ()


def _gpu_count(value: Any) -> int:
    """A GRES dict's value: an int, or an object with an int ``count`` (pyslurm.db.tres.GPU)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    count = getattr(value, "count", None)
    return count if isinstance(count, int) and not isinstance(count, bool) else 0


def gres_gpus(gres: Any) -> int:
    """GPUs in a pyslurm GRES dict, in the shapes pyslurm 25.11 gives.

    ``{"gpu": 8}``, ``{"gpu:a100": 4, "gpu:v100": 2}``; ``Job.gres_per_node`` names them
    ``{"gres/gpu": 1}`` (Slurm's TRES name), and ``Job.gres``/``db.Job.gres`` hold
    ``pyslurm.db.tres.GPU`` objects, whose ``count`` is the figure (both seen on Slurm 25.11.7
    with pyslurm 25.11.2, issue 34).
    """
    if not isinstance(gres, Mapping):
        return 0
    total = 0
    for name, value in gres.items():
        kind = str(name).removeprefix("gres/").split(":", 1)[0]
        if kind == "gpu":
            total += _gpu_count(value)
    return total


def gres_gpu_types(gres: Any) -> tuple[str, ...]:
    """GPU types in a pyslurm GRES dict, in order: {"gpu:a100": 4, "gpu:v100": 2} -> ("a100", "v100")."""
    if not isinstance(gres, Mapping):
        return ()
    types: list[str] = []
    for name in gres:
        kind, _, gpu_type = str(name).partition(":")
        if kind == "gpu" and gpu_type and gpu_type not in types:
            types.append(gpu_type)
    return tuple(types)


def job_from_pyslurm(job: Any) -> Job:
    """A `pyslurm.Job` as the domain Job."""
    state = JobState.parse(_text(job.state))
    num_nodes = _int(job.num_nodes) or 1
    limit_min = _int(job.time_limit)
    switches = _int(job.required_switches) or 0
    constraints = job.constraints
    features = ",".join(constraints) if isinstance(constraints, (list, tuple)) else _text(constraints)
    array_id = _int(job.array_id) or None
    return Job(
        job_id=int(job.id),
        user=_text(job.user_name),
        state=state,
        submit_time=_epoch(job.submit_time) or 0.0,
        gpus=gres_gpus(job.gres_per_node) * num_nodes,
        num_nodes=num_nodes,
        cpus=_int(job.cpus) or 1,
        account=_text(job.account),
        partition=_text(job.partition),
        qos=_text(job.qos),
        name=_text(job.name),
        comment=_text(job.comment),
        array_job_id=array_id,
        array_task_id=_int(job.array_task_id) if array_id else None,
        eligible_time=_epoch(job.eligible_time),
        start_time=_epoch(job.start_time) if state is JobState.RUNNING else None,
        time_limit_s=limit_min * 60 if limit_min is not None else None,
        nodes=_hosts(job.allocated_nodes) if state is JobState.RUNNING else (),
        placement=Placement(
            max_switches=switches or None,
            switches_wait_s=_int(job.max_wait_time_switches) if switches else None,
            features=features or None,
            exclude_nodes=_hosts(job.excluded_nodes),
            require_nodes=_hosts(job.required_nodes),
        ),
        priority=_int(job.priority),
        nice=_int(job.nice) or 0,
        requeueable=bool(job.is_requeueable),
        gpu_types=gres_gpu_types(job.gres_per_node),
        slurm_reason=_text(job.state_reason) if state is JobState.PENDING and job.state_reason != "None" else "",
    )


def node_from_pyslurm(node: Any) -> Node:
    """A `pyslurm.Node` as the domain Node."""
    return Node(
        name=_text(node.name),
        gpus=gres_gpus(node.configured_gres),
        gpus_alloc=gres_gpus(node.allocated_gres),
        cpus=_int(node.total_cpus) or 1,
        state=_text(node.state).upper() or "UNKNOWN",
        features=tuple(str(f) for f in (node.active_features or node.available_features or [])),
        partitions=tuple(str(p) for p in node.partitions or []),
        gpu_types=gres_gpu_types(node.configured_gres),
    )


def record_from_pyslurm_db(job: Any) -> AccountingRecord:
    """A `pyslurm.db.Job` (one run) as an AccountingRecord."""
    start = _epoch(job.start_time)
    array_id = _int(job.array_id) or None
    task = _int(job.array_task_id) if array_id else None
    limit_min = _int(job.time_limit)
    state_text = _text(job.state)
    return AccountingRecord(
        job_id=int(job.id),
        display_id=f"{array_id}_{task}" if array_id and task is not None else str(job.id),
        array_job_id=array_id,
        array_task_id=task,
        name=_text(job.name),
        user=_text(job.user_name),
        account=_text(job.account),
        partition=_text(job.partition),
        qos=_text(job.qos),
        state=JobState.parse(state_text),
        state_text=state_text,
        submit=_epoch(job.submit_time),
        eligible=_epoch(job.eligible_time),
        start=start,
        end=_epoch(job.end_time),
        elapsed_s=_int(job.elapsed_time) or 0,
        time_limit_s=limit_min * 60 if limit_min is not None else None,
        num_nodes=_int(job.num_nodes) or 1,
        cpus=_int(job.cpus) or 1,
        gpus=gres_gpus(job.gres),  # documented: what the run allocated, or requested if it never ran
        nodes=_hosts(job.nodelist),
        priority=_int(job.priority),
    )


def submit_description_fields(update: JobUpdate) -> dict[str, Any]:
    """JobSubmitDescription keyword arguments for an update (Priority None is hold+release)."""
    fields: dict[str, Any] = {}
    for key, value in update.values:
        if key is JobField.SITE_FACTOR:
            fields["site_factor"] = value
        elif key is JobField.PRIORITY and value is not None:
            fields["priority"] = value
        elif key is JobField.NICE:
            fields["nice"] = value
        elif key is JobField.ADMIN_COMMENT:
            fields["admin_comment"] = value
        elif key is JobField.FEATURES:
            fields["constraints"] = value
        elif key is JobField.EXCLUDED_NODES:
            fields["excluded_nodes"] = list(value or ())  # type: ignore[arg-type]
        elif key is JobField.REQUIRED_NODES:
            fields["required_nodes"] = list(value or ())  # type: ignore[arg-type]
        elif key is JobField.SWITCHES:
            assert isinstance(value, SwitchRequest)
            switches: dict[str, Any] = {"count": value.count}
            if value.count and value.wait_s is not None:
                switches["max_wait_time"] = format_duration(value.wait_s)
            fields["switches"] = switches
    return fields


def _topology(settings: SlurmSettings) -> Topology:
    path = settings.topology_conf
    if path is None and settings.slurm_conf is not None:
        beside = Path(settings.slurm_conf).parent / "topology.conf"
        path = beside if beside.is_file() else None
    if path is None:
        return Topology()
    try:
        return parse_topology_conf(Path(path).read_text(encoding="utf-8"), source=str(path))
    except OSError as exc:
        raise SlurmError(f"cannot read topology file {path}: {exc.strerror}") from None


def _values(collection: Any) -> Iterable[Any]:
    """Objects of a pyslurm collection (a dict, or a multi-cluster map with .values())."""
    return list(collection.values())


class PyslurmBackend(Backend):
    """Slurm through pyslurm; same contract as the command-line backend."""

    name = "pyslurm"

    def __init__(self, settings: SlurmSettings, module: ModuleType | Any, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.pyslurm = module
        self.clock = clock
        self.topology = _topology(settings)

    @classmethod
    def create(cls, settings: SlurmSettings) -> PyslurmBackend:
        """The backend, if pyslurm is importable and built for the supported Slurm release."""
        try:
            import pyslurm  # type: ignore[import-not-found]
        except ImportError as exc:
            raise PyslurmUnavailable(
                f"slurm.backend = 'pyslurm' but pyslurm cannot be imported ({exc}); install the extra "
                f"(pip install 'dike-slurm[pyslurm]', needs Slurm {SUPPORTED_RELEASE} headers) or use backend 'cli'"
            ) from None
        version = str(getattr(pyslurm, "__version__", ""))
        if not version.startswith(SUPPORTED_RELEASE + "."):
            raise PyslurmUnavailable(
                f"pyslurm {version or '(unknown version)'} is installed; this backend supports pyslurm "
                f"{SUPPORTED_RELEASE} for Slurm {SUPPORTED_RELEASE}; use backend 'cli'"
            )
        return cls(settings, pyslurm)

    def _call(self, what: str, function: Callable[[], Any]) -> Any:
        self.calls += 1
        try:
            return function()
        except Exception as exc:  # pyslurm raises RPCError and friends; all become SlurmError
            raise SlurmError(f"pyslurm {what}: {exc}") from None

    def read_cluster(self) -> ClusterState:
        now = self.clock()
        jobs: list[Job] = []
        admin_comments: dict[int, str] = {}
        for raw in _values(self._call("Jobs.load()", self.pyslurm.Jobs.load)):
            job = job_from_pyslurm(raw)
            if job.state.is_active:
                jobs.append(job)
                admin_comments[job.job_id] = _text(raw.admin_comment)
        nodes = tuple(node_from_pyslurm(n) for n in _values(self._call("Nodes.load()", self.pyslurm.Nodes.load)))
        return ClusterState(
            time=now,
            jobs=tuple(jobs),
            nodes=nodes,
            topology=self.topology,
            site_factors=MappingProxyType({}),
            admin_comments=MappingProxyType(admin_comments),
        )

    def accounting(self, start: float, end: float) -> ReadResult:
        db = self.pyslurm.db
        query = db.JobFilter(start_time=int(start), end_time=int(end))
        loaded = self._call("db.Jobs.load()", lambda: db.Jobs.load(query))
        records = tuple(record_from_pyslurm_db(j) for j in _values(loaded))
        return ReadResult(records, len(records), {}, "pyslurm.db")

    def describe(self, update: JobUpdate) -> str:
        parts = []
        fields = submit_description_fields(update)
        if fields:
            arguments = ", ".join(f"{k}={v!r}" for k, v in fields.items())
            parts.append(f"pyslurm.Job({update.job_id}).modify(JobSubmitDescription({arguments}))")
        if any(k is JobField.PRIORITY and v is None for k, v in update.values):
            parts += [f"pyslurm.Job({update.job_id}).hold()", f"pyslurm.Job({update.job_id}).release()"]
        return "; ".join(parts)

    def apply(self, update: JobUpdate) -> WriteOutcome:
        job = self.pyslurm.Job(update.job_id)
        steps: list[Callable[[], Any]] = []
        fields = submit_description_fields(update)
        if fields:
            steps.append(lambda: job.modify(self.pyslurm.JobSubmitDescription(**fields)))
        if any(k is JobField.PRIORITY and v is None for k, v in update.values):
            steps += [job.hold, job.release]
        return self._write(self.describe(update), steps)

    def signal(self, job_id: int, signal: str) -> WriteOutcome:
        job = self.pyslurm.Job(job_id)
        return self._write(
            f"pyslurm.Job({job_id}).send_signal({signal!r}, steps='batch')", [lambda: job.send_signal(signal, steps="batch")]
        )

    def requeue(self, job_id: int) -> WriteOutcome:
        return self._write(f"pyslurm.Job({job_id}).requeue()", [self.pyslurm.Job(job_id).requeue])

    def _write(self, text: str, steps: list[Callable[[], Any]]) -> WriteOutcome:
        for step in steps:
            self.calls += 1
            try:
                step()
            except Exception as exc:  # RPCError carries Slurm's own message
                message = str(exc)
                return WriteOutcome(False, text, message, job_gone=any(m in message for m in _JOB_GONE))
        return WriteOutcome(True, text)

