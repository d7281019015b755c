"""A trace's twin in which job history predicts nothing: users and job names shuffled across jobs.

Each job keeps what it asked for and how long it ran (submit time, GPUs, nodes, partition, QOS,
time limit, duration, comment); its user (with the user's account) comes from one seeded
permutation of the jobs and its name from another. A group of the service prior (user, name,
GPUs) then holds jobs whose run times are unrelated, and a user's jobs are a random draw of the
trace's: what a site whose names carry no signal looks like, with the same load and the same
users' shares of it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from dike_slurm.sim.kernel.replay import ReplayInput
from dike_slurm.sim.kernel.trace import TraceJob


def shuffle_identities(jobs: Sequence[TraceJob], seed: int) -> tuple[TraceJob, ...]:
    """The jobs in the same order, each with the (user, account) and the name of other jobs,
    drawn by two independent permutations seeded with `seed`."""
    rng = random.Random(seed)
    owners = [(job.user, job.account) for job in jobs]
    names = [job.name for job in jobs]
    rng.shuffle(owners)
    rng.shuffle(names)
    return tuple(
        replace(job, user=user, account=account, name=name)
        for job, (user, account), name in zip(jobs, owners, names)
    )


def shuffled_twin(replay_input: ReplayInput, seed: int) -> ReplayInput:
    """A replay input's twin: its jobs shuffled as `shuffle_identities` does. A warm start's past jobs
    are shuffled with them, in one draw over both, so that its history predicts nothing either."""
    jobs = replay_input.trace.jobs
    history = replay_input.history
    if history is None:
        return replace(replay_input, trace=replace(replay_input.trace, jobs=shuffle_identities(jobs, seed)))
    together = shuffle_identities(tuple(past.trace for past in history.jobs) + tuple(jobs), seed)
    past = tuple(replace(job, trace=trace) for job, trace in zip(history.jobs, together))
    return replace(replay_input, trace=replace(replay_input.trace, jobs=together[len(past):]),
                   history=replace(history, jobs=past))
