"""What every policy is: a class with a name, a parameter model and a pure `decide`.

`Policy[P]` is generic in its parameter model `P`: `decide` and every hook take the policy's own
parameters, typed, so no policy checks their class at run time. The built-in policies are
composed of typed stages (`policies/stages.py`)."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from dike_slurm.domain.decisions import Decisions
from dike_slurm.domain.model import Job, Snapshot

if TYPE_CHECKING:
    from dike_slurm.domain.service_prior import Prediction


class PolicyParams(BaseModel):
    """Base of every policy's parameters: immutable, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


P = TypeVar("P", bound=PolicyParams)


class Policy(ABC, Generic[P]):
    """A scheduling policy with parameters `P`. `decide` must be pure: no I/O, no clock, randomness
    only from `rng`. The hooks declare what it reads and writes; the engine and the simulator ask
    them, never the parameters themselves."""

    name: ClassVar[str]
    description: ClassVar[str]
    Params: ClassVar[type[PolicyParams]] = PolicyParams  # P's class: the configuration validates into it
    live: ClassVar[bool] = True  # False: replay only (e.g. an oracle that needs true durations)

    @abstractmethod
    def decide(self, snapshot: Snapshot, params: P, rng: random.Random) -> Decisions:
        """Decisions for the managed jobs of this snapshot."""

    def reads_completed_service(self, params: P) -> bool:
        """Whether `decide` reads `snapshot.completed_service_gpu_s` with these parameters.

        When it does not, the engine and the simulator leave that field empty instead of
        building it every cycle (a sorted copy of every job finished in the window: the largest
        cost of a million-job replay). The safe default for a policy that does not say is True.
        """
        return True

    def reads_service_prior(self, params: P) -> bool:
        """Whether `decide` reads `snapshot.service_prior` with these parameters; when it does not,
        the engine and the simulator do not learn one."""
        return False

    def replays_as_priority_basic(self, params: P) -> bool:
        """Whether the replay stands this policy for a site running Slurm's `priority/basic`
        (submit order, every factor and SiteFactor ignored) instead of adding what the engine
        would write to the site's multifactor priority. Only the `fifo` baseline says so: the
        engine's rank values would sit within the tolerance of one another and Slurm's own
        factors would reorder them, which is not the FIFO a site gets."""
        return False

    def replay_may_postpone(self, params: P) -> bool:
        """Whether the replay may postpone a policy cycle at which no waiting job could start and
        decide it when one could, instead of deciding it when it falls due as the live engine does.
        Only where deciding later gives the same order (fifo's submit order, multifactor's none: on
        the bundled sample, average JCT within 0.01 s either way). Where decisions follow the clock
        (attained service, waits, usage, the prior) they do not: Dike without preemption, postponed,
        gave 15,213 s on the sample's day one against 19,860 s decided when due, and the
        non-preemptive oracle 11,087 s against 10,543 s (docs/replay.md). The safe default is False."""
        return False

    def requeue_min_run_s(self, params: P) -> float | None:
        """None when `decide` never returns requeues with these parameters; otherwise the shortest
        run (seconds since the job's last start) it may preempt.

        The live engine and the replay both refuse requeues of younger runs with it (one guard,
        `dike_slurm.cycle.requeue_guard.guard_requeues`).
        A `StagedPolicy` answers with its preemption stage's `Victims.min_run_s`.
        """
        return None

    def preemption_gains(self, params: P, expected: Mapping[int, Prediction]) -> Callable[[Job, Job], bool] | None:
        """Whether requeueing a running job (second) for a blocked one (first) promises a gain, with
        `expected` the cycle's expected service by job (`Decisions.expected`); None: any job the
        blocked job outranks may be cut. `explain` asks it, as the preemption stage does.
        A `StagedPolicy` answers with its preemption stage's `Victims.gains`."""
        return None

    def usage_owner(self, params: P) -> str:
        """Whose decayed GPU usage the snapshot's `user_usage_gpu_s` is keyed by: "user" or "account"."""
        return "user"

    def score_ceiling(self, params: P) -> float | None:
        """An upper bound of the scores `decide` returns, if it has a fixed one; None: unbounded.

        The live engine maps scores onto Slurm priorities against it, so that a job's value does
        not move when other jobs come and go.
        """
        return None

    def switch_wait_s(self, params: P) -> int | None:
        """The longest wait of the Switches constraints `decide` sets with these parameters; None: it sets none.

        `dike-slurm render slurm-conf` prints it as the `max_switch_wait` Slurm needs to honour them.
        """
        return None

    def leaf_feature_prefix(self, params: P) -> str:
        """The node feature naming a leaf switch in `decide`'s Features constraints: prefix + switch name.

        `dike-slurm render slurm-conf` prints the node features the site must configure with it.
        """
        return "leaf_"

    def promotion_at(self, job: Job, params: P) -> float | None:
        """When this pending job, at a level above 0, would be promoted to level 0 for waiting
        (epoch seconds), None when it never is; `explain` tells the user."""
        return None
