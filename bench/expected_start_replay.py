"""The expected start's error on a replay: predicted at moments of a replay, against the replay's own
starts (issue 54, item 3; the lab's figures against the real `squeue --start` are bench/expected_start.py's).

The replay is the site's own Slurm without an engine (policy `multifactor`: its weights from the
dump's slurm.conf, which change the order as jobs age and use their share). Every `--every` hours of
simulated time it stops and predicts each pending job's start twice, with sim/forward.py on what a
read of Slurm would show then (the running jobs on their nodes, the pending ones in Slurm's order):

- **dike**: the service prior learned, as the engine learns it, from the jobs finished by then
  (Dike's defaults: in force from 50 finished jobs that really ran, at a power above 0);
- **time limits**: no expectation, every job to its time limit: what `squeue --start` assumes,
  computed by the same model (Slurm's own backfill plan is not in a replay).

Then it runs on and compares each prediction with the job's start in the replay. A job submitted
later, a priority that moves and a run the prior gets wrong are all in the error, as they are live.

Run: .venv/bin/python bench/expected_start_replay.py [--dump examples/sample/sacct.txt]; writes
out/expected-start/replay.json and prints the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from dike_slurm.config import Config  # noqa: E402
from dike_slurm.domain.model import Job, JobState  # noqa: E402
from dike_slurm.domain.service_prior import FinishedJob, ServicePrior, never_ran  # noqa: E402
from dike_slurm.policies.dike import DikeParams  # noqa: E402
from dike_slurm.policies.multifactor import MultifactorParams, MultifactorPolicy  # noqa: E402
from dike_slurm.sim.forward import ForwardInputs, expected_starts  # noqa: E402
from dike_slurm.sim.kernel.job import RUNNING  # noqa: E402
from dike_slurm.sim.kernel.records import JobResult, Timeline  # noqa: E402
from dike_slurm.sim.kernel.replay import load_input, sim_settings  # noqa: E402
from dike_slurm.sim.kernel.simulator import Simulator  # noqa: E402


def read_of_slurm(simulator: Simulator, at: float) -> list[Job]:
    """The replay's active jobs as squeue would show them at `at`: running ones on their nodes,
    pending ones with a priority that gives Slurm's order now."""
    names = simulator.cluster.names
    order = {job.trace.job_id: rank for rank, job in enumerate(simulator.scheduler.pending_in_order())}
    jobs = []
    for job in simulator.active.values():
        trace = job.trace
        common = dict(job_id=trace.job_id, user=trace.user, submit_time=trace.submit, gpus=trace.gpus,
                      num_nodes=trace.num_nodes, cpus=trace.cpus, account=trace.account, partition=trace.partition,
                      qos=trace.qos, name=trace.name, time_limit_s=trace.time_limit_s, gpu_types=trace.gpu_types,
                      eligible_time=job.eligible_at)
        if job.state == RUNNING:
            jobs.append(Job(state=JobState.RUNNING, start_time=job.start, nodes=tuple(names[n] for n in job.nodes),
                            **common))
        elif trace.job_id in order:
            jobs.append(Job(state=JobState.PENDING, priority=len(order) - order[trace.job_id], placement=job.placement,
                            slurm_reason="BeginTime" if job.eligible_at > at else "Priority", **common))
    return jobs


def prior_runs(finished: list[FinishedJob], jobs: list[Job], params: DikeParams) -> tuple[dict[int, float], float | None]:
    """Each job's expected run time from the prior of `finished`, as the Dike policy would use it, and its power."""
    prior = ServicePrior.learn(finished)
    if prior.jobs < params.min_history_jobs or prior.power <= params.prior_min_power:
        return {}, prior.power
    full = params.prior_power_full
    trust = 1.0 if full <= 0 or prior.power >= full else prior.power / full
    runs = {}
    for job in jobs:
        prediction = prior.predict(job.user, job.name, job.gpus, params.prior_shrink_jobs, trust)
        if prediction is not None and job.gpus > 0:
            runs[job.job_id] = prediction.gpu_s / job.gpus
    return runs, prior.power


