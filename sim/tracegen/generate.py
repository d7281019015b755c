"""Synthetic deep-learning workload generator: who submits what, when, and how it ends.

Installed as ``dike_slurm.sim.tracegen.generate``.  :func:`generate_jobs` samples the job
history of a multi-tenant GPU cluster (the model: ``sim/tracegen/workload_model.py``,
documented with the published statistics behind each shape in ``docs/workload.md``;
the draws of users, shapes and outcomes: ``sim/tracegen/workload_sampler.py``) on a
:class:`~dike_slurm.sim.tracegen.synthetic_cluster.ClusterSpec`; :func:`generate_sample`
writes it with ``sim/tracegen/sacct_writer.py`` (``sacct --parsable2`` text) and the cluster's
``slurm.conf`` and ``topology.conf`` with ``sim/tracegen/synthetic_cluster.py``.  The replay's
own reader (``dike_slurm.slurm.accounting``) reads the dumps back.

It is deterministic: the same arguments and seed give byte-identical output.
Generation is streaming (one submission at a time), so a million jobs need
bounded memory.  Command line: ``dike-slurm trace generate --out DIR``.
"""

from __future__ import annotations

import math
import random
from datetime import datetime
from pathlib import Path
from typing import Iterator

from dike_slurm.parsing.hostlists import compress_hostlist
from dike_slurm.sim.tracegen.sacct_writer import SacctRecord, tres_text, write_sacct_parsable2
from dike_slurm.sim.tracegen.synthetic_cluster import ClusterSpec, write_slurm_conf, write_topology_conf
from dike_slurm.sim.tracegen.workload_model import DAY_S, WorkloadModel
from dike_slurm.sim.tracegen.workload_sampler import SampledJob, Sampler, calibrate, make_users

__all__ = ["generate_jobs", "generate_sample"]

_EPOCH = datetime(1970, 1, 1)


def _parse_local_time(text: str) -> int:
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is not None:
        raise ValueError("start must be a naive local time such as 2026-01-05T00:00:00")
    return int((dt - _EPOCH).total_seconds())



def _rng(seed: int | str, stream: str) -> random.Random:
    # str seeds are hashed with SHA-512 by random.seed(): stable across runs
    # and independent of PYTHONHASHSEED
    return random.Random(f"dike-tracegen:{seed}:{stream}")


def generate_jobs(model: WorkloadModel, n_jobs: int, cluster: ClusterSpec, seed: int,
                  start: str = "2026-01-05T00:00:00") -> Iterator[SacctRecord]:
    """Stream the sacct records of ``n_jobs`` synthetic jobs.

    A job is one JobIDRaw; an array task is a job.  A requeued job yields two
    records (its ``REQUEUED`` run, then its final run) unless
    ``model.emit_requeue_duplicates`` is false.  Records come in JobIDRaw
    order, like sacct prints them.  ``start`` is the naive local time of the
    first possible submission.  Deterministic in all arguments.
    """
    if n_jobs < 0:
        raise ValueError("n_jobs must be >= 0")
    t0 = _parse_local_time(start)
    users = make_users(model, _rng(seed, "users"))
    sampler = Sampler(model, cluster, users)
    mean_gs = calibrate(model, sampler, _rng(seed, "calibrate"))
    sampler.hostile_count = 0
    rate = model.target_load * cluster.total_gpus / max(mean_gs, 1e-9)  # per second
    week_norm = (5.0 + 2.0 * model.weekend_factor) / 7.0
    max_mult = (1.0 + model.diurnal_amplitude) * max(1.0, model.weekend_factor) / week_norm
    lam_max = rate * max_mult
    amp = model.diurnal_amplitude
    peak = model.diurnal_peak_hour
    two_pi_24 = 2.0 * math.pi / 24.0

    rng = _rng(seed, "jobs")
    t = float(t0)
    next_id = model.first_job_id
    emitted = 0
    while emitted < n_jobs:
        # non-homogeneous Poisson arrivals by thinning
        t += rng.expovariate(lam_max)
        now = int(t)
        day, sod = divmod(now, DAY_S)
        mult = 1.0 + amp * math.cos(two_pi_24 * (sod / 3600.0 - peak))
        if (day + 3) % 7 >= 5:  # 1970-01-01 was a Thursday; Mon=0 .. Sun=6
            mult *= model.weekend_factor
        if rng.random() * max_mult > mult / week_norm:
            continue
        user, jobs, is_array = sampler.submission(rng)
        jobs = jobs[: n_jobs - emitted]
        submit = now
        eligible = submit
        if rng.random() < model.deferred_eligible_frac:
            eligible = submit + int(rng.lognormvariate(math.log(1800.0), 1.2))
        priority = rng.randint(1000, 20000)
        base_id = next_id
        next_id += len(jobs)
        if is_array:
            n = len(jobs)
            # the array's own id stays with its last task; the others get the
            # ids after it (see docs/workload.md)
            order = [n - 1] + list(range(n - 1))
            for raw_offset, task in enumerate(order):
                yield from _job_records(rng, model, cluster, sampler, jobs[task],
                                        f"{base_id}_{task}", base_id + raw_offset,
                                        submit, eligible, priority)
        else:
            yield from _job_records(rng, model, cluster, sampler, jobs[0], str(base_id),
                                    base_id, submit, eligible, priority)
        emitted += len(jobs)


