"""The immutable domain model every policy sees: jobs, nodes, the switch tree, a snapshot."""

from __future__ import annotations

import bisect
import enum
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from dike_slurm.errors import InputError
from dike_slurm.frozen import frozen_record

if TYPE_CHECKING:
    from dike_slurm.domain.service_prior import ServicePrior
    from dike_slurm.domain.slurm_priority import SlurmPriorityModel


class JobState(enum.Enum):
    """The job states the engine distinguishes (Slurm's base states)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    OTHER = "OTHER"

    @classmethod
    def parse(cls, text: str) -> JobState:
        """`CANCELLED by 1234` -> CANCELLED; unknown words -> OTHER."""
        exact = _STATE_BY_NAME.get(text)
        if exact is not None:
            return exact
        word = (text or "").strip().split(" ", 1)[0].upper()
        try:
            return cls(word)
        except ValueError:
            return cls.OTHER

    @property
    def is_active(self) -> bool:
        return self in (JobState.PENDING, JobState.RUNNING, JobState.SUSPENDED)


_STATE_BY_NAME = {state.value: state for state in JobState}


@dataclass(frozen=True)
class Placement:
    """A placement constraint as Slurm expresses it on a pending job."""

    max_switches: int | None = None  # Slurm Switches=COUNT
    switches_wait_s: int | None = None  # Slurm Switches=COUNT@WAIT
    features: str | None = None  # Slurm Features= (e.g. a leaf feature)
    exclude_nodes: tuple[str, ...] = ()  # Slurm ExcNodeList=
    require_nodes: tuple[str, ...] = ()  # Slurm ReqNodeList= (a preempting job pinned to the nodes freed for it)

    @property
    def is_empty(self) -> bool:
        return (
            self.max_switches is None
            and self.features is None
            and not self.exclude_nodes
            and not self.require_nodes
        )


NO_PLACEMENT = Placement()


@dataclass(frozen=True)
class Job:
    """One Slurm job (an array task is a job of its own) at the time of the snapshot."""

    job_id: int
    user: str
    state: JobState
    submit_time: float
    gpus: int = 0  # total GPUs allocated (running) or requested (pending)
    num_nodes: int = 1
    cpus: int = 1
    account: str = ""
    partition: str = ""
    qos: str = ""
    name: str = ""
    comment: str = ""
    array_job_id: int | None = None
    array_task_id: int | None = None
    eligible_time: float | None = None
    start_time: float | None = None  # start of the current run (running jobs)
    pending_since: float | None = None  # submit, or the last requeue
    time_limit_s: int | None = None  # None: UNLIMITED
    attained_gpu_s: float = 0.0  # GPU-seconds of every run, the current one included
    attained_at_promotion_gpu_s: float = 0.0  # service already forgiven by a promotion
    run_count: int = 0  # runs started so far (a requeued job has several)
    last_run_s: float = 0.0  # length of the last (or current) run
    preemptions: int = 0
    nodes: tuple[str, ...] = ()  # allocated nodes (running jobs)
    placement: Placement = NO_PLACEMENT  # what the job carries now
    priority: int | None = None
    site_factor: int | None = None
    nice: int = 0
    requeueable: bool = False
    # pending: its ReqNodeList is the engine's pin for a preemption that freed (or frees) those nodes
    pinned_for_preemption: bool = False
    # the GPU types the job may run on: its typed GRES request (gpu:a100:4), or the GPU types its
    # feature constraint names (--constraint=a100|v100); () when it asked for none: any type
    gpu_types: tuple[str, ...] = ()
    slurm_reason: str = ""  # why Slurm keeps a pending job waiting (squeue's REASON); "" when none
    true_duration_s: float | None = None  # replay only: the trace's run time

    @property
    def display_id(self) -> str:
        """`123_4` for array tasks, `123` otherwise (as squeue prints it)."""
        if self.array_job_id is not None and self.array_task_id is not None:
            return f"{self.array_job_id}_{self.array_task_id}"
        return str(self.job_id)

    @property
    def gpus_per_node(self) -> int:
        return -(-self.gpus // max(self.num_nodes, 1))

    @property
    def counted_gpu_s(self) -> float:
        """Attained service that counts for the queue level (after promotions)."""
        return max(0.0, self.attained_gpu_s - self.attained_at_promotion_gpu_s)

    def waiting_s(self, now: float) -> float:
        """Seconds the job has been waiting in its current pending period."""
        since = self.pending_since if self.pending_since is not None else self.submit_time
        return max(0.0, now - since) if self.state is JobState.PENDING else 0.0

    # At 50,000 jobs per engine cycle the frozen __init__ showed in the profile: `build` and
    # `with_changes` are 2.5x and 6x faster with dike_slurm.frozen.frozen_record.

    @classmethod
    def build(cls, **values: object) -> Job:
        """The same Job as `Job(**values)`, built faster (the backends' per-job constructor)."""
        if not values.keys() <= _JOB_FIELDS:  # comparisons allocate nothing; the messages do
            raise TypeError(f"Job has no field(s) {sorted(values.keys() - _JOB_FIELDS)}")
        if not values.keys() >= _JOB_REQUIRED:
            raise TypeError(f"Job is missing required field(s) {sorted(_JOB_REQUIRED - values.keys())}")
        state = dict(_JOB_DEFAULTS)
        state.update(values)
        return frozen_record(cls, state)

    def with_changes(self, **changes: object) -> Job:
        """`dataclasses.replace(self, **changes)`, faster (the engine copies every job once per cycle)."""
        if not changes.keys() <= _JOB_FIELDS:
            raise TypeError(f"Job has no field(s) {sorted(changes.keys() - _JOB_FIELDS)}")
        state = dict(self.__dict__)
        state.update(changes)
        return frozen_record(Job, state)


_JOB_FIELDS = frozenset(f.name for f in fields(Job))
_JOB_DEFAULTS = {f.name: f.default for f in fields(Job) if f.default is not MISSING}
_JOB_REQUIRED = _JOB_FIELDS - _JOB_DEFAULTS.keys()


@dataclass(frozen=True)
class PreemptionOptIn:
    """The site's opt-in rule for live preemption (engine.preemptible_tag, _partitions, _qos): a job
    may be preempted when its comment holds the tag, one of its partitions is listed, or its QOS is."""

    tag: str
    partitions: frozenset[str] = frozenset()
    qos: frozenset[str] = frozenset()

    def admits(self, partition: str, qos: str, comment: str) -> bool:
        return self.tag in (comment or "") or bool(set(partition.split(",")) & self.partitions) or qos in self.qos


# Why a job is exempt (`Exemptions.kind`): what only an admin sets, then the job's own comment.
EXEMPT_KINDS = ("qos", "partition", "account", "admin_comment", "comment")


@dataclass(frozen=True)
class Exemptions:
    """The jobs the engine never writes (`[scope]`): a QOS, partition or account the site lists, or
    the admin tag in the job's AdminComment (what only admins set), or the tag in its comment (which
    its user controls)."""

    tag: str
    admin_tag: str
    qos: frozenset[str] = frozenset()
    partitions: frozenset[str] = frozenset()
    accounts: frozenset[str] = frozenset()

    def kind(self, job: Job, admin_comment: str) -> str:
        """Why the job is exempt (one of EXEMPT_KINDS), "" when it is not."""
        if job.qos in self.qos:
            return "qos"
        if self.partitions and not self.partitions.isdisjoint(job.partition.split(",")):
            return "partition"
        if job.account in self.accounts:
            return "account"
        if self.admin_tag in admin_comment:
            return "admin_comment"
        if self.tag in (job.comment or ""):
            return "comment"
        return ""

    def note(self, kind: str, job: Job) -> str:
        """The plan's note for a job exempt by `kind`."""
        if kind == "qos":
            return f"exempt (QOS {job.qos} is in scope.exempt_qos)"
        if kind == "partition":
            listed = next(p for p in job.partition.split(",") if p in self.partitions)
            return f"exempt (partition {listed} is in scope.exempt_partitions)"
        if kind == "account":
            return f"exempt (account {job.account} is in scope.exempt_accounts)"
        if kind == "admin_comment":
            return f"exempt ({self.admin_tag} in its AdminComment, which only admins set)"
        return f"exempt ({self.tag} in comment)"


@dataclass(frozen=True)
class Node:
    """One compute node."""

    name: str
    gpus: int
    gpus_alloc: int = 0
    cpus: int = 1
    state: str = "IDLE"
    features: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    gpu_types: tuple[str, ...] = ()  # the GPU types of its Gres (gpu:a100:8 -> ("a100",)); () untyped

    @property
    def gpus_free(self) -> int:
        return max(0, self.gpus - self.gpus_alloc) if self.available else 0

    @functools.cached_property  # read for every node by several policy helpers each cycle
    def available(self) -> bool:
        """Schedulable: not down, drained, or failing."""
        words = set(self.state.upper().replace("+", " ").split())
        return not words & {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "INVAL", "FUTURE", "MAINT", "POWERED_DOWN", "NOT_RESPONDING"}


def may_use_gpus(job_types: tuple[str, ...], node_types: tuple[str, ...]) -> bool:
    """Whether a job asking for `job_types` may run on a node with `node_types` GPUs, as Slurm
    places it: a job that names no type runs on any node; a typed one only where its type is."""
    return not job_types or any(t in node_types for t in job_types)


def constraint_gpu_types(constraint: str, gpu_types: frozenset[str]) -> tuple[str, ...]:
    """The GPU types a feature constraint (`a100`, `a100|v100`, `v100&ib`, `[a100|v100]`) allows,
    given the cluster's GPU types; () when some alternative names no type (any type may serve).

    Counts (`a100*2`) and brackets are read as the plain features. Each `|` alternative
    restricts the job to the types it names; alternatives are joined.
    """
    if not constraint or not gpu_types:
        return ()
    allowed: list[str] = []
    for alternative in constraint.replace("[", "").replace("]", "").split("|"):
        named = [f.split("*", 1)[0].strip() for f in alternative.split("&")]
        named = [f for f in named if f in gpu_types]
        if not named:
            return ()
        allowed.extend(t for t in named if t not in allowed)
    return tuple(allowed)


def with_constraint_gpu_types(jobs: Sequence[Job], nodes: Iterable[Node]) -> tuple[Job, ...]:
    """The jobs, each job that asked for no GPU type but whose feature constraint names the
    nodes' GPU types given those types (a node's type is a feature on such sites)."""
    known = frozenset(t for node in nodes for t in node.gpu_types)
    if not known:
        return tuple(jobs)
    out = []
    for job in jobs:
        if not job.gpu_types and job.placement.features:
            types = constraint_gpu_types(job.placement.features, known)
            if types:
                job = job.with_changes(gpu_types=types)
        out.append(job)
    return tuple(out)


@dataclass(frozen=True)
class Switch:
    """A switch of the topology tree: either leaf (nodes) or upper (child switches)."""

    name: str
    nodes: tuple[str, ...] = ()
    children: tuple[str, ...] = ()


@dataclass(frozen=True)
class Topology:
    """The switch tree. Nodes not under any switch are their own isolated leaf."""

    switches: Mapping[str, Switch] = field(default_factory=dict)
    _leaf_of: Mapping[str, str] = field(default_factory=dict, repr=False)
    _parent_of: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_switches(cls, switches: Iterable[Switch], source: str = "topology") -> Topology:
        """Build and validate the tree (every node under one leaf, no cycles, known children)."""
        by_name: dict[str, Switch] = {}
        for switch in switches:
            if switch.name in by_name:
                raise InputError(f"switch {switch.name!r} defined twice", source=source)
            by_name[switch.name] = switch
        leaf_of: dict[str, str] = {}
        parent_of: dict[str, str] = {}
        for switch in by_name.values():
            for node in switch.nodes:
                if node in leaf_of:
                    raise InputError(
                        f"node {node!r} is under both {leaf_of[node]!r} and {switch.name!r}",
                        source=source,
                    )
                leaf_of[node] = switch.name
            for child in switch.children:
                if child not in by_name:
                    raise InputError(
                        f"switch {switch.name!r} lists unknown switch {child!r}", source=source
                    )
                if child in parent_of:
                    raise InputError(f"switch {child!r} has two parents", source=source)
                parent_of[child] = switch.name
        topology = cls(MappingProxyType(by_name), MappingProxyType(leaf_of), MappingProxyType(parent_of))
        for name in by_name:
            topology.switch_path(name)  # raises on cycles
        return topology

    def leaf_of(self, node: str) -> str:
        """The leaf switch of a node (the node's own name when it is not in the tree)."""
        return self._leaf_of.get(node, f"~{node}")

    def switch_path(self, switch: str) -> tuple[str, ...]:
        """The switch and its ancestors up to the root."""
        path = [switch]
        while path[-1] in self._parent_of:
            path.append(self._parent_of[path[-1]])
            if len(path) > len(self.switches) + 1:
                raise InputError(f"switch loop through {switch!r}", source="topology")
        return tuple(path)

    def node_path(self, node: str) -> tuple[str, ...]:
        """Leaf switch of a node and every switch above it."""
        leaf = self.leaf_of(node)
        return self.switch_path(leaf) if leaf in self.switches else (leaf,)

    def lowest_common_switch(self, nodes: Iterable[str]) -> str | None:
        """The lowest switch above all these nodes; None when they share none."""
        common: list[str] | None = None
        for node in nodes:
            path = self.node_path(node)
            if common is None:
                common = list(path)
            else:
                members = set(path)
                common = [s for s in common if s in members]
            if not common:
                return None
        return common[0] if common else None

    def leaves_spanned(self, nodes: Iterable[str]) -> int:
        """How many leaf switches these nodes sit under."""
        return len({self.leaf_of(n) for n in nodes})

    @property
    def leaves(self) -> tuple[str, ...]:
        return tuple(name for name, s in self.switches.items() if s.nodes)


@runtime_checkable
class AscendingValues(Protocol):
    """An ascending sequence of floats that counts its values up to a bound without a Python call
    per bisection step (a policy asks that of every active job, every cycle)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> float: ...

    def count_at_most(self, value: float) -> int:
        """How many values are <= value (`bisect.bisect_right`)."""
        ...


class AscendingTuple(tuple[float, ...]):
    """A sorted tuple of floats as an `AscendingValues` (what the engine's snapshot holds)."""

    __slots__ = ()

    def count_at_most(self, value: float) -> int:
        return bisect.bisect_right(self, value)


@dataclass(frozen=True)
class Snapshot:
    """Everything a policy may look at, at one instant. Built by a backend or the simulator."""

    time: float
    jobs: tuple[Job, ...]
    nodes: tuple[Node, ...]
    topology: Topology = field(default_factory=Topology)
    user_usage_gpu_s: Mapping[str, float] = field(default_factory=dict)  # decayed GPU-seconds
    user_shares: Mapping[str, float] = field(default_factory=dict)  # missing user: share 1
    # ascending GPU service of recently finished jobs: a sorted tuple from the engine (any other
    # sequence is sorted into one), an immutable block view (dike_slurm.sim.kernel.history) from the simulator
    completed_service_gpu_s: AscendingValues = AscendingTuple()
    # the site's own priority (partition and QOS tiers, weights); None when unknown
    site_priority: SlurmPriorityModel | None = None
    # expected GPU service learned from finished jobs (dike_slurm.domain.service_prior); None when not learned
    service_prior: ServicePrior | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.completed_service_gpu_s, AscendingValues):
            object.__setattr__(self, "completed_service_gpu_s", AscendingTuple(sorted(self.completed_service_gpu_s)))

    @property
    def pending(self) -> tuple[Job, ...]:
        return tuple(j for j in self.jobs if j.state is JobState.PENDING)

    @property
    def running(self) -> tuple[Job, ...]:
        return tuple(j for j in self.jobs if j.state is JobState.RUNNING)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)
