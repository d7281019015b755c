"""Slurm's own job priority (priority/multifactor), as slurmctld computes it, and the tiers it keeps.

Formula (Slurm's priority_multifactor.c, `_get_priority_internal` and `set_priority_factors`;
the multifactor documentation gives the same):

    priority = PriorityWeightAge * age + PriorityWeightFairshare * fairshare
             + PriorityWeightJobSize * job_size + PriorityWeightPartition * partition
             + PriorityWeightQOS * qos + sum(PriorityWeightTRES[t] * tres[t])
             + SiteFactor - Nice,   truncated to an integer, at least 1

with every factor in [0, 1]:
- age = min(time eligible / PriorityMaxAge, 1);
- job_size = (nodes / cluster nodes + CPUs / cluster CPUs) / 2 (1 - each, PriorityFavorSmall);
- partition = the partition's PriorityJobFactor / the largest PriorityJobFactor;
- qos = the QOS priority / the largest QOS priority;
- tres[t] = the job's count of t / the partition's count of t;
- fairshare: Fair Tree (the default since 19.05) or the classic 2^(-usage/shares) with
  PriorityFlags=NO_FAIR_TREE, see `fairshare_factors`.
An explicit `scontrol update Priority=` pins the value (every factor stops). Slurm's schedulers
try jobs by partition PriorityTier (higher first), then priority, then submit time, then job id.

Pure: no I/O. The replay orders its queue with it; the engine and `doctor` size Dike's
SiteFactor span against the site's tiers with `tier_gap` and `effective_span`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dike_slurm.errors import InputError
from dike_slurm.parsing.durations import parse_duration
from dike_slurm.parsing.slurm_options import DEFAULT_DEPTH, option_int, scheduler_depth, scheduler_parameters

DEFAULT_MAX_AGE_S = 7 * 86400  # PriorityMaxAge=7-0
DEFAULT_HALF_LIFE_S = 7 * 86400  # PriorityDecayHalfLife=7-0
PRIORITY_MAX = 0xFFFFFFFF  # Slurm keeps a job's priority in 32 bits
# slurm.conf's spelling of the options read (the readers see them lower-cased)
OPTION_NAMES = {name.lower(): name for name in (
    "PriorityWeightAge", "PriorityWeightFairshare", "PriorityWeightJobSize", "PriorityWeightPartition",
    "PriorityWeightQOS", "PriorityWeightAssoc")}


@dataclass(frozen=True)
class PriorityWeights:
    """The site's PriorityWeight* values and the settings the factors depend on."""

    age: float = 0.0
    fairshare: float = 0.0
    job_size: float = 0.0
    partition: float = 0.0
    qos: float = 0.0
    assoc: float = 0.0
    tres: Mapping[str, float] = field(default_factory=dict)  # lower-case TRES name ("gres/gpu") -> weight
    max_age_s: int = DEFAULT_MAX_AGE_S
    favor_small: bool = False
    fair_tree: bool = True
    decay_half_life_s: float = DEFAULT_HALF_LIFE_S
    multifactor: bool = True  # PriorityType=priority/multifactor (basic: submit order, no factor)

    @property
    def others_total(self) -> float:
        """The most that every factor but QOS can add to a job (all factors at 1)."""
        return self.age + self.fairshare + self.job_size + self.partition + self.assoc + sum(self.tres.values())

    @property
    def total(self) -> float:
        return self.others_total + self.qos


@dataclass(frozen=True)
class GpuBilling:
    """What a site's TRESBillingWeights charges per GPU-second of each GPU type.

    Slurm bills a job the sum of its TRES times their weights, and a typed GPU is two TRES
    (gres/gpu and gres/gpu:TYPE): a GPU of type t weighs `GRES/gpu` + `GRES/gpu:t`. A type that
    neither names weighs 1, as does every GPU where the site sets no GPU weight: equal where unset.
    CPU and memory weights are not GPU service and are left out.
    """

    untyped: float | None = None  # GRES/gpu=W
    typed: Mapping[str, float] = field(default_factory=dict)  # GRES/gpu:TYPE=W, the type as Slurm spells it

    def weight(self, gpu_types: Iterable[str]) -> float:
        """The weight of a GPU on a node of these types (the mean when a node has several)."""
        types = tuple(gpu_types)
        if not types:
            return self.untyped if self.untyped is not None else 1.0
        total = 0.0
        for gpu_type in types:
            typed = self.typed.get(gpu_type)
            if typed is None and self.untyped is None:
                total += 1.0
            else:
                total += (self.untyped or 0.0) + (typed or 0.0)
        return total / len(types)