def _place(rng: random.Random, model: WorkloadModel, cluster: ClusterSpec, nnodes: int) -> str:
    if nnodes == 1:
        return cluster.node_name(rng.randrange(cluster.nodes))
    if rng.random() < model.fragmented_placement_frac:
        idx = sorted(rng.sample(range(cluster.nodes), nnodes))
    else:
        first = rng.randrange(cluster.nodes - nnodes + 1)
        idx = range(first, first + nnodes)
    return compress_hostlist([cluster.node_name(i) for i in idx])


def _wait(rng: random.Random, model: WorkloadModel, gpus: int) -> int:
    if rng.random() < model.wait_zero_frac:
        return 0
    w = rng.lognormvariate(math.log(model.wait_median_s), model.wait_sigma)
    return int(min(w * math.sqrt(max(gpus, 1)), 3 * DAY_S)) + 1


def _sched_flag(rng: random.Random, model: WorkloadModel, wait: int) -> str:
    if wait == 0:
        return "SchedSubmit"
    return "SchedBackfill" if rng.random() < model.backfill_frac else "SchedMain"


def _job_records(rng: random.Random, model: WorkloadModel, cluster: ClusterSpec,
                 sampler: Sampler, job: SampledJob, job_id: str, raw: int, submit: int,
                 eligible: int, priority: int) -> Iterator[SacctRecord]:
    user = job.user
    req = tres_text(job.cpus, job.mem_mb, job.nnodes, job.gpus,
                cluster.gpu_type if job.typed_request else None)
    head = (job_id, raw, job.name, user.name, user.account, cluster.partition, model.qos)
    limit = job.timelimit_min

    if job.fate == "PENDING_CANCEL":
        # cancelled while pending: slurmdbd has no start time and reports
        # Start = End (the cancel time), Elapsed 0, no allocation
        end = eligible + int(rng.lognormvariate(math.log(1200.0), 1.3)) + 1
        uid = 0 if rng.random() < model.admin_cancel_frac else user.uid
        yield SacctRecord(*head, f"CANCELLED by {uid}", submit, eligible, end, end, 0,
                          limit, job.nnodes, 0, "None assigned", req, "", priority, "",
                          job.gpus)
        return

    alloc = tres_text(job.cpus, job.mem_mb, job.nnodes, job.gpus,
                  cluster.gpu_type if job.gpus else None)
    wait = _wait(rng, model, job.gpus)
    start = eligible + wait
    flags = _sched_flag(rng, model, wait)

    if job.fate == "REQUEUED":
        end1 = start + job.elapsed
        nodes1 = _place(rng, model, cluster, job.nnodes)
        if model.emit_requeue_duplicates:
            yield SacctRecord(*head, "REQUEUED", submit, eligible, start, end1, job.elapsed,
                              limit, job.nnodes, job.cpus, nodes1, req, alloc, priority,
                              flags, job.gpus)
        # the requeued job gets a new submit time once its epilog is done, and a
        # BeginTime hold of about CredExpire + 1 s before it is eligible again
        submit = end1 + rng.randint(1, 5)
        eligible = end1 + 121
        fate, elapsed, _ = sampler.outcome(rng, job.runtime, limit, can_requeue=False)
        wait = _wait(rng, model, job.gpus)
        start = eligible + wait
        flags = _sched_flag(rng, model, wait)
    else:
        fate, elapsed = job.fate, job.elapsed

    if fate == "CANCELLED":
        uid = 0 if rng.random() < model.admin_cancel_frac else user.uid
        state = f"CANCELLED by {uid}"
    else:
        state = fate
    yield SacctRecord(*head, state, submit, eligible, start, start + elapsed, elapsed,
                      limit, job.nnodes, job.cpus, _place(rng, model, cluster, job.nnodes),
                      req, alloc, priority, flags, job.gpus)


def generate_sample(out_dir: str | Path, n_jobs: int, cluster: ClusterSpec,
                    model: WorkloadModel, seed: int,
                    start: str = "2026-01-05T00:00:00") -> None:
    """Write ``sacct.txt``, ``slurm.conf`` and ``topology.conf`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sacct.txt", "w", encoding="utf-8", newline="\n") as fh:
        write_sacct_parsable2(generate_jobs(model, n_jobs, cluster, seed, start), fh)
    with open(out / "slurm.conf", "w", encoding="utf-8", newline="\n") as fh:
        write_slurm_conf(cluster, fh)
    with open(out / "topology.conf", "w", encoding="utf-8", newline="\n") as fh:
        write_topology_conf(cluster, fh)
