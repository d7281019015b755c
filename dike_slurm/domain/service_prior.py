"""The service prior: a job's expected GPU service, learned from the site's own finished jobs.

As Helios's QSSF (Hu et al., SC'21) does, a job is expected to run as long as the finished jobs
of the same user, job name and GPU count did; with too few of those, coarser groups answer, the
user's own before anyone else's, down to every finished job. Nothing a user claims (time limits,
comments) enters it.

The statistic is each group's median run time (a GPU-hour figure is that times the job's GPUs),
so that one odd job moves nothing. A group of a few jobs is noisy, so the estimate is shrunk
toward the coarser groups' (in log space, each group weighing n / (n + shrink_jobs) against the
groups above it): on the corpus this ranks jobs closer to their true service than asking the
finest group with enough jobs (Spearman 0.59 against 0.42 on philly-b436b2-s3, 0.48 against 0.38
on philly-b436b2-s4, 0.44 against 0.41 on the sample; docs/results.md).

The prior's *power* says how much its history knows: over the finished jobs of the window (none
of them after now), the correlation of each job's log run time with the mean of the other jobs of
its (user, name, GPUs) group, and the same with its GPU count's group, whichever is higher, less
twice its standard error (1 / sqrt(jobs)). History that predicts nothing (names and users shuffled
across jobs, run times unrelated to GPU counts) gives about 0; the corpus' traces 0.16-0.83; their
shuffled twins keep what GPU counts know (docs/results.md). It is kept from exact integer moments
of each group, so that learning at once and job by job give the same figure.

`PriorLearner` keeps the groups as jobs finish and leave the window (the replay adds one job at a
time); `ServicePrior` is what a snapshot holds: immutable, and cheap to take again after a few
changes.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

# The groups asked in turn, finest first: the user's own history before anyone else's, so that a
# user cannot borrow another user's short jobs by naming a long job like theirs.
GROUPS: tuple[tuple[str, ...], ...] = (
    ("user", "name", "gpus"),
    ("user", "name"),
    ("user", "gpus"),
    ("user",),
    ("name", "gpus"),
    ("gpus",),
    (),
)

# GROUPS[:OWN_GROUPS] are the groups of one user's jobs
OWN_GROUPS = next(index for index, group in enumerate(GROUPS) if "user" not in group)
assert all("user" in group for group in GROUPS[:OWN_GROUPS])

# Key of a group: (its index in GROUPS, the values of its fields)
Key = tuple

# The key of the group of every finished job
_EVERY_JOB: Key = (GROUPS.index(()),)

# A job that ended in one of these states after less than NEVER_RAN_S of run time (its GPU service
# per GPU) never really ran: cancelled at or just after its start, failed at launch. Its user's own
# groups learn from it (a user whose jobs fail at launch is likely to see the next one fail fast: on
# the sample, leaving such jobs out altogether cost Dike 18% average JCT with every job preemptible
# and nearly tripled the worst user's slowdown), but no group that spans users does, so that one
# user's cancelled job never moves another user's expected service (docs/results.md, "Jobs that
# never really ran", has what this rule changed).
NOT_RUN_STATES = frozenset({"CANCELLED", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY"})  # JobState values
NEVER_RAN_S = 300.0


def never_ran(final_state: str, run_s: float) -> bool:
    """Whether a finished job never really ran (above): the prior learns it in its user's groups only."""
    return final_state in NOT_RUN_STATES and run_s < NEVER_RAN_S


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """What the prior learns from one finished job."""

    user: str
    name: str
    gpus: int
    run_s: float  # its GPU service / its GPUs: the run time of every run together
    end: float
    own_only: bool = False  # learned by its user's own groups only (it never really ran: `never_ran`)


@dataclass(frozen=True, slots=True)
class Estimate:
    """One group's statistic: the median run time of its `count` finished jobs."""

    run_s: float
    count: int
    # log(max(run_s, 1)): what `predict` folds, worked out once per estimate, not once per prediction
    log_run: float = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "log_run", math.log(max(self.run_s, 1.0)))


