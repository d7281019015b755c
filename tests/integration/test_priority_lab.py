"""Slurm's own priority on the lab against dike_slurm.domain.slurm_priority (issue 24).

The replay orders its queue with `SlurmPriorityModel`: partition tier, then priority, then submit
time, then job id. These tests show that real Slurm (each lab version) agrees.

- `test_model_gives_sprios_priority_and_order`: pending jobs of both users, of QOS normal, low
  and urgent, of different sizes (GPUs, nodes, CPUs) and ages, some with a SiteFactor, one with
  a Nice. Every job's model priority equals sprio's (within 1, for truncation) and the model's
  order is sprio's order.
- `test_a_lower_qos_stays_below_under_tiers_and_overtakes_under_over`: normal jobs with the
  largest SiteFactor of `engine.priority_mode = "tiers"` stay below a low job with SiteFactor 0,
  and a low job stays below an urgent one. With the span of "over" (10^6) the normal jobs overtake
  the low one.

What the model is given, and from where:
- weights, PriorityMaxAge, partitions, node and CPU counts: the lab's slurm.conf
  (`parse_slurm_conf` + `ClusterConf.priority_model`); QOS priorities: `sacctmgr show qos -P`
  (`parse_qos_dump`). scripts/slurm-lab sets QOS normal 0, low 10, urgent 100 and
  PriorityWeightQOS=9000000 (tiers 0, 900000, 9000000; 13000 for every other factor together),
  PriorityMaxAge=00:30:00.
- each job's partition, QOS, nodes, CPUs, GPUs, eligible time and Nice: squeue, read by the
  engine's own backend (`SlurmLab.cluster()`). Slurm counts age from a job's accrue time, which
  is its eligible time here: without "limits" in AccountingStorageEnforce, Slurm sets accrue time
  to begin time (acct_policy_handle_accrue_time).
- CPUs of a whole-node (--exclusive) job: Slurm's job size counts the CPUs the scheduler would
  allocate (`job_ptr->total_cpus`, set when the scheduler or backfill first tries the job: every
  CPU of its nodes), while squeue shows a pending job's minimum (one per task). Before that first
  try the job size counts the minimum. The model is given whole nodes for that job, which was
  submitted 20 s before the pass the test compares (backfill runs every 5 s on the lab).
- SiteFactor: the value the test wrote (sprio's SITE column must show it).
- fair share: sprio's normalized fair-share column (`%f`, i.e. FAIRSHARE / PriorityWeightFairshare).
  These tests pin the formula and the order, not Fair Tree; the unit tests cover
  `fairshare_factors`.
- the time: Slurm keeps each job's factors from its last computation (for every pending job
  at once each PriorityCalcPeriod, one minute on the lab, and for one job when it is submitted or
  updated). sprio prints those stored values, and its priority is their sum. The time of the
  computation comes from sprio's normalized age (`%a`, 7 decimals) and the job's eligible time:
  age = (t - eligible) / PriorityMaxAge, in whole seconds. For the order test, every job must
  give the same t, after the last write: one periodic pass computed them all. So the model's age
  term is checked, not copied from sprio.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest

pytestmark = pytest.mark.adapter

# the slurm_lab fixture (tests/integration/conftest.py); not imported: two conftest
# modules would clash under the one name "conftest"
SlurmLab = Any

SPRIO_FORMAT = "%i|%Y|%A|%F|%J|%Q|%T|%S|%N|%a|%f"
SPAN = 1_000_000  # engine.priority_span's default
CALC_PASS_TIMEOUT_S = 150  # PriorityCalcPeriod=1 (minute): a pass comes within 60 s


@dataclass(frozen=True)
class SprioRow:
    priority: int  # %Y
    age: int  # %A (weighted)
    fairshare: int  # %F
    job_size: int  # %J
    qos: int  # %Q
    tres: str  # %T, e.g. "gres/gpu=31"
    site: int  # %S
    nice: int  # %N
    age_norm: float  # %a
    fairshare_norm: float  # %f


def sprio(lab: SlurmLab) -> dict[int, SprioRow]:
    """Every eligible pending job in sprio."""
    rows = {}
    for line in lab.run("sprio", "-h", "-o", SPRIO_FORMAT).stdout.splitlines():
        if not line.strip():
            continue
        f = [x.strip() for x in line.split("|")]
        rows[int(f[0])] = SprioRow(int(f[1]), int(f[2]), int(f[3]), int(f[4]), int(f[5]), f[6], int(f[7]),
                                   int(f[8]), float(f[9]), float(f[10]))
    return rows


def lab_model(lab: SlurmLab) -> Any:
    """SlurmPriorityModel of the lab: its slurm.conf and its QOS table."""
    from dike_slurm.domain.slurm_priority import parse_qos_dump
    from dike_slurm.slurm.slurm_conf import parse_slurm_conf

    qos = parse_qos_dump(lab.run("sacctmgr", "show", "qos", "-P", "format=Name,Priority").stdout, "sacctmgr show qos")
    assert qos == {"normal": 0, "low": 10, "urgent": 100}, f"scripts/slurm-lab sets these QOS: {qos}"
    conf = parse_slurm_conf(lab.slurm_conf.read_text(), str(lab.slurm_conf))
    return conf.priority_model(qos, f"{lab.slurm_conf} + sacctmgr show qos")


def fill_cluster(lab: SlurmLab, user: str) -> list[int]:
    """One whole node (16 CPUs, 8 GPUs) per blocker: nothing else can start, every job stays
    pending and eligible (sprio lists it). The blockers' usage lowers `user`'s fair share."""
    blockers = [lab.sbatch("-w", node, "--exclusive", "--gres=gpu:8", "--wrap", "sleep 900", user=user)
                for node in ("n1", "n2", "n3", "n4")]
    lab.wait_for(lambda: all(lab.job_state(j) == "RUNNING" for j in blockers), 60, f"blockers {blockers} running")
    return blockers


def let_time_pass(lab: SlurmLab, seconds: float) -> None:
    """The jobs submitted next are `seconds` younger. This is the age difference under test,
    not a wait for some state."""
    end = time.monotonic() + seconds
    lab.wait_for(lambda: time.monotonic() >= end, seconds + 5, f"{seconds} s to pass")


def pending_jobs(lab: SlurmLab, ids: list[int]) -> dict[int, Any]:
    """The jobs as the engine's backend reads them (squeue), all pending."""
    jobs = {j.job_id: j for j in lab.cluster().jobs if j.job_id in ids}
    assert sorted(jobs) == sorted(ids)
    assert all(j.state.name == "PENDING" for j in jobs.values()), {j.job_id: j.state for j in jobs.values()}
    return jobs


