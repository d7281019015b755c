"""The pyslurm backend (extra `[pyslurm]`): Slurm's C API through pyslurm 25.11.

pyslurm builds only against the matching Slurm release (pyslurm 25.11 needs Slurm 25.11), so
this backend is chosen only when `import pyslurm` works and its version is 25.11; otherwise
`PyslurmBackend.create` says why and which backend to use instead. The translation from
pyslurm objects to the domain model is unit-tested on the attributes of real objects recorded
on a Slurm 25.11.7 lab with pyslurm 25.11.2 (tests/fixtures/pyslurm-25.11), and the backend's
reads are compared with the command-line backend's on that lab (tests/integration/test_pyslurm_lab.py).

GPU counts come from the TRES Slurm tracks (Job.gpus, Node.allocated_gres, db.Job.gres): without
`gres/gpu` in AccountingStorageTRES they are empty, so the backend refuses such a cluster with
one line (the check `dike-slurm doctor` makes for both backends).

The site's priority model (weights, QOS, partitions' TRESBillingWeights) is read with Slurm's
commands, as the command-line backend reads it. SiteFactor, which pyslurm's Job lacks, is read with sprio (eligible pending jobs, as the
command-line backend reads it). What pyslurm cannot give: the switch tree (read from topology.conf), earlier runs of requeued jobs (the database API
returns the last run; the engine keeps earlier ones in its state store). A job's GPU types are
those of its requested TRES: pyslurm 25.11.2 reads tres_per_job as None, and gres_per_node is
empty for a per-job request (`--gpus=v100:2`).

What pyslurm cannot write: Switches (pyslurm 25.11.0-25.11.2's `_set_switches` raises
"name 'kwargs' is not defined"), Nice=0 and SiteFactor=0 (never sent), and clearing Features,
ExcNodeList, ReqNodeList or AdminComment (an empty value returns ok but Slurm keeps the old one).
Those go through `scontrol update`, the command-line backend's write; every placement write is
read back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, TypeVar

from dike_slurm.slurm.accounting import AccountingRecord, ReadResult
from dike_slurm.slurm.backends.base import Backend, ClusterState, WriteOutcome
from dike_slurm.domain.fields import JobField, JobUpdate, placement_value, SwitchRequest
from dike_slurm.slurm.backends.cli import SlurmCliBackend
from dike_slurm.config import SlurmSettings
from dike_slurm.errors import DikeError, InputError, SlurmError
from dike_slurm.domain.model import Job, JobState, Node, Placement, Topology
from dike_slurm.parsing.durations import format_duration
from dike_slurm.parsing.hostlists import expand_hostlist
from dike_slurm.slurm.slurm_conf import parse_topology_conf
from dike_slurm.parsing.tres import tracks_gpus
from dike_slurm.domain.slurm_priority import SlurmPriorityModel

SUPPORTED_RELEASE = "25.11"
_T = TypeVar("_T")
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
    """A GRES dict's value: an int, digits, or an object with an int ``count`` (pyslurm.db.tres.GPU)."""
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    count = getattr(value, "count", None)
    return count if isinstance(count, int) and not isinstance(count, bool) else 0


def _gpu_entries(gres: Any) -> list[tuple[str, int]]:
    """(type, count) of each GPU entry of a pyslurm GRES dict; type "" for the untyped one."""
    if not isinstance(gres, Mapping):
        return []
    entries = []
    for name, value in gres.items():
        kind, _, gpu_type = str(name).removeprefix("gres/").partition(":")
        if kind == "gpu":
            entries.append((gpu_type, _gpu_count(value)))
    return entries


def gres_gpus(gres: Any) -> int:
    """GPUs in a pyslurm GRES dict, in the shapes pyslurm 25.11 gives (tests/fixtures/pyslurm-25.11).

    A TRES dict (``Job.gpus``, ``Node.allocated_gres``, ``db.Job.gres``) names the same GPUs twice,
    as the total and by type: ``{"gpu": GPU(12), "gpu:a100": GPU(12)}`` or ``{"gpu": 8, "gpu:a100":
    8}``: the untyped total counts. A configured or requested GRES (``Node.configured_gres``,
    ``Job.gres_per_node``: ``{"gpu:a100": 8}``, ``{"gres/gpu": 2}``) has one entry per type: their sum.
    """
    entries = _gpu_entries(gres)
    untyped = [count for gpu_type, count in entries if not gpu_type]
    return sum(untyped) if untyped else sum(count for _, count in entries)