@dataclass(frozen=True)
class Prediction:
    """A job's expected GPU service and the group it came from."""

    gpu_s: float
    group: tuple[str, ...]  # the group's fields, e.g. ("user", "name", "gpus")
    values: tuple[str, ...]  # their values for this job
    count: int  # finished jobs in the group
    overrun: float = 1.0  # the user's jobs used this many times what their groups' medians say

    @property
    def own(self) -> bool:
        """The group holds only the job's own user's jobs."""
        return "user" in self.group

    def describe(self) -> str:
        """`12.4 GPU-h from 37 finished jobs of alice / train.sh / 4 GPUs`: the group is named by
        this job's own values only, never another user's job or name."""
        figure = f"{self.gpu_s / 3600:.3g} GPU-h from {self.count} finished job{'s' if self.count != 1 else ''}"
        parts = [f"{value} GPUs" if field == "gpus" else value for field, value in zip(self.group, self.values)]
        text = f"{figure} of {' / '.join(parts)}" if parts else f"{figure} (every finished job)"
        if self.overrun > 1.0:
            text += f", x{self.overrun:.2g}: this user's jobs overran their groups' medians"
        return text

    @functools.cached_property
    def reason(self) -> str:
        """`expected=12.40gpuh (12.4 GPU-h from ...)`, as a job's reason shows it: made once per
        prediction, which a view keeps from cycle to cycle."""
        return f"expected={self.gpu_s / 3600:.2f}gpuh ({self.describe()})"


def _overrun_of(groups: Iterable[list[float]]) -> Estimate:
    """How far a user's finished jobs overran the medians of their own (user, name, GPUs) groups:
    their run time over the groups' count x median, at least 1. A user who names long jobs like
    their short ones pays for it on every job: the median of the mixed group stays short, its total
    does not. Over `groups` in key order, so that it adds up the same however it was learned."""
    return _overrun_from(_group_totals(runs) for runs in groups)


def _group_totals(runs: list[float]) -> tuple[float, float, int]:
    """One (user, name, GPUs) group's part of its user's overrun: the run time its jobs used, what
    its median says they would (count x median) and its count."""
    return sum(runs), len(runs) * _median_estimate(runs).run_s, len(runs)


def _overrun_from(totals: Iterable[tuple[float, float, int]]) -> Estimate:
    """`_overrun_of` from each group's `_group_totals`, added in the same order."""
    used = predicted = 0.0
    jobs = 0
    for group_used, group_predicted, count in totals:
        used += group_used
        predicted += group_predicted
        jobs += count
    return Estimate(used / predicted if used > predicted > 0 else 1.0, jobs)


def _overrun_key(user: str) -> Key:
    return (-1, user)


def _median_estimate(ascending: list[float]) -> Estimate:
    middle = len(ascending) // 2
    median = ascending[middle] if len(ascending) % 2 else (ascending[middle - 1] + ascending[middle]) / 2
    return Estimate(median, len(ascending))


def _learned_keys(job: FinishedJob) -> list[tuple[Key, tuple[str, ...]]]:
    """The groups that learn from a finished job: all of them, or its user's own."""
    keys = _keys(job.user, job.name, job.gpus)
    return keys[:OWN_GROUPS] if job.own_only else keys


def _keys(user: str, name: str, gpus: int) -> list[tuple[Key, tuple[str, ...]]]:
    """Each group's key and shown values for one job, in GROUPS' order (written out: the prior
    calls it for every finished job it learns; tests/unit/test_service_prior.py checks it against
    GROUPS)."""
    g = str(gpus)
    return [
        ((0, user, name, g), (user, name, g)),
        ((1, user, name), (user, name)),
        ((2, user, g), (user, g)),
        ((3, user), (user,)),
        ((4, name, g), (name, g)),
        ((5, g), (g,)),
        ((6,), ()),
    ]