def inputs(job: Any, row: SprioRow, site_factor: int, cpus: int | None = None) -> Any:
    from dike_slurm.domain.slurm_priority import PriorityInputs

    assert job.eligible_time is not None
    return PriorityInputs(partition=job.partition, qos=job.qos, nodes=job.num_nodes, cpus=cpus or job.cpus,
                          gpus=job.gpus,
                          eligible_since=job.eligible_time, fairshare=row.fairshare_norm,
                          site_factor=site_factor, nice=job.nice)


def computed_at(job: Any, row: SprioRow, max_age_s: int) -> int:
    """When Slurm computed the job's stored factors: eligible time + age (whole seconds)."""
    return int(job.eligible_time) + round(row.age_norm * max_age_s)


def table(title: str, jobs: dict[int, Any], rows: dict[int, SprioRow], model_priority: dict[int, int],
          labels: dict[int, str]) -> str:
    lines = [title, f"{'job':>5} {'label':<26} {'user':<9} {'qos':<6} N CPU GPU {'AGE':>4} {'FS':>5} {'JS':>4} "
                    f"{'QOS':>7} {'TRES':>14} {'SITE':>7} {'NICE':>5} {'sprio':>8} {'model':>8}"]
    for job_id in sorted(rows, key=lambda j: (-rows[j].priority, j)):
        job, row = jobs[job_id], rows[job_id]
        lines.append(f"{job_id:>5} {labels.get(job_id, ''):<26} {job.user:<9} {job.qos:<6} {job.num_nodes} "
                     f"{job.cpus:>3} {job.gpus:>3} {row.age:>4} {row.fairshare:>5} {row.job_size:>4} {row.qos:>7} "
                     f"{row.tres:>14} {row.site:>7} {row.nice:>5} {row.priority:>8} {model_priority[job_id]:>8}")
    return "\n".join(lines)