def gres_gpu_types(gres: Any) -> tuple[str, ...]:
    """GPU types in a pyslurm GRES dict, in order: {"gres/gpu:a100": 4, "gpu:v100": 2} -> ("a100", "v100")."""
    types: list[str] = []
    for gpu_type, _ in _gpu_entries(gres):
        if gpu_type and gpu_type not in types:
            types.append(gpu_type)
    return tuple(types)


def _array_task(job: Any, array_id: int | None) -> int | None:
    """The task id of an array task. pyslurm 25.11.2 reads 0 as unset (u32_parse's zero_is_noval),
    so task 0 comes back None, as the record of the tasks still pending does: that one lists them
    in array_tasks_waiting (`0-2`; `0x7` in accounting), a task does not (seen on the 25.11 lab)."""
    if not array_id:
        return None
    task = _int(job.array_task_id)
    return 0 if task is None and not job.array_tasks_waiting else task


def _tres_count(tres: Any, kind: str) -> int | None:
    """The count of one TRES (cpu, node) of a pyslurm TrackableResources."""
    return _int(getattr(getattr(tres, kind, None), "count", None)) if tres is not None else None


def _tres_gres(tres: Any) -> Any:
    """The GRES dict of a pyslurm TrackableResources (None when Slurm gave none)."""
    return getattr(tres, "gres", None) if tres is not None else None


def job_from_pyslurm(job: Any) -> Job:
    """A `pyslurm.Job` as the domain Job."""
    state = JobState.parse(_text(job.state))
    num_nodes = _int(job.num_nodes) or 1
    limit_min = _int(job.time_limit)
    # as squeue's: a running job's Switches are history, not a constraint the engine may change
    switches = (_int(job.required_switches) or 0) if state is JobState.PENDING else 0
    constraints = job.constraints
    features = ",".join(constraints) if isinstance(constraints, (list, tuple)) else _text(constraints)
    array_id = _int(job.array_id) or None
    return Job(
        job_id=int(job.id),
        user=_text(job.user_name),
        state=state,
        submit_time=_epoch(job.submit_time) or 0.0,
        gpus=gres_gpus(job.gpus),  # the tracked TRES: allocated while running, else requested
        num_nodes=num_nodes,
        cpus=_int(job.cpus) or 1,
        account=_text(job.account),
        partition=_text(job.partition),
        qos=_text(job.qos),
        name=_text(job.name),
        comment=_text(job.comment),
        array_job_id=array_id,
        array_task_id=_array_task(job, array_id),
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
        gpu_types=gres_gpu_types(_tres_gres(job.requested_tres)) or gres_gpu_types(job.gres_per_node),
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
    task = _array_task(job, array_id)
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
        # a run that never started has 0 nodes and CPUs: its request, as sacct prints it
        num_nodes=_int(job.num_nodes) or _tres_count(job.requested_tres, "node") or 1,
        cpus=_int(job.cpus) or _tres_count(job.requested_tres, "cpu") or 1,
        # pyslurm's db.Job.gres is `(allocated_tres or requested_tres).gres`: a job cancelled before it
        # started has an allocated TRES without GPUs, so its request is read, as sacct prints it
        gpus=gres_gpus(job.gres) or gres_gpus(_tres_gres(job.requested_tres)),
        nodes=_hosts(job.nodelist),
        priority=_int(job.priority),
        gpu_types=gres_gpu_types(_tres_gres(job.requested_tres)),
        alloc_gpu_types=gres_gpu_types(_tres_gres(job.allocated_tres)),
        constraints=",".join(job.constraints) if isinstance(job.constraints, (list, tuple)) else _text(job.constraints),
    )


def _skipped_by_pyslurm(key: JobField, value: Any) -> bool:
    """A value pyslurm 25.11.2's JobSubmitDescription does not send: it tests `if self.nice:` and
    `if self.site_factor:` (0 is never written), and sends '' and () as unset (Slurm keeps
    Features, ExcNodeList, ReqNodeList, AdminComment). Seen on Slurm 25.11.7 (the lab tests)."""
    if key in (JobField.NICE, JobField.SITE_FACTOR):
        return value == 0
    if key in (JobField.FEATURES, JobField.EXCLUDED_NODES, JobField.REQUIRED_NODES, JobField.ADMIN_COMMENT):
        return not value
    return False