# The groupings the power is measured on (indexes in GROUPS): (user, name, GPUs) and (GPUs,)
POWER_GROUPS = (0, 5)
assert GROUPS[0] == ("user", "name", "gpus") and GROUPS[5] == ("gpus",)
_LOG_UNIT = 1 << 16  # a log run time in integer units, so that the moments add up exactly


def _log_units(run_s: float) -> int:
    return round(math.log(max(run_s, 1.0)) * _LOG_UNIT)


class PowerMoments:
    """Over one grouping's groups of two jobs or more: each job's log run time x against the mean
    m of the other jobs of its group, as exact integer sums (a group of n jobs with sum S and sum
    of squares Q adds S to sum x and to sum m, Q to sum x^2, (S^2 - Q) / (n - 1) to sum xm and
    ((n - 2) S^2 + Q) / (n - 1)^2 to sum m^2)."""

    __slots__ = ("jobs", "sum_x", "sum_x2", "sum_xm", "sum_m2")

    def __init__(self) -> None:
        self.jobs = self.sum_x = self.sum_x2 = self.sum_xm = self.sum_m2 = 0

    def add_group(self, n: int, s: int, q: int, sign: int = 1) -> None:
        """Add (sign 1) or take away (sign -1) one group's share."""
        if n < 2:
            return
        self.jobs += sign * n
        self.sum_x += sign * s
        self.sum_x2 += sign * q
        self.sum_xm += sign * ((s * s - q) // (n - 1))
        self.sum_m2 += sign * (((n - 2) * s * s + q) // ((n - 1) ** 2))

    def lower_bound(self) -> float:
        """The correlation of x and m less twice its standard error; 0 with fewer than 3 jobs or
        no spread."""
        n = self.jobs
        if n < 3:
            return 0.0
        spread_x = n * self.sum_x2 - self.sum_x * self.sum_x
        spread_m = n * self.sum_m2 - self.sum_x * self.sum_x
        if spread_x <= 0 or spread_m <= 0:
            return 0.0
        correlation = (n * self.sum_xm - self.sum_x * self.sum_x) / math.sqrt(float(spread_x) * float(spread_m))
        return correlation - 2.0 / math.sqrt(n)


def power_of(moments: Iterable[PowerMoments]) -> float:
    """The prior's power from its groupings' moments (the module's docstring), at least 0."""
    return max(0.0, *(m.lower_bound() for m in moments))


class ServicePrior:
    """The groups' estimates at one instant: never changes once made."""

    __slots__ = ("_base", "_recent", "jobs", "power", "not_run", "_predicted")

    def __init__(self, base: Mapping[Key, Estimate], recent: Mapping[Key, Estimate | None], jobs: int,
                 power: float = 0.0, not_run: int = 0) -> None:
        self._base = base
        self._recent = recent  # newer than base; None: the group emptied
        self.jobs = jobs  # finished jobs learned from that really ran (`never_ran`: not counted)
        self.power = power  # how much the history knows (the module's docstring)
        self.not_run = not_run  # finished jobs that never really ran: learned by their users' groups only
        # predict's answers: the estimates never change, so neither do they (a replay asks the same
        # view every cycle until a job finishes)
        self._predicted: dict[tuple[str, str, int, float, float], Prediction | None] = {}

    @classmethod
    def learn(cls, finished: Iterable[FinishedJob]) -> ServicePrior:
        """The prior of these finished jobs at once (the engine, each cycle): the same estimates as
        adding them one by one to a `PriorLearner`, grouped and sorted in one pass."""
        runs: dict[Key, list[float]] = {}
        jobs = not_run = 0
        for job in finished:
            if job.gpus <= 0:
                continue
            jobs += not job.own_only
            not_run += job.own_only
            for key, _ in _learned_keys(job):
                runs.setdefault(key, []).append(job.run_s)
        estimates = {}
        own: dict[str, list[Key]] = {}
        for key, values in runs.items():
            values.sort()
            estimates[key] = _median_estimate(values)
            if key[0] == 0:
                own.setdefault(key[1], []).append(key)
        for user, keys in own.items():
            estimates[_overrun_key(user)] = _overrun_of(runs[key] for key in sorted(keys))
        moments = {grouping: PowerMoments() for grouping in POWER_GROUPS}
        for key, values in runs.items():
            if key[0] in moments:
                units = [_log_units(run_s) for run_s in values]
                moments[key[0]].add_group(len(units), sum(units), sum(u * u for u in units))
        return cls(MappingProxyType(estimates), MappingProxyType({}), jobs, power_of(moments.values()), not_run)

    def estimate(self, key: Key) -> Estimate | None:
        if key in self._recent:
            return self._recent[key]
        return self._base.get(key)

    def predict(self, user: str, name: str, gpus: int, shrink_jobs: float, trust: float = 1.0) -> Prediction | None:
        """The groups' medians from every job down to the finest group, each pulling the estimate
        toward its own by n / (n + shrink_jobs); named by the finest group that has jobs. None
        without GPUs or history. `trust` < 1 keeps that share of what the groups and the user's
        overruns say, in log space, against the median run time of every finished job (0: every
        job is expected that median times its GPUs)."""
        asked = (user, name, gpus, shrink_jobs, trust)
        try:
            return self._predicted[asked]
        except KeyError:
            prediction = self._predict(user, name, gpus, shrink_jobs)
            if prediction is not None and trust < 1.0:
                prediction = self._trusted(prediction, gpus, trust)
            self._predicted[asked] = prediction
            return prediction

    def _trusted(self, prediction: Prediction, gpus: int, trust: float) -> Prediction:
        every = self.estimate(_EVERY_JOB)
        if every is None:
            return prediction
        base = math.log(max(every.run_s, 1.0))
        run_s = math.exp(base + trust * (math.log(max(prediction.gpu_s / gpus, 1.0)) - base))
        return replace(prediction, gpu_s=run_s * gpus, overrun=prediction.overrun ** trust)

    def _predict(self, user: str, name: str, gpus: int, shrink_jobs: float) -> Prediction | None:
        if gpus <= 0:
            return None
        # The groups from every job down to the finest, as `_keys` spells their keys (written out:
        # a replay predicts every active job each cycle).
        g = str(gpus)
        recent, base = self._recent, self._base
        log_run: float | None = None
        finest = -1
        count = 0
        for index, key in ((6, _EVERY_JOB), (5, (5, g)), (4, (4, name, g)), (3, (3, user)), (2, (2, user, g)),
                           (1, (1, user, name)), (0, (0, user, name, g))):
            estimate = recent[key] if key in recent else base.get(key)  # `estimate(key)`
            if estimate is None:
                continue
            if log_run is None:
                log_run = estimate.log_run
            else:
                log_run += (estimate.log_run - log_run) * estimate.count / (estimate.count + shrink_jobs)
            finest, count = index, estimate.count
        if log_run is None:
            return None
        # The user's overrun factor, as it is: a user who hides long jobs among short ones is
        # predicted the mixed group's mean, what a user who names every job alike gets. Squared,
        # hiding would cost more than it gains in the gaming test, but a user of the sample whose
        # generic job names (bash, jupyter) vary widely then starves: worst-user slowdown 3,958
        # against 425 (docs/results.md).
        overrun = self.estimate(_overrun_key(user))
        factor = overrun.run_s if overrun is not None else 1.0
        shown = _keys(user, name, gpus)[finest][1]
        return Prediction(math.exp(log_run) * gpus * factor, GROUPS[finest], shown, count, factor)


class PriorLearner:
    """The groups' run times, kept sorted as finished jobs are added and removed."""

    def __init__(self) -> None:
        self._runs: dict[Key, list[float]] = {}
        self._own: dict[str, set[Key]] = {}  # each user's (user, name, GPUs) groups
        self._estimates: dict[Key, Estimate] = {}
        self._base: Mapping[Key, Estimate] = MappingProxyType({})
        self._changed: set[Key] = set()  # keys changed since _base was taken
        self._view: ServicePrior | None = None
        self.jobs = self.not_run = 0  # as ServicePrior's
        # the power's moments: each grouping's totals, and each of its groups' (n, sum, sum of squares)
        self._moments = {grouping: PowerMoments() for grouping in POWER_GROUPS}
        self._group_sums: dict[Key, tuple[int, int, int]] = {}
        # each (user, name, GPUs) group's _group_totals, kept as the group changes, so that a
        # user's overrun adds up their groups' without going over every run again
        self._own_totals: dict[Key, tuple[float, float, int]] = {}

    def add(self, job: FinishedJob) -> None:
        if job.gpus <= 0:
            return
        self.jobs += not job.own_only
        self.not_run += job.own_only
        keys = _learned_keys(job)
        for key, _ in keys:
            bisect.insort(self._runs.setdefault(key, []), job.run_s)
            self._refresh(key)
            self._move_moments(key, job.run_s, 1)
        self._own.setdefault(job.user, set()).add(keys[0][0])  # GROUPS[0]: (user, name, GPUs)
        self._refresh_overrun(job.user)

    def remove(self, job: FinishedJob) -> None:
        """Forget one job added before (it left the history window)."""
        if job.gpus <= 0:
            return
        self.jobs -= not job.own_only
        self.not_run -= job.own_only
        for key, _ in _learned_keys(job):
            self._move_moments(key, job.run_s, -1)
            runs = self._runs[key]
            del runs[bisect.bisect_left(runs, job.run_s)]
            if not runs:
                del self._runs[key]
                if key[0] == 0:
                    self._own[job.user].discard(key)
            self._refresh(key)
        self._refresh_overrun(job.user)

    def _move_moments(self, key: Key, run_s: float, sign: int) -> None:
        """A job joins (sign 1) or leaves (-1) the group `key`: its grouping's moments follow."""
        moments = self._moments.get(key[0])
        if moments is None:
            return
        n, total, squares = self._group_sums.get(key, (0, 0, 0))
        moments.add_group(n, total, squares, -1)
        units = _log_units(run_s)
        n, total, squares = n + sign, total + sign * units, squares + sign * units * units
        moments.add_group(n, total, squares)
        if n:
            self._group_sums[key] = (n, total, squares)
        else:
            del self._group_sums[key]

    def _refresh(self, key: Key) -> None:
        runs = self._runs.get(key)
        if runs:
            self._estimates[key] = _median_estimate(runs)
            if key[0] == 0:
                self._own_totals[key] = _group_totals(runs)
        else:
            self._estimates.pop(key, None)
            self._own_totals.pop(key, None)
        self._changed.add(key)
        self._view = None

    def _refresh_overrun(self, user: str) -> None:
        key = _overrun_key(user)
        groups = sorted(self._own.get(user, ()))
        if groups:
            self._estimates[key] = _overrun_from(self._own_totals[group] for group in groups)
        else:
            self._own.pop(user, None)
            self._estimates.pop(key, None)
        self._changed.add(key)
        self._view = None

    def view(self) -> ServicePrior:
        """The estimates now. Copies only the keys changed since the last full copy, and makes a
        full copy when those grow past an eighth of all keys (amortised O(changes) per view)."""
        if self._view is None:
            if len(self._changed) > max(64, len(self._estimates) // 8):
                self._base = MappingProxyType(dict(self._estimates))
                self._changed.clear()
            recent = MappingProxyType({key: self._estimates.get(key) for key in self._changed})
            self._view = ServicePrior(self._base, recent, self.jobs, power_of(self._moments.values()), self.not_run)
        return self._view