def parse_billing_weights(text: str, source: str, line: int | None = None) -> GpuBilling | None:
    """`TRESBillingWeights=CPU=1.0,Mem=0.25G,GRES/gpu=2.0,GRES/gpu:a100=4.0`: its GPU weights
    (None when the text is empty). A weight that is not a number is an InputError."""
    untyped: float | None = None
    typed: dict[str, float] = {}
    seen = False
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        seen = True
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InputError(f"TRESBillingWeights item {item!r} is not NAME=WEIGHT", source=source, line=line)
        kind, _, gpu_type = name.partition(":")
        if kind.lower() != "gres/gpu":
            continue
        try:
            weight = float(value)
        except ValueError:
            raise InputError(f"TRESBillingWeights {name}={value!r} is not a number", source=source, line=line) from None
        if gpu_type:
            typed[gpu_type] = weight
        else:
            untyped = weight
    return GpuBilling(untyped, typed) if seen else None


@dataclass(frozen=True)
class PartitionPriority:
    job_factor: int = 1  # PriorityJobFactor (Priority= sets it and the tier)
    tier: int = 1  # PriorityTier
    billing: GpuBilling | None = None  # the partition's TRESBillingWeights; None: the cluster's


@dataclass(frozen=True)
class PriorityInputs:
    """What one pending job brings to the formula."""

    partition: str
    qos: str
    nodes: int
    cpus: int
    gpus: int
    eligible_since: float  # Slurm's accrue time: when the job became eligible
    fairshare: float  # its association's fair-share factor, [0, 1]
    site_factor: int = 0
    nice: int = 0


@dataclass(frozen=True)
class SlurmPriorityModel:
    """Slurm's priority for pending jobs of one cluster: weights, QOS and partition tables, sizes."""

    weights: PriorityWeights
    qos_priority: Mapping[str, int]
    partitions: Mapping[str, PartitionPriority]
    node_count: int
    cluster_cpus: int
    partition_tres: Mapping[str, Mapping[str, int]]  # partition -> {"cpu", "node", "gres/gpu"} totals
    source: str = ""  # where the weights and QOS priorities came from, for reports
    # pending jobs per partition Slurm's scheduler looks at (slurm_options.scheduler_depth of SchedulerParameters)
    scheduler_depth: int = DEFAULT_DEPTH
    billing: GpuBilling | None = None  # the cluster's TRESBillingWeights (a partition's own wins)

    def billing_of(self, partition: str) -> GpuBilling | None:
        """The TRESBillingWeights that charge a job of this partition (None: the site sets none)."""
        entry = self.partitions.get(partition)
        return entry.billing if entry is not None and entry.billing is not None else self.billing

    def gpu_weight(self, partition: str, gpu_types: Iterable[str]) -> float:
        """What one GPU-second on a node of these types is charged in this partition (1 when the
        site weighs no GPU)."""
        billing = self.billing_of(partition)
        return billing.weight(gpu_types) if billing is not None else 1.0

    def tier(self, partition: str) -> int:
        entry = self.partitions.get(partition)
        return entry.tier if entry is not None else 1

    def qos_factor(self, qos: str) -> float:
        top = max(self.qos_priority.values(), default=0)
        return self.qos_priority.get(qos, 0) / top if top > 0 else 0.0

    def partition_factor(self, partition: str) -> float:
        top = max((p.job_factor for p in self.partitions.values()), default=0)
        entry = self.partitions.get(partition)
        return entry.job_factor / top if entry is not None and top > 0 else 0.0

    def job_size_factor(self, nodes: int, cpus: int) -> float:
        node_count, cluster_cpus = max(self.node_count, 1), max(self.cluster_cpus, 1)
        if self.weights.favor_small:
            size = (node_count - nodes) / node_count
            if cpus:
                size = (size + (cluster_cpus - cpus) / cluster_cpus) / 2
        else:
            size = nodes / node_count
            if cpus:
                size = (size + cpus / cluster_cpus) / 2
        return min(max(size, 0.0), 1.0)

    def request_terms(self, partition: str, qos: str, nodes: int, cpus: int, gpus: int) -> tuple[float, ...]:
        """The weighted factors that depend only on what a job asks for (job size, partition, QOS,
        each TRES), in the formula's order: the same for every job of this request, at any time."""
        w = self.weights
        terms: list[float] = []
        if w.job_size:
            terms.append(w.job_size * self.job_size_factor(nodes, cpus))
        if w.partition:
            terms.append(w.partition * self.partition_factor(partition))
        if w.qos:
            terms.append(w.qos * self.qos_factor(qos))
        if w.tres:
            have = self.partition_tres.get(partition, {})
            counts = {"cpu": cpus, "node": nodes, "gres/gpu": gpus}
            for name, weight in w.tres.items():
                if have.get(name):
                    terms.append(weight * counts.get(name, 0) / have[name])
        return tuple(terms)

    def sum_with(self, request_terms: tuple[float, ...], eligible_since: float, fairshare: float, now: float) -> float:
        """Every weighted factor of a pending job at `now`, without SiteFactor and Nice, from its
        `request_terms`: age, fair share, then those terms, added in that order."""
        w = self.weights
        total = 0.0
        if w.age:
            waited = now - eligible_since if now > eligible_since else 0.0
            total += w.age * (waited / w.max_age_s if waited < w.max_age_s else 1.0)
        if w.fairshare:
            total += w.fairshare * fairshare
        for term in request_terms:
            total += term
        return total

    def factors_sum(self, job: PriorityInputs, now: float) -> float:
        """Every weighted factor of a pending job at `now`, without SiteFactor and Nice."""
        terms = self.request_terms(job.partition, job.qos, job.nodes, job.cpus, job.gpus)
        return self.sum_with(terms, job.eligible_since, job.fairshare, now)

    @staticmethod
    def bounded(value: float) -> int:
        """A priority as Slurm stores it: an integer in [1, PRIORITY_MAX]."""
        if value < 1:
            return 1
        return PRIORITY_MAX if value > PRIORITY_MAX else int(value)

    def priority(self, job: PriorityInputs, now: float) -> int:
        """The priority Slurm gives the job at `now` (an integer, at least 1)."""
        return self.bounded(self.factors_sum(job, now) + job.site_factor - job.nice)

    def qos_tiers(self) -> list[float]:
        """The distinct weighted QOS contributions, lowest first (one per tier)."""
        if not self.weights.qos:
            return []
        return sorted({self.weights.qos * self.qos_factor(name) for name in self.qos_priority} | {0.0})