def test_model_gives_sprios_priority_and_order(slurm_lab: SlurmLab) -> None:
    lab = slurm_lab
    model = lab_model(lab)
    fill_cluster(lab, "dikeuser1")
    # (label, user, sbatch args); three waves about 10 s apart (5-6 points of age each, over
    # PriorityMaxAge=30 min), no two jobs alike in user, QOS, size and wave
    waves = [
        [("u1 normal 1 GPU", "dikeuser1", ["--gres=gpu:1"]),
         ("u2 low 6 CPUs 2 GPUs", "dikeuser2", ["--qos=low", "-n", "6", "--gres=gpu:2"]),
         ("u2 urgent 2 nodes 8 GPUs", "dikeuser2", ["--qos=urgent", "-N2", "--gres=gpu:4"]),
         ("u1 normal 1 node exclusive", "dikeuser1", ["--exclusive", "--gres=gpu:1"])],
        [("u1 low 2 nodes 5 CPUs", "dikeuser1", ["--qos=low", "-N2", "-n", "5"]),
         ("u2 normal 1 GPU +SF", "dikeuser2", ["--gres=gpu:1"]),
         ("u1 urgent 3 CPUs 2 GPUs", "dikeuser1", ["--qos=urgent", "--cpus-per-task=3", "--gres=gpu:2"])],
        [("u2 normal 2 nodes 16 GPUs +SF", "dikeuser2", ["-N2", "--gres=gpu:8"]),
         ("u1 normal 1 GPU +SF", "dikeuser1", ["--gres=gpu:1", "-n", "2"]),
         ("u2 low 3 GPUs, Nice", "dikeuser2", ["--qos=low", "--gres=gpu:3"])],
    ]
    labels: dict[int, str] = {}
    for number, wave in enumerate(waves):
        if number:
            let_time_pass(lab, 10)
        for label, user, args in wave:
            labels[lab.sbatch(*args, "--wrap", "sleep 30", user=user)] = label
    ids = sorted(labels)
    by_label = {label: job_id for job_id, label in labels.items()}
    # SiteFactors (as root, as the engine writes them): one small, one that lifts a normal job
    # over the low tier (more than the "tiers" span), one in between; a negative Nice on a low job
    site_factors = {by_label["u2 normal 1 GPU +SF"]: 40_000, by_label["u2 normal 2 nodes 16 GPUs +SF"]: 950_000,
                    by_label["u1 normal 1 GPU +SF"]: 5}
    for job_id, value in site_factors.items():
        lab.run("scontrol", "update", f"JobId={job_id}", f"SiteFactor={value}")
    lab.run("scontrol", "update", f"JobId={by_label['u2 low 3 GPUs, Nice']}", "Nice=-300")
    last_write = int(time.time())
    jobs = pending_jobs(lab, ids)
    assert jobs[by_label["u2 low 3 GPUs, Nice"]].nice == -300
    whole_node = by_label["u1 normal 1 node exclusive"]
    assert (jobs[whole_node].num_nodes, jobs[whole_node].cpus) == (1, 1)  # squeue: the minimum
    cpus = {whole_node: 16}  # what Slurm's job size counts once the scheduler tried the job

    def one_pass() -> tuple[int, dict[int, SprioRow], dict[int, int]] | None:
        """sprio and squeue's priorities, once one periodic pass after the last write computed
        every job (and sprio did not change while squeue was read)."""
        rows = sprio(lab)
        if sorted(rows) != ids or any(rows[j].site != site_factors.get(j, 0) for j in ids):
            return None
        times = {computed_at(jobs[j], rows[j], model.weights.max_age_s) for j in ids}
        if len(times) != 1 or min(times) < last_write or any(rows[j].age_norm == 0 for j in ids):
            return None
        squeue_priority = {j.job_id: j.priority for j in lab.cluster().jobs if j.job_id in rows}
        if sprio(lab) != rows:
            return None
        return times.pop(), rows, squeue_priority

    now, rows, squeue_priority = lab.wait_for(one_pass, CALC_PASS_TIMEOUT_S,
                                              "one priority pass over every job after the last write", interval=1)
    priority = {j: model.priority(inputs(jobs[j], rows[j], site_factors.get(j, 0), cpus.get(j)), now) for j in ids}
    report = table(f"Slurm {lab.version}, computed at {now}: sprio vs model", jobs, rows, priority, labels)
    print("\n" + report)
    for j in ids:
        assert rows[j].nice == jobs[j].nice, report
        assert abs(priority[j] - rows[j].priority) <= 1, f"job {j} ({labels[j]})\n{report}"
        assert abs(squeue_priority[j] - rows[j].priority) <= 1, f"job {j}: squeue {squeue_priority[j]}\n{report}"
    slurm_order = sorted(ids, key=lambda j: (-rows[j].priority, j))
    replay_order = sorted(ids, key=lambda j: (-model.tier(jobs[j].partition), -priority[j], jobs[j].submit_time, j))
    assert replay_order == slurm_order, report
    # the set is not degenerate: every QOS tier, the ages, the SiteFactors and the Nice showed
    assert {rows[j].qos for j in ids} == {0, 900_000, 9_000_000}, report
    assert len({rows[j].age for j in ids}) >= 3, report  # three waves (one may straddle a second)
    assert rows[by_label["u2 low 3 GPUs, Nice"]].nice == -300, report
    normal_over_low = by_label["u2 normal 2 nodes 16 GPUs +SF"]
    assert slurm_order.index(normal_over_low) < slurm_order.index(by_label["u1 low 2 nodes 5 CPUs"]), report


