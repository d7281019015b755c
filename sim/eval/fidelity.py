"""The replay against a real run, job by job: each job's outcome read from the run's sacct dump
and from its replay, and the statistics that compare two sets of outcomes (Kendall's tau of the
start order, start-time and JCT errors, leaf switches, preemptions). `make fidelity`
(bench/fidelity.py) runs the lab side and reports them: docs/replay.md, "Fidelity"."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dike_slurm.errors import InputError


@dataclass(frozen=True)
class JobOutcome:
    """What happened to one job, times in seconds from the run's origin (its first submission)."""

    submit: float
    start: float  # first start
    end: float  # end of the last run
    nodes: int
    leaves: int  # leaf switches of the last run
    preemptions: int

    @property
    def wait(self) -> float:
        return self.start - self.submit

    @property
    def jct(self) -> float:
        return self.end - self.submit


def kendall_tau(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Kendall's tau-b of two paired sequences (ties counted as neither concordant nor discordant).

    1 = the same order, -1 = reversed; nan when one side is constant or has fewer than two values.
    """
    if len(xs) != len(ys):
        raise ValueError("kendall_tau needs paired sequences")
    concordant = discordant = ties_x = ties_y = 0
    n = len(xs)
    for i in range(n):
        xi, yi = xs[i], ys[i]
        for j in range(i + 1, n):
            dx, dy = xs[j] - xi, ys[j] - yi
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                ties_x += 1
            elif dy == 0:
                ties_y += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denominator = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return (concordant - discordant) / denominator if denominator else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (q in [0, 100]); nan for no values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = q / 100 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def compare(reference: Mapping[int, JobOutcome], other: Mapping[int, JobOutcome]) -> dict:
    """`other` (a replay, or a second real run) against `reference` (a real run), job by job.

    Only jobs in both are compared (`jobs`); `missing` counts the reference's jobs the other lacks.
    """
    keys = sorted(set(reference) & set(other))
    ref = [reference[k] for k in keys]
    oth = [other[k] for k in keys]
    start_errors = [abs(o.start - r.start) for r, o in zip(ref, oth)]
    jct_errors = [abs(o.jct - r.jct) for r, o in zip(ref, oth)]
    mean_wait = statistics.fmean(r.wait for r in ref) if ref else float("nan")
    mean_jct_ref = statistics.fmean(r.jct for r in ref) if ref else float("nan")
    mean_jct_other = statistics.fmean(o.jct for o in oth) if oth else float("nan")
    multi = [(r, o) for r, o in zip(ref, oth) if r.nodes > 1]
    same_leaves = sum(1 for r, o in multi if r.leaves == o.leaves)
    return {
        "jobs": len(keys),
        "missing": len(set(reference) - set(other)),
        "kendall_tau": kendall_tau([r.start for r in ref], [o.start for o in oth]),
        "start_error_median_s": percentile(start_errors, 50),
        "start_error_p95_s": percentile(start_errors, 95),
        "mean_wait_s": mean_wait,
        "start_error_wait_share": (statistics.fmean(start_errors) / mean_wait) if ref and mean_wait > 0 else float("nan"),
        "mean_jct_reference_s": mean_jct_ref,
        "mean_jct_other_s": mean_jct_other,
        "mean_jct_error": (mean_jct_other - mean_jct_ref) / mean_jct_ref if ref and mean_jct_ref > 0 else float("nan"),
        "jct_error_median_s": percentile(jct_errors, 50),
        "multi_node_jobs": len(multi),
        "same_leaves": same_leaves,
        "same_leaves_share": same_leaves / len(multi) if multi else float("nan"),
        "leaves_reference": dict(sorted(_count(r.leaves for r, _ in multi).items())),
        "leaves_other": dict(sorted(_count(o.leaves for _, o in multi).items())),
        "preemptions_reference": sum(r.preemptions for r in ref),
        "preemptions_other": sum(o.preemptions for o in oth),
        "preempted_jobs_both": sum(1 for r, o in zip(ref, oth) if r.preemptions and o.preemptions),
    }


def _count(values) -> dict[int, int]:
    counts: dict[int, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def leaves_of(nodes: Sequence[str], leaf_of) -> int:
    """How many leaf switches a node list spans (`leaf_of`: node name -> leaf name)."""
    return len({leaf_of(n) for n in nodes})


def real_outcomes(run_dir: Path, workload_index: Callable[[str], int | None]
                  ) -> tuple[dict[int, JobOutcome], float, dict[int, int]]:
    """The run's jobs from its sacct dump: workload index -> outcome (times from the first submit),
    the origin (epoch s), and job id -> workload index. `workload_index` reads a job's index from
    its name (None: not a job of the workload)."""
    from dike_slurm.slurm.accounting_json import read_sacct_file
    from dike_slurm.slurm.slurm_conf import load_cluster

    _, topology = load_cluster(run_dir / "slurm.conf", run_dir / "topology.conf")
    read = read_sacct_file(run_dir / "sacct.txt")
    runs: dict[int, list] = {}
    index_of: dict[int, int] = {}
    for record in read.records:
        index = workload_index(record.name)
        if index is None:
            continue
        runs.setdefault(record.job_id, []).append(record)
        index_of[record.job_id] = index
    if not runs:
        raise InputError("holds no job of the workload", source=str(run_dir / "sacct.txt"))
    origin = min(r.submit for rs in runs.values() for r in rs if r.submit is not None)
    outcomes = {}
    for job_id, records in runs.items():
        started = sorted((r for r in records if r.start is not None), key=lambda r: r.start)
        if not started or started[-1].end is None:
            continue
        submit = min(r.submit for r in records if r.submit is not None)
        outcomes[index_of[job_id]] = JobOutcome(
            submit=submit - origin, start=started[0].start - origin, end=started[-1].end - origin,
            nodes=max(1, started[-1].num_nodes), leaves=leaves_of(started[-1].nodes, topology.leaf_of),
            preemptions=len(started) - 1,
        )
    return outcomes, origin, index_of


def replay_outcomes(run_dir: Path, policy: str, origin: float, index_of: Mapping[int, int]) -> tuple[dict[int, JobOutcome], dict]:
    """The run's dump replayed through the simulator under the run's configuration."""
    from dike_slurm.config import load_config
    from dike_slurm.sim.eval.evaluate import case_history
    from dike_slurm.registry import default_registry
    from dike_slurm.sim.kernel.cluster import SimCluster
    from dike_slurm.sim.kernel.records import Timeline
    from dike_slurm.sim.kernel.replay import load_input, sim_settings
    from dike_slurm.sim.kernel.simulator import Simulator

    config = load_config(run_dir / "dike.toml", environ={}, offline=True)
    # history.txt: what the engine's accounting held as the run began (a warm start)
    replay_input = load_input(run_dir / "sacct.txt", run_dir / "slurm.conf", run_dir / "topology.conf",
                              case_history(run_dir))
    # The engine's writes reach Slurm one cycle time after its reads: the run's own, measured.
    settings = dataclasses.replace(sim_settings(config, replay_input.conf, source=str(run_dir / "slurm.conf")),
                                   cycle_latency_s=measured_cycle_s(run_dir / "state.sqlite"))
    trace = replay_trace(replay_input.trace.jobs, run_dir)
    cluster = SimCluster(replay_input.conf, replay_input.topology)
    results = []
    simulator = Simulator(trace, cluster, default_registry().create(policy), config.policy_params(policy), settings,
                          Timeline(origin=trace[0].submit, width=60.0), results.append, history=replay_input.history)
    stats = simulator.run()
    outcomes = {}
    for result in results:
        index = index_of.get(result.job_id)
        if index is not None:
            outcomes[index] = JobOutcome(
                submit=result.submit - origin, start=result.start - origin, end=result.end - origin,
                nodes=next(t.num_nodes for t in trace if t.job_id == result.job_id), leaves=result.leaves,
                preemptions=result.preemptions,
            )
    return outcomes, {"preemptions": stats.preemptions, "cycles": stats.cycles, "passes": stats.passes,
                      "backfill_passes": stats.backfill_passes, "cycle_latency_s": settings.cycle_latency_s}


def measured_cycle_s(state_db: Path) -> float:
    """The mean wall time of the run's engine cycles that had jobs in scope (its state store)."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"file:{state_db}?mode=ro", uri=True)) as db:
        (mean,) = db.execute("SELECT avg(seconds) FROM cycles WHERE jobs > 0").fetchone()
    if mean is None:
        raise InputError("no engine cycle with jobs in scope; the run did not happen", source=str(state_db))
    return round(mean, 3)


def replay_trace(trace, run_dir: Path):
    """The trace with each requeued job's run time set to its last run's: a `sleep` starts over
    when requeued (the trace's default, the sum of the runs, stands for a job that resumes)."""
    from dike_slurm.slurm.accounting_json import read_sacct_file

    last_run: dict[int, int] = {}
    runs: dict[int, int] = {}
    for record in read_sacct_file(run_dir / "sacct.txt").records:
        if record.start is not None:
            runs[record.job_id] = runs.get(record.job_id, 0) + 1
            if record.end is not None:
                last_run[record.job_id] = record.elapsed_s  # records come in start order per job
    return tuple(
        dataclasses.replace(job, duration_s=float(last_run[job.job_id]))
        if runs.get(job.job_id, 0) > 1 and last_run.get(job.job_id, 0) > 0 else job
        for job in trace
    )