def tier_gap(model: SlurmPriorityModel) -> float | None:
    """The smallest step between two QOS tiers, None when the site has one tier."""
    tiers = model.qos_tiers()
    gaps = [b - a for a, b in zip(tiers, tiers[1:]) if b > a]
    return min(gaps) if gaps else None


def protection_reserve(model: SlurmPriorityModel | None) -> int:
    """The top of Dike's span kept for the jobs a preemption freed nodes for.

    Every other job is written at most `span - reserve` and a protected job `span`, so a protected
    job's priority exceeds that of every job of its tier, whatever their age, fair share, size,
    partition and TRES factors (at most `others_total` together). 0 without a model or under
    priority/basic (nothing to outweigh)."""
    if model is None or not model.weights.multifactor:
        return 0
    return int(math.ceil(model.weights.others_total)) + 1


def scheduling_tier(model: SlurmPriorityModel | None, partition: str, qos: str) -> tuple[int, float]:
    """What Slurm puts a job ahead by before Dike's value counts: its partition's PriorityTier,
    then its weighted QOS priority (a strict tier in `tiers` mode). Higher first."""
    if model is None:
        return (1, 0.0)
    return (model.tier(partition), model.weights.qos * model.qos_factor(qos) if model.weights.multifactor else 0.0)


PRIORITY_MODES = ("tiers", "blend", "over")


def effective_span(mode: str, configured_span: int, model: SlurmPriorityModel | None) -> int:
    """The largest SiteFactor the engine writes under `engine.priority_mode`.

    - over: `configured_span`, whatever the site's weights (Dike orders the whole queue, above
      every QOS tier; the behaviour before the modes existed).
    - tiers (default): at most what keeps every QOS tier above the one below it: the smallest
      tier step less every other factor at its most. Without QOS tiers, `configured_span`.
    - blend: the most the site's own factors can add together (a QOS weight counts only where a
      QOS has a priority), so Dike weighs as much as every Slurm factor.
    Never below 1; without a model (weights unknown) every mode is `configured_span`.
    """
    if mode not in PRIORITY_MODES:
        raise ValueError(f"unknown priority mode {mode!r}")
    if model is None or mode == "over":
        return configured_span
    if mode == "blend":
        reachable = model.weights.others_total + max(model.qos_tiers(), default=0.0)
        return max(1, min(configured_span, int(reachable) or configured_span))
    gap = tier_gap(model)
    if gap is None:
        return configured_span
    room = int(math.floor(gap - model.weights.others_total)) - 1
    return max(1, min(configured_span, room))