def test_a_lower_qos_stays_below_under_tiers_and_overtakes_under_over(slurm_lab: SlurmLab) -> None:
    from dike_slurm.domain.slurm_priority import effective_span

    lab = slurm_lab
    model = lab_model(lab)
    tiers_span = effective_span("tiers", SPAN, model)
    over_span = effective_span("over", SPAN, model)
    assert 1 < tiers_span < over_span == SPAN  # the lab's tiers leave Dike a real span, and less than "over"
    fill_cluster(lab, "dikeuser1")  # dikeuser1's fair share falls below dikeuser2's
    # Lower-QOS jobs with every other factor as high as the lab allows (old, large, the user with
    # the better fair share); each higher-QOS job as low (new, 1 GPU, the other user).
    labels: dict[int, str] = {}

    def submit(label: str, user: str, *args: str) -> int:
        job_id = lab.sbatch(*args, "--wrap", "sleep 30", user=user)
        labels[job_id] = label
        return job_id

    lower_normal = [submit("normal 4 nodes 32 GPUs", "dikeuser2", "-N4", "-n", "64", "--gres=gpu:8"),
                    submit("normal 2 nodes 16 GPUs", "dikeuser2", "-N2", "-n", "32", "--gres=gpu:8"),
                    submit("normal 1 GPU", "dikeuser1", "--gres=gpu:1")]
    lower_low = [submit("low 4 nodes 32 GPUs", "dikeuser2", "--qos=low", "-N4", "-n", "64", "--gres=gpu:8")]
    let_time_pass(lab, 5)
    higher_low = submit("low 1 GPU, SiteFactor 0", "dikeuser1", "--qos=low", "--gres=gpu:1")
    higher_urgent = submit("urgent 1 GPU, SiteFactor 0", "dikeuser1", "--qos=urgent", "--gres=gpu:1")
    ids = sorted(labels)
    normal_under_low = [(lower, higher_low) for lower in lower_normal]
    low_under_urgent = [(lower, higher_urgent) for lower in lower_low]

    def write_and_read(value: int, mode: str) -> tuple[dict[int, SprioRow], dict[int, int], str]:
        lowers = lower_normal + lower_low
        for job_id in lowers:
            lab.run("scontrol", "update", f"JobId={job_id}", f"SiteFactor={value}")
        wanted = {j: (value if j in lowers else 0) for j in ids}
        rows = lab.wait_for(lambda: (r := sprio(lab)) and sorted(r) == ids
                            and all(r[j].site == wanted[j] for j in ids) and r,
                            30, f"SiteFactor {value} in sprio")
        jobs = pending_jobs(lab, ids)
        # each job at the time Slurm computed it (the updated ones at their update)
        priority = {j: model.priority(inputs(jobs[j], rows[j], wanted[j]),
                                      computed_at(jobs[j], rows[j], model.weights.max_age_s)) for j in ids}
        report = table(f"Slurm {lab.version}, priority_mode {mode!r}: SiteFactor {value} on the lower-QOS jobs",
                       jobs, rows, priority, labels)
        print("\n" + report)
        for j in ids:
            assert abs(priority[j] - rows[j].priority) <= 1, f"job {j} ({labels[j]})\n{report}"
        return {j: rows[j] for j in ids}, priority, report

    rows, priority, report = write_and_read(tiers_span, "tiers")
    for lower, higher in normal_under_low + low_under_urgent:
        assert rows[lower].priority < rows[higher].priority, report
        assert priority[lower] < priority[higher], report

    # what "over" costs: a QOS step smaller than the span no longer holds (low over urgent, a step
    # of 8100000, still does)
    rows, priority, report = write_and_read(over_span, "over")
    for lower, higher in normal_under_low:
        assert rows[lower].priority > rows[higher].priority, report
        assert priority[lower] > priority[higher], report
    for lower, higher in low_under_urgent:
        assert rows[lower].priority < rows[higher].priority, report
        assert priority[lower] < priority[higher], report
