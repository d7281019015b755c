"""The preemption stage, one for every preemptive policy (dike, tiresias, srtf_oracle).

A pending job is *blocked* when it does not fit on nodes now: `num_nodes` nodes with
`gpus_per_node` free GPUs each (inside one leaf switch for a communication-heavy job), not when the
cluster's total of free GPUs is too small. For a blocked job the planner looks for running jobs it
outranks whose requeue makes it fit on particular nodes, picks the cheapest such nodes, and pins
the blocked job to them (ReqNodeList) so that what is freed goes to it and not to whatever Slurm
would start next. Pending jobs are walked in the order Slurm will try them; jobs that fit are
given their nodes first (they start without anybody being preempted).

With `protect` (the policies' `protect_freed_nodes`), the freed room goes to the job it was freed
for, as Kubernetes counts a preemptor's nominated node for it: the job is *protected* (the engine
writes it the top of its span, above every other job of its tier whatever Slurm's own factors
say), its pin and protection stay while it waits on those nodes, protected jobs are walked first
inside their tier, and only the first blocked jobs of the highest tier are preempted for (a job of
a higher partition or QOS tier would take the freed nodes first).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dike_slurm.domain.decisions import ClearPlacement, Requeue, SetPlacement
from dike_slurm.domain.model import Job, Placement, Snapshot, may_use_gpus
from dike_slurm.domain.slurm_priority import scheduling_tier


@dataclass(frozen=True)
class PreemptionLimits:
    """How much one cycle may plan."""

    max_requeues: int  # victims per cycle
    max_blocked: int = 8  # blocked jobs the planner tries to make room for per cycle
    max_scan: int = 500  # pending jobs walked (as Slurm's bf_max_job_test bounds its passes)


@dataclass(frozen=True)
class PreemptionPlan:
    """The requeues (grouped by the job they make room for), the pins of the blocked jobs and the
    jobs whose freed room is protected (Decisions.protected)."""

    requeues: tuple[Requeue, ...] = ()
    pins: tuple[SetPlacement, ...] = ()
    protected: tuple[int, ...] = ()

    @property
    def pinned(self) -> frozenset[int]:
        return frozenset(p.job_id for p in self.pins)


@dataclass(frozen=True)
class PreemptionRule:
    """A policy's part of the preemption stage (`stages.Victims`): who may be cut now, what that
    loses, which jobs must fit under one leaf, the limits, the reason a victim reads, and whether
    the freed room is protected for its job (`plan_preemptions` says what each means)."""

    may_preempt: Callable[[Job], bool]
    loss: Callable[[Job], float]
    one_leaf: Callable[[Job], bool]
    limits: PreemptionLimits
    reason: Callable[[Job, Job], str]
    protect: bool
    # gains(blocked, victim): requeueing the victim for the blocked job promises a gain (None: any
    # job it outranks may be cut)
    gains: Callable[[Job, Job], bool] | None = None


def preempt(snapshot: Snapshot, ranked_pending: Sequence[Job], running: Sequence[Job],
            measure: Mapping[int, float], rule: PreemptionRule) -> PreemptionPlan:
    """The preemption stage: a blocked job preempts running jobs whose `measure` is higher than
    its own (a worse level; for the SRTF oracle, more remaining GPU time), as the rule allows."""
    gains = rule.gains
    if gains is None:
        def outranks(blocked: Job, victim: Job) -> bool:
            return measure[blocked.job_id] < measure[victim.job_id]
    else:
        def outranks(blocked: Job, victim: Job) -> bool:
            return measure[blocked.job_id] < measure[victim.job_id] and gains(blocked, victim)
    return plan_preemptions(
        snapshot,
        ranked_pending,
        running,
        outranks=outranks,
        may_preempt=rule.may_preempt,
        loss=rule.loss,
        one_leaf=rule.one_leaf,
        limits=rule.limits,
        reason=rule.reason,
        protect=rule.protect,
    )


def with_pins(
    placements: list[SetPlacement | ClearPlacement], plan: PreemptionPlan
) -> list[SetPlacement | ClearPlacement]:
    """The placements with the plan's pins in place of the pinned jobs' own."""
    if not plan.pins:
        return placements
    pinned = plan.pinned
    return [p for p in placements if p.job_id not in pinned] + list(plan.pins)


class NodeLedger:
    """Free GPUs per node and the running jobs on each, as the plan goes along."""

    def __init__(self, snapshot: Snapshot, running: Sequence[Job]) -> None:
        leaf_of = snapshot.topology.leaf_of
        self.names = [n.name for n in snapshot.nodes]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.free = [n.gpus_free for n in snapshot.nodes]
        self.gpus = [n.gpus if n.available else 0 for n in snapshot.nodes]
        self.partitions = [frozenset(n.partitions) for n in snapshot.nodes]
        self.gpu_types = [n.gpu_types for n in snapshot.nodes]
        self.leaf = [leaf_of(n.name) for n in snapshot.nodes]
        self.jobs_on: list[list[Job]] = [[] for _ in snapshot.nodes]
        for job in running:
            for name in job.nodes:
                position = self.index.get(name)
                if position is not None:
                    self.jobs_on[position].append(job)
        nodes_per_leaf: dict[str, int] = {}
        for leaf in self.leaf:
            nodes_per_leaf[leaf] = nodes_per_leaf.get(leaf, 0) + 1
        self.largest_leaf = max(nodes_per_leaf.values(), default=0)  # nodes under the largest leaf
        # usable's answers: what they depend on never changes while the plan goes along
        self._usable: dict[tuple, tuple[int, ...]] = {}

    def usable(self, job: Job, honour_exclusions: bool = True) -> tuple[int, ...]:
        """Nodes the job may run on at all (partition, size, GPU types, its ExcNodeList and ReqNodeList).

        A typed job's nodes are those of its types only: the planner never frees, nor counts as
        room, GPUs of another type, and a node hold holds only nodes of a type the job can use.

        A job already pinned (an earlier cycle's plan, e.g. waiting out a grace signal) is planned
        on its pinned nodes only, so the plan carries on; if it no longer can, the pin is not
        asserted again and the engine clears it. `honour_exclusions=False` ignores the ExcNodeList,
        which may be one the engine wrote itself in an earlier cycle."""
        placement = job.placement
        asked = (job.gpus_per_node, job.partition, job.gpu_types,
                 placement.exclude_nodes if honour_exclusions else (), placement.require_nodes)
        known = self._usable.get(asked)
        if known is None:
            known = self._usable[asked] = self._usable_nodes(*asked)
        return known

    def _usable_nodes(self, per_node: int, partition: str, types: tuple[str, ...],
                      exclude: Sequence[str], require: Sequence[str]) -> tuple[int, ...]:
        excluded, required = set(exclude), set(require)
        return tuple(
            i for i, total in enumerate(self.gpus)
            if total >= per_node
            and (not partition or not self.partitions[i] or partition in self.partitions[i])
            and self.names[i] not in excluded
            and (not required or self.names[i] in required)
            and (not types or may_use_gpus(types, self.gpu_types[i]))
        )

    def release(self, victim: Job) -> None:
        per_node = victim.gpus_per_node
        for name in victim.nodes:
            position = self.index.get(name)
            if position is not None:
                self.free[position] += per_node

    def allocate(self, nodes: Sequence[int], per_node: int) -> None:
        for node in nodes:
            self.free[node] -= per_node


class VictimOrder:
    """Each node's preemptible running jobs, cheapest loss first (then job id), sorted once per
    plan: the loss of a victim does not change while the plan goes along."""

    def __init__(self, nodes: NodeLedger, preemptible: frozenset[int], loss: Callable[[Job], float]) -> None:
        self.nodes, self.preemptible, self.loss = nodes, preemptible, loss
        self._by_node: dict[int, list[tuple[float, Job]]] = {}

    def on(self, node: int) -> list[tuple[float, Job]]:
        """(loss, victim) of the node's preemptible jobs, cheapest first."""
        known = self._by_node.get(node)
        if known is None:
            loss, preemptible = self.loss, self.preemptible
            known = [(loss(v), v) for v in self.nodes.jobs_on[node] if v.job_id in preemptible]
            known.sort(key=lambda entry: (entry[0], entry[1].job_id))
            self._by_node[node] = known
        return known


def can_start(job: Job, now: float) -> bool:
    """Whether Slurm may start the pending job now: not before its eligible time (a requeued job
    is held for cred_expire + 1 s, reason BeginTime; a `--begin` in the future likewise)."""
    return job.eligible_time is None or job.eligible_time <= now


def pick_nodes(candidates: list[tuple[float, int]], count: int, nodes: NodeLedger, one_leaf: bool) -> list[int] | None:
    """The `count` cheapest (cost, node) candidates, all under one leaf when asked."""
    if len(candidates) < count:
        return None
    if not one_leaf:
        return [node for _, node in sorted(candidates)[:count]]
    by_leaf: dict[str, list[tuple[float, int]]] = {}
    for cost, node in candidates:
        by_leaf.setdefault(nodes.leaf[node], []).append((cost, node))
    best: tuple[float, list[int]] | None = None
    for members in by_leaf.values():
        if len(members) < count:
            continue
        members.sort()
        total = sum(cost for cost, _ in members[:count])
        if best is None or total < best[0]:
            best = (total, [node for _, node in members[:count]])
    return best[1] if best is not None else None


def _in_slurms_order(snapshot: Snapshot, walk: list[Job]) -> dict[int, tuple[int, float]]:
    """Sort the walk as Slurm tries the jobs: partition and QOS tiers first; inside a tier the
    protected jobs (the top value) before the policy's order (a stable sort keeps it). Each job's tier."""
    model = snapshot.site_priority
    tier_of = {job.job_id: scheduling_tier(model, job.partition, job.qos) for job in walk}
    walk.sort(key=lambda job: (-tier_of[job.job_id][0], -tier_of[job.job_id][1], not job.pinned_for_preemption))
    return tier_of


def _pin(job: Job, names: tuple[str, ...], reason: str) -> SetPlacement:
    """The blocked job held to the nodes freed (or being freed) for it (ReqNodeList)."""
    return SetPlacement(job.job_id, Placement(require_nodes=names), reason)


def _requeue_for(job: Job, victims: list[Job], picked: list[int], nodes: NodeLedger, taken: set[int],
                 reason: Callable[[Job, Job], str]) -> list[Requeue]:
    """Requeue the victims for the blocked job: their GPUs freed, the job's taken on `picked`."""
    for victim in victims:
        taken.add(victim.job_id)
        nodes.release(victim)
    nodes.allocate(picked, job.gpus_per_node)
    return [Requeue(victim.job_id, reason(job, victim), for_job=job.job_id) for victim in victims]


def _cheapest_room(job: Job, usable: Sequence[int], nodes: NodeLedger, order: VictimOrder, taken: set[int],
                   outranks: Callable[[Job, Job], bool]) -> tuple[list[tuple[float, int]], dict[int, list[Job]]]:
    """Per usable node: the cheapest victims (that this job outranks, not taken yet) whose requeue
    frees enough GPUs for it there, and what they lose together; a node free enough already costs 0."""
    per_node = job.gpus_per_node
    options: list[tuple[float, int]] = []
    victims_on: dict[int, list[Job]] = {}
    for node in usable:
        missing = per_node - nodes.free[node]
        if missing <= 0:
            options.append((0.0, node))
            victims_on[node] = []
            continue
        chosen: list[Job] = []
        cost = 0.0
        for victim_loss, victim in order.on(node):
            if victim.job_id in taken or not outranks(job, victim):
                continue
            chosen.append(victim)
            cost += victim_loss
            missing -= victim.gpus_per_node
            if missing <= 0:
                break
        if missing <= 0:
            options.append((cost, node))
            victims_on[node] = chosen
    return options, victims_on


def plan_preemptions(
    snapshot: Snapshot,
    ranked_pending: Sequence[Job],
    running: Sequence[Job],
    *,
    outranks: Callable[[Job, Job], bool],
    may_preempt: Callable[[Job], bool],
    loss: Callable[[Job], float],
    one_leaf: Callable[[Job], bool],
    limits: PreemptionLimits,
    reason: Callable[[Job, Job], str],
    protect: bool = False,
) -> PreemptionPlan:
    """Requeues that let blocked jobs start, cheapest loss first, within `limits`.

    `outranks(blocked, victim)`: the policy would rather run the blocked job. `may_preempt(victim)`:
    the site and the policy's anti-thrash rules allow it now. `loss(victim)`: what requeueing it now
    costs (GPU-seconds); nodes are chosen to lose the least. `one_leaf(job)`: the job must fit
    under one leaf switch to count as fitting. `protect`: the freed room goes to the job it was
    freed for (the module's docstring)."""
    walk = list(ranked_pending[: limits.max_scan])
    waiting = protect and any(job.pinned_for_preemption for job in walk)
    candidates = [v for v in running if v.nodes and may_preempt(v)] if limits.max_requeues > 0 else []
    if not walk or (not candidates and not waiting):
        return PreemptionPlan()
    tier_of = _in_slurms_order(snapshot, walk) if protect else {}
    nodes = NodeLedger(snapshot, running)
    order = VictimOrder(nodes, frozenset(v.job_id for v in candidates), loss)
    taken: set[int] = set()
    requeues: list[Requeue] = []
    pins: list[SetPlacement] = []
    protected: list[int] = []
    blocked_tried = 0
    first_blocked_tier = None  # protect: no job of a lower tier is preempted for
    for job in walk:
        planning = blocked_tried < limits.max_blocked and len(requeues) < limits.max_requeues
        if not planning:
            if not waiting:
                break
            if not job.pinned_for_preemption:
                continue  # past the planning: only the protected jobs' pins are still looked at
        if not can_start(job, snapshot.time):
            continue  # Slurm holds it (e.g. its begin time after a requeue): nobody is preempted for it
        per_node, count = job.gpus_per_node, max(job.num_nodes, 1)
        usable = nodes.usable(job)
        single = one_leaf(job) and count <= nodes.largest_leaf
        free_now = [(0.0, i) for i in usable if nodes.free[i] >= per_node]
        fitting = pick_nodes(free_now, count, nodes, single)
        if fitting is not None:
            nodes.allocate(fitting, per_node)  # it starts as it is: room taken before lower jobs
            if protect and job.pinned_for_preemption:  # freed for it: kept until it starts
                names = tuple(sorted(job.placement.require_nodes))
                pins.append(_pin(job, names, f"keeping {','.join(names)}, freed by a preemption, until it starts"))
                protected.append(job.job_id)
            continue
        if protect:
            tier = tier_of[job.job_id]
            if first_blocked_tier is None:
                first_blocked_tier = tier
            elif tier < first_blocked_tier:
                continue  # a blocked job of a higher tier would take what is freed
        if not planning:
            continue
        required = job.placement.require_nodes
        if required and len(required) != count:
            continue  # a user's `-w` that a pin of exactly `count` nodes would change: left alone
        blocked_tried += 1
        options, victims_on = _cheapest_room(job, usable, nodes, order, taken, outranks)
        picked = pick_nodes(options, count, nodes, single)
        if picked is None:
            continue
        victims = {victim.job_id: victim for node in picked for victim in victims_on[node]}
        if not victims or len(requeues) + len(victims) > limits.max_requeues:
            continue
        requeues += _requeue_for(job, list(victims.values()), picked, nodes, taken, reason)
        names = tuple(sorted(nodes.names[n] for n in picked))
        pins.append(_pin(job, names, f"preempting {len(victims)} job(s) to start on {','.join(names)}"))
        if protect:
            protected.append(job.job_id)
    return PreemptionPlan(tuple(requeues), tuple(pins), tuple(protected))