def errors(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    values = [predicted - actual for predicted, actual in pairs]
    absolute = sorted(abs(v) for v in values)
    if not absolute:
        return {"jobs": 0}
    return {"jobs": len(values), "mean_abs_h": round(statistics.fmean(absolute) / 3600, 2),
            "median_abs_h": round(statistics.median(absolute) / 3600, 2),
            "p90_abs_h": round(absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))] / 3600, 2),
            "mean_signed_h": round(statistics.fmean(values) / 3600, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dump", type=Path, default=REPO / "examples" / "sample" / "sacct.txt")
    parser.add_argument("--every", type=float, default=6.0, help="hours of simulated time between predictions")
    parser.add_argument("--warmup", type=float, default=24.0, help="hours before the first prediction")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "expected-start" / "replay.json")
    args = parser.parse_args()
    folder = args.dump.parent
    replay_input = load_input(args.dump, folder / "slurm.conf", folder / "topology.conf")
    config = Config()
    settings = sim_settings(config, replay_input.conf, source=str(folder / "slurm.conf"))
    trace = replay_input.trace.jobs
    from dike_slurm.sim.kernel.cluster import SimCluster

    cluster = SimCluster(replay_input.conf, replay_input.topology)
    results: dict[int, JobResult] = {}
    names = {t.job_id: (t.name, t.final_state) for t in trace}
    finished: list[FinishedJob] = []

    def on_finish(result: JobResult) -> None:
        results[result.job_id] = result
        name, state = names[result.job_id]
        run_s = result.gpu_seconds / result.gpus if result.gpus else 0.0
        finished.append(FinishedJob(result.user, name, result.gpus, run_s, result.end, never_ran(state, run_s)))

    simulator = Simulator(trace, cluster, MultifactorPolicy(), MultifactorParams(), settings,
                          Timeline(origin=trace[0].submit, width=3600.0), on_finish)
    partitions = {p.name for p in replay_input.conf.partitions}
    nodes = tuple(n if n.partitions else n.__class__(**{**n.__dict__, "partitions": tuple(sorted(partitions))})
                  for n in cluster.nodes)
    params = DikeParams()
    moments, predictions = [], []
    at = trace[0].submit + args.warmup * 3600
    while at < trace[-1].submit:
        simulator.run(until=at)
        jobs = read_of_slurm(simulator, at)
        pending = [j for j in jobs if j.state is JobState.PENDING]
        if pending:
            runs, power = prior_runs([f for f in finished if f.end <= at], jobs, params)
            started = time.perf_counter()
            dike = expected_starts(ForwardInputs(at, jobs, nodes, replay_input.topology, runs, settings=settings))
            limits = expected_starts(ForwardInputs(at, jobs, nodes, replay_input.topology, {}, settings=settings))
            moments.append({"at": at, "pending": len(pending), "running": len(jobs) - len(pending),
                            "prior_power": power, "prior_jobs": len(runs), "seconds": round(time.perf_counter() - started, 2)})
            for job in pending:
                predictions.append({"at": at, "job_id": job.job_id, "dike": dike.starts[job.job_id].at,
                                    "limits": limits.starts[job.job_id].at, "with_prior": job.job_id in runs})
        at += args.every * 3600
    simulator.run()
    for row in predictions:
        result = results.get(row["job_id"])
        row["actual"] = result.start if result is not None else None
    both = [r for r in predictions if r["actual"] is not None and r["dike"] is not None and r["limits"] is not None]
    summary = {
        "predictions": len(predictions), "compared": len(both),
        "dike": errors([(r["dike"], r["actual"]) for r in both]),
        "time limits": errors([(r["limits"], r["actual"]) for r in both]),
        "with_prior": {"dike": errors([(r["dike"], r["actual"]) for r in both if r["with_prior"]]),
                       "time limits": errors([(r["limits"], r["actual"]) for r in both if r["with_prior"]])},
        "dike_all": errors([(r["dike"], r["actual"]) for r in predictions
                            if r["actual"] is not None and r["dike"] is not None]),
        "dike_none": sum(1 for r in predictions if r["dike"] is None),
        "limits_none": sum(1 for r in predictions if r["limits"] is None),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join([Path(sys.executable).name, *sys.argv]), "dump": str(args.dump),
                                    "moments": moments, "predictions": predictions, "summary": summary}, indent=1))
    print(f"{len(moments)} moments, {summary['predictions']} pending jobs predicted, {summary['compared']} compared "
          f"(no prediction: dike {summary['dike_none']}, time limits {summary['limits_none']})")
    for label, figures in (("dike", summary["dike"]), ("time limits", summary["time limits"]),
                           ("dike, jobs with a prior", summary["with_prior"]["dike"]),
                           ("time limits, same jobs", summary["with_prior"]["time limits"]),
                           ("dike, every job it predicted", summary["dike_all"])):
        if figures["jobs"]:
            print(f"  {label:24} n={figures['jobs']:5}  mean |err| {figures['mean_abs_h']:6.2f} h  median "
                  f"{figures['median_abs_h']:6.2f} h  p90 {figures['p90_abs_h']:6.2f} h  mean signed {figures['mean_signed_h']:+6.2f} h")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