def fairshare_factors(usage: Mapping[tuple[str, str], float], fair_tree: bool,
                      shares: Mapping[str, float] | None = None) -> dict[tuple[str, str], float]:
    """Each (account, user) association's fair-share factor from its decayed usage.

    A two-level tree (accounts under root, users under accounts), every account and user with one
    share unless `shares` (per user) says otherwise; Slurm's own tree is whatever sacctmgr holds.
    - Fair Tree: siblings ordered by level fair share S/U (share over usage, both as fractions of
      the siblings'), depth first; users ranked in that order, tied users sharing a rank; factor =
      rank / users, the first 1.0.
    - classic (NO_FAIR_TREE): 2^(-U/S) with U the user's usage over all usage and S its share
      over all shares (a flat tree: Slurm's effective usage of a lone account is its own).
    """
    associations = list(usage)
    if not associations:
        return {}
    shares = shares or {}
    share = {a: float(shares.get(a[1], 1.0)) for a in associations}
    total_usage = sum(usage.values())
    if not fair_tree:
        total_share = sum(share.values()) or 1.0
        return {
            a: (2.0 ** (-(usage[a] / total_usage if total_usage > 0 else 0.0) / (share[a] / total_share))
                if share[a] > 0 else 0.0)
            for a in associations
        }

    def level_fs(own_share: float, sibling_shares: float, own_usage: float, sibling_usage: float) -> float:
        s = own_share / sibling_shares if sibling_shares > 0 else 0.0
        u = own_usage / sibling_usage if sibling_usage > 0 else 0.0
        if s == 0:
            return 0.0
        return math.inf if u == 0 else s / u

    accounts: dict[str, list[tuple[str, str]]] = {}
    for a in associations:
        accounts.setdefault(a[0], []).append(a)
    account_usage = {name: sum(usage[a] for a in members) for name, members in accounts.items()}
    all_usage = sum(account_usage.values())
    account_rank = {name: level_fs(1.0, len(accounts), account_usage[name], all_usage) for name in accounts}
    ordered: list[tuple[tuple[float, float], tuple[str, str]]] = []
    for name in sorted(accounts, key=lambda n: -account_rank[n]):
        members = accounts[name]
        member_shares = sum(share[a] for a in members)
        for a in members:
            ordered.append(((account_rank[name], level_fs(share[a], member_shares, usage[a], account_usage[name])), a))
    ordered.sort(key=lambda item: (-item[0][0], -item[0][1]))
    count = len(ordered)
    factors: dict[tuple[str, str], float] = {}
    rank, previous = count, None
    for position, (key, association) in enumerate(ordered):
        if key != previous:
            rank, previous = count - position, key
        factors[association] = rank / count
    return factors


# ---------------------------------------------------------------- reading the site's settings