def split_update(update: JobUpdate) -> tuple[dict[JobField, Any], dict[JobField, Any]]:
    """The fields pyslurm writes, and those written with `scontrol update` instead: Switches (pyslurm
    25.11.0-25.11.2's `_set_switches` raises "name 'kwargs' is not defined"), and the values pyslurm
    does not send (_skipped_by_pyslurm: `scontrol update ExcNodeList= Nice=0` does clear them)."""
    through_pyslurm: dict[JobField, Any] = {}
    through_scontrol: dict[JobField, Any] = {}
    for key, value in update.values:
        if key is JobField.SWITCHES or _skipped_by_pyslurm(key, value):
            through_scontrol[key] = value
        else:
            through_pyslurm[key] = value
    return through_pyslurm, through_scontrol


def submit_description_fields(values: Mapping[JobField, Any]) -> dict[str, Any]:
    """JobSubmitDescription keyword arguments for the fields pyslurm writes (Priority None is
    hold+release, Switches go through scontrol: see split_update)."""
    fields: dict[str, Any] = {}
    for key, value in values.items():
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
            fields["excluded_nodes"] = list(value)
        elif key is JobField.REQUIRED_NODES:
            fields["required_nodes"] = list(value)
    return fields


def _same_placement_value(key: JobField, wanted: Any, read: Any) -> bool:
    """Whether Slurm holds what was written: node lists as sets; Switches by count (Slurm caps the
    wait at max_switch_wait: 1@00:10:00 is stored as 1@00:05:00)."""
    if key is JobField.SWITCHES:
        assert isinstance(wanted, SwitchRequest) and isinstance(read, SwitchRequest)
        return wanted.count == read.count
    if key in (JobField.EXCLUDED_NODES, JobField.REQUIRED_NODES):
        return set(wanted or ()) == set(read or ())
    return bool(wanted == read)


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
    """Slurm through pyslurm; same contract as the command-line backend. `scontrol` is the
    command-line backend on the same cluster, for the writes pyslurm cannot make (split_update)."""

    name = "pyslurm"

    def __init__(self, settings: SlurmSettings, module: ModuleType | Any, *, scontrol: SlurmCliBackend,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.pyslurm = module
        self.scontrol = scontrol
        self.clock = clock
        self.topology = _topology(settings)
        self._gpus_tracked = False  # checked on the first read (slurmctld's AccountingStorageTRES)

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
        return cls(settings, pyslurm, scontrol=SlurmCliBackend(settings))

    def _call(self, what: str, function: Callable[[], Any]) -> Any:
        self.calls += 1
        try:
            return function()
        except Exception as exc:  # pyslurm raises RPCError and friends; all become SlurmError
            raise SlurmError(f"pyslurm {what}: {exc}") from None

    def _check_gpus_tracked(self) -> None:
        """pyslurm 25.11 counts GPUs only from the TRES Slurm tracks: refuse a cluster without gres/gpu."""
        if self._gpus_tracked:
            return
        config = self._call("slurmctld.Config.load()", self.pyslurm.slurmctld.Config.load)
        tracked = ",".join(str(t) for t in config.accounting_storage_tres or ())
        if not tracks_gpus(tracked):
            raise SlurmError(
                f"the pyslurm backend cannot count GPUs on this cluster: AccountingStorageTRES={tracked or '(unset)'} "
                "does not track gres/gpu, and pyslurm 25.11 takes jobs' and nodes' GPUs from the tracked TRES; add "
                "gres/gpu to AccountingStorageTRES (needs slurmdbd) or use slurm.backend = 'cli' (dike-slurm doctor)")
        self._gpus_tracked = True

    def read_cluster(self) -> ClusterState:
        now = self.clock()
        self._check_gpus_tracked()
        jobs: list[Job] = []
        admin_comments: dict[int, str] = {}
        for raw in _values(self._call("Jobs.load()", self.pyslurm.Jobs.load)):
            job = job_from_pyslurm(raw)
            if job.state.is_active:
                jobs.append(job)
                admin_comments[job.job_id] = _text(raw.admin_comment)
        nodes = tuple(node_from_pyslurm(n) for n in _values(self._call("Nodes.load()", self.pyslurm.Nodes.load)))
        # pyslurm's Job has no SiteFactor: sprio's, as the command-line backend reads it (eligible
        # pending jobs), which the published view shows users that PrivateData=jobs keeps to their own jobs
        site_factors = self._via_scontrol(self.scontrol.site_factors)
        return ClusterState(
            time=now,
            jobs=tuple(jobs),
            nodes=nodes,
            topology=self.topology,
            site_factors=site_factors,
            admin_comments=MappingProxyType(admin_comments),
        )

    def accounting(self, start: float, end: float) -> ReadResult:
        self._check_gpus_tracked()
        db = self.pyslurm.db
        query = db.JobFilter(start_time=int(start), end_time=int(end))
        loaded = self._call("db.Jobs.load()", lambda: db.Jobs.load(query))
        records = tuple(record_from_pyslurm_db(j) for j in _values(loaded))
        return ReadResult(records, len(records), {}, "pyslurm.db")

    def priority_model(self) -> SlurmPriorityModel | None:
        """The site's priority weights, QOS and partitions (TRESBillingWeights among them) as the
        command-line backend reads them (scontrol show config / partition, sacctmgr): once at the
        engine's start and after a reload. Without them every GPU-second would weigh 1."""
        return self._via_scontrol(self.scontrol.priority_model)

    def _via_scontrol(self, function: Callable[[], _T]) -> _T:
        """A call through the command-line backend, its Slurm commands counted as this backend's calls."""
        before = self.scontrol.calls
        try:
            return function()
        finally:
            self.calls += self.scontrol.calls - before

    def describe(self, update: JobUpdate) -> str:
        through_pyslurm, through_scontrol = split_update(update)
        parts = []
        fields = submit_description_fields(through_pyslurm)
        if fields:
            arguments = ", ".join(f"{k}={v!r}" for k, v in fields.items())
            parts.append(f"pyslurm.Job({update.job_id}).modify(JobSubmitDescription({arguments}))")
        if any(k is JobField.PRIORITY and v is None for k, v in update.values):
            parts += [f"pyslurm.Job({update.job_id}).hold()", f"pyslurm.Job({update.job_id}).release()"]
        if through_scontrol:
            parts.append(self.scontrol.describe(JobUpdate.of(update.job_id, through_scontrol)))
        return "; ".join(parts)

    def apply(self, update: JobUpdate) -> WriteOutcome:
        text = self.describe(update)
        through_pyslurm, through_scontrol = split_update(update)
        job = self.pyslurm.Job(update.job_id)
        steps: list[Callable[[], Any]] = []
        fields = submit_description_fields(through_pyslurm)
        if fields:
            steps.append(lambda: job.modify(self.pyslurm.JobSubmitDescription(**fields)))
        if any(k is JobField.PRIORITY and v is None for k, v in update.values):
            steps += [job.hold, job.release]
        outcome = self._write(text, steps)
        if outcome.ok and through_scontrol:
            done = self._via_scontrol(lambda: self.scontrol.apply(JobUpdate.of(update.job_id, through_scontrol)))
            if not done.ok:
                return WriteOutcome(False, text, done.message, job_gone=done.job_gone)
        if outcome.ok and any(k.is_placement for k in update.fields):
            return self._read_back(update, text)
        return outcome

    def _read_back(self, update: JobUpdate, text: str) -> WriteOutcome:
        """The written placement fields as Slurm holds them now: a write Slurm did not take fails."""
        self.calls += 1
        try:
            placement = job_from_pyslurm(self.pyslurm.Job.load(update.job_id)).placement
        except Exception as exc:  # the job left meanwhile, or slurmctld did not answer
            message = str(exc)
            return WriteOutcome(False, text, f"reading the job back: {message}",
                                job_gone=any(m in message for m in _JOB_GONE))
        kept = [f"{key.name} is {placement_value(placement, key)!r}, not {value!r}"
                for key, value in update.values
                if key.is_placement and not _same_placement_value(key, value, placement_value(placement, key))]
        if kept:
            return WriteOutcome(False, text, "Slurm did not take the write: " + "; ".join(kept))
        return WriteOutcome(True, text)

    def signal(self, job_id: int, signal: str) -> WriteOutcome:
        # pyslurm looks names up in Python's signal.Signals: SIGUSR1, not scancel's USR1
        name = signal if signal.isdigit() or signal.upper().startswith("SIG") else f"SIG{signal.upper()}"
        job = self.pyslurm.Job(job_id)
        return self._write(
            f"pyslurm.Job({job_id}).send_signal({name!r}, steps='batch')", [lambda: job.send_signal(name, steps="batch")]
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