def _number(value: str, key: str, source: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise InputError(f"{key}={value!r} is not a number", source=source) from None


def parse_tres_weights(text: str, source: str) -> dict[str, float]:
    """`PriorityWeightTRES=CPU=1000,Mem=2000,GRES/gpu=3000` -> {"cpu": 1000, "mem": 2000, "gres/gpu": 3000}."""
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.rpartition("=")
        if not sep or not name:
            raise InputError(f"PriorityWeightTRES item {item!r} is not NAME=WEIGHT", source=source)
        weights[name.lower()] = _number(value, f"PriorityWeightTRES {name}", source)
    return weights


def weights_from_options(options: Mapping[str, str], source: str) -> PriorityWeights:
    """The weights from slurm.conf's global options (keys lower-case), or from `scontrol show config`
    (the same names). Absent keys take Slurm's defaults: every weight 0, PriorityMaxAge 7 days,
    Fair Tree. A missing PriorityType is taken as priority/multifactor (Slurm's default since 23.11)."""
    def get(key: str, default: float = 0.0) -> float:
        value = options.get(key)
        return default if value in (None, "") else _number(str(value), OPTION_NAMES.get(key, key), source)

    ptype = options.get("prioritytype", "priority/multifactor").strip().lower()
    flags = {f.strip().upper() for f in options.get("priorityflags", "").split(",") if f.strip()}
    max_age = options.get("prioritymaxage")
    half_life = options.get("prioritydecayhalflife")
    try:
        max_age_s = parse_duration(max_age) if max_age else DEFAULT_MAX_AGE_S
        half_life_s = parse_duration(half_life) if half_life else DEFAULT_HALF_LIFE_S
    except InputError as exc:
        raise InputError(f"PriorityMaxAge/PriorityDecayHalfLife: {exc}", source=source) from None
    return PriorityWeights(
        age=get("priorityweightage"), fairshare=get("priorityweightfairshare"),
        job_size=get("priorityweightjobsize"), partition=get("priorityweightpartition"),
        qos=get("priorityweightqos"), assoc=get("priorityweightassoc"),
        tres=parse_tres_weights(options.get("priorityweighttres", ""), source),
        max_age_s=max(int(max_age_s or DEFAULT_MAX_AGE_S), 1),
        favor_small=options.get("priorityfavorsmall", "no").strip().lower() in ("yes", "1", "true"),
        fair_tree="NO_FAIR_TREE" not in flags,
        decay_half_life_s=float(half_life_s or DEFAULT_HALF_LIFE_S),
        multifactor=ptype != "priority/basic",
    )


def parse_qos_dump(text: str, source: str) -> dict[str, int]:
    """`sacctmgr show qos -P` (any columns, header row, `|`-separated): QOS name -> Priority."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise InputError("empty QOS dump (expected `sacctmgr show qos -P` output)", source=source)
    header = [h.strip().lower() for h in lines[0].split("|")]
    if "name" not in header or "priority" not in header:
        raise InputError("the QOS dump's header needs Name and Priority columns", source=source, line=1)
    name_at, priority_at = header.index("name"), header.index("priority")
    priorities: dict[str, int] = {}
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("|")
        if len(fields) <= max(name_at, priority_at):
            raise InputError(f"{len(fields)} fields, the header has {len(header)}", source=source, line=number)
        name, value = fields[name_at].strip(), fields[priority_at].strip() or "0"
        try:
            priorities[name] = int(value)
        except ValueError:
            raise InputError(f"QOS {name!r}: Priority {value!r} is not an integer", source=source, line=number) from None
    return priorities


def partition_priorities(fields: Mapping[str, str], source: str, line: int | None = None) -> PartitionPriority:
    """A PartitionName line's PriorityJobFactor and PriorityTier (`Priority=` sets both; default 1)."""
    def value(key: str) -> int | None:
        text = fields.get(key)
        return None if text is None else option_int(text, key, source, line)

    both = value("priority")
    job_factor, tier = value("priorityjobfactor"), value("prioritytier")
    return PartitionPriority(
        job_factor=job_factor if job_factor is not None else (both if both is not None else 1),
        tier=tier if tier is not None else (both if both is not None else 1),
        billing=parse_billing_weights(fields.get("tresbillingweights", ""), source, line),
    )


def build_model(options: Mapping[str, str], partitions: Iterable[tuple[str, PartitionPriority, Mapping[str, int]]],
                node_count: int, cluster_cpus: int, qos_priority: Mapping[str, int] | None,
                source: str) -> SlurmPriorityModel:
    """A model from global options, (partition, priorities, TRES totals) and the QOS table."""
    try:
        depth = scheduler_depth(scheduler_parameters(options.get("schedulerparameters", "")))
    except InputError as exc:
        raise InputError(str(exc), source=source) from None
    parts, tres = {}, {}
    for name, priority, totals in partitions:
        parts[name] = priority
        tres[name] = dict(totals)
    return SlurmPriorityModel(
        weights=weights_from_options(options, source), qos_priority=dict(qos_priority or {}),
        partitions=parts, node_count=node_count, cluster_cpus=cluster_cpus, partition_tres=tres, source=source,
        scheduler_depth=depth, billing=parse_billing_weights(options.get("tresbillingweights", ""), source),
    )


# The weights the bundled sample, the corpus and `render slurm-conf` assume where a site's own are
# unknown (an ASSUMPTION, not a measurement): fair share dominant, age and job size a tenth of it,
# GPUs as much as age; ages saturate after 7 days. The lab has the same weights but its own
# PriorityMaxAge (30 min) and QOS tiers (scripts/slurm-lab).
TYPICAL_WEIGHTS = (
    "PriorityType=priority/multifactor",
    "PriorityWeightFairshare=10000",
    "PriorityWeightAge=1000",
    "PriorityWeightJobSize=1000",
    "PriorityWeightTRES=GRES/gpu=1000",
    "PriorityMaxAge=7-0",
    "PriorityDecayHalfLife=7-0",
)
