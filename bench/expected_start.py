"""The expected start's error on the real lab, against `squeue --start` on the same jobs (issue 54, item 3).

Needs the lab up (`scripts/slurm-lab up`) and root, and the lab to itself while it runs: a lab test
cancels every job, so each phase waits until no job but its own has been in the queue for 20 s, and a
round that sees another job in the queue, or loses one of its own, is run again.

1. History: `--history` runs of each named kind of job (sbatch --wrap 'sleep S' as `--user`), each
   run time drawn within +-20% of its kind's median; they finish, and sacct holds them (runs another
   user's test cancelled are run again).
2. Each of `--rounds` rounds submits `--jobs` jobs drawn from the kinds (two kinds have no history:
   the prior predicts them from the user's coarser groups), each run time again within +-20% of its
   median and each time limit as its kind asks (an over-estimate, as users give them). Once
   Slurm's backfill has planned them, at t0, it records `squeue --start` and `dike-slurm queue
   --json` (the expected starts); when every job has ended, the actual starts from sacct.
3. It prints, for the jobs pending at t0 that both predicted, the mean, median, p90 and largest
   absolute error (predicted - actual start) of each, and writes every job's figures to `--out`.

The engine reads accounting from the bench's start only (DIKE_ACCOUNTING__SINCE), with its own state
file, and its prior in force once the history holds `min_history_jobs` = the history's jobs. The
lab's engine configuration is otherwise the lab's own (dike, its thresholds).

Run: .venv/bin/python bench/expected_start.py (about 15 minutes); writes
out/expected-start/expected_start.json. Its jobs are cancelled when it stops. With `--cost` it only
times the forward simulation on invented queues of up to 1,000 nodes and 20,000 pending jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from fidelity import lab_exports  # noqa: E402

# name, GPUs, nodes, median run time (s), time limit (minutes), in the history
KINDS = (
    ("es-train", 8, 1, 40, 5, True),
    ("es-dist", 16, 2, 60, 10, True),
    ("es-eval", 4, 1, 20, 3, True),
    ("es-sweep", 2, 1, 45, 15, True),
    ("es-wide", 32, 4, 30, 5, True),
    ("es-new8", 8, 1, 35, 10, False),
    ("es-new4", 4, 1, 25, 10, False),
)
SPREAD = 0.2  # each run time within +-20% of its kind's median


class Disturbed(RuntimeError):
    """Someone else used the lab during a round."""


class Lab:
    def __init__(self, version: str, user: str, since: int, state_dir: Path, history_jobs: int) -> None:
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("DIKE_")},
                    **lab_exports(version, os.environ), "SLURM_TIME_FORMAT": "%s"}
        self.bin = Path(self.env.get("DIKE_LAB_BIN", "/usr/bin"))
        self.user = user
        self.mine: set[int] = set()  # every job the bench submitted
        self.chroot = version != "22.05"
        # the engine reads Slurm's times in Slurm's own format: SLURM_TIME_FORMAT (the bench's epoch
        # seconds) would leave it no finished job to learn from
        self.dike_env = {**{k: v for k, v in self.env.items() if k != "SLURM_TIME_FORMAT"},
                         "DIKE_ACCOUNTING__SINCE": str(since),
                         "DIKE_ENGINE__STATE_DB": str(state_dir / "state.sqlite"),
                         "DIKE_ENGINE__METRICS_FILE": str(state_dir / "metrics.prom"),
                         "DIKE_POLICIES__DIKE__MIN_HISTORY_JOBS": str(history_jobs)}

    def run(self, *argv: str, user: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 120) -> str:
        cmd, env = list(argv), dict(env or self.env)
        if user is not None and self.chroot:
            env["DIKE_LAB_USER"] = user
        elif user is not None:
            cmd = ["runuser", "-u", user, "--", *cmd]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd="/tmp")
        if proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
        return proc.stdout

    def slurm(self, name: str, *argv: str, user: str | None = None) -> str:
        return self.run(str(self.bin / name), *argv, user=user)

    def submit(self, name: str, gpus: int, nodes: int, run_s: int, limit_min: int) -> int:
        per_node = gpus // nodes
        out = self.slurm("sbatch", "--parsable", "--output=/dev/null", "--chdir=/tmp", f"--job-name={name}",
                         f"-N{nodes}", f"--gres=gpu:{per_node}", f"--time={limit_min}", "--wrap",
                         f"sleep {run_s}", user=self.user)
        job = int(out.strip().split(";", 1)[0])
        self.mine.add(job)
        return job

    def others(self) -> set[int]:
        """The jobs in the lab's queue that the bench did not submit (another user's test: its users too)."""
        return set(self.queue()) - self.mine

    def queue(self) -> dict[int, tuple[str, str]]:
        """Every job in the lab: id -> (user, state)."""
        rows = {}
        for line in self.slurm("squeue", "-h", "-o", "%A|%u|%T").splitlines():
            job, user, state = line.split("|")
            rows[int(job)] = (user, state)
        return rows

    def backfill_cycles(self) -> int:
        out = self.slurm("sdiag")
        section = out.split("Backfilling stats", 1)[1]
        return int(next(line for line in section.splitlines() if "Total cycles:" in line).split(":")[1])

    def squeue_start(self, jobs: list[int]) -> dict[int, float | None]:
        """`squeue --start` of the pending ones of `jobs`: id -> its START_TIME (None: N/A)."""
        out = self.slurm("squeue", "--start", "-h", "-o", "%i|%S", "-j", ",".join(map(str, jobs)))
        starts: dict[int, float | None] = {}
        for line in out.splitlines():
            job, start = line.split("|")
            starts[int(job)] = float(start) if start.strip().isdigit() else None
        return starts

    def dike(self, *args: str) -> dict[str, Any]:
        return json.loads(self.run(sys.executable, "-m", "dike_slurm", *args, "--json", env=self.dike_env))

    def accounting(self, jobs: list[int]) -> dict[int, tuple[float | None, float | None, str]]:
        out = self.slurm("sacct", "-X", "-n", "-P", "-o", "JobIDRaw,Start,End,State", "-j", ",".join(map(str, jobs)))
        rows = {}
        for line in out.splitlines():
            job, start, end, state = line.split("|")
            rows[int(job)] = (float(start) if start.isdigit() else None, float(end) if end.isdigit() else None, state)
        return rows

    def wait(self, predicate, timeout: float, what: str, interval: float = 1.0):
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:g} s: {what}")
            time.sleep(interval)


def run_time(rng: random.Random, median: int) -> int:
    return max(5, round(median * rng.uniform(1 - SPREAD, 1 + SPREAD)))


def history(lab: Lab, rng: random.Random, runs: int, attempts: int) -> list[dict[str, Any]]:
    """`runs` COMPLETED runs of each kind the history has; runs someone else cancelled are run again."""
    done: list[dict[str, Any]] = []
    for _ in range(attempts):
        wanted = [kind for kind in KINDS if kind[5] for _ in range(runs - sum(1 for j in done if j["name"] == kind[0]))]
        if not wanted:
            return done
        quiet(lab)
        jobs = []
        for name, gpus, nodes, median, limit, _ in wanted:
            seconds = run_time(rng, median)
            jobs.append({"job_id": lab.submit(name, gpus, nodes, seconds, limit), "name": name, "run_s": seconds})
        ids = [j["job_id"] for j in jobs]
        lab.wait(lambda: not set(ids) & set(lab.queue()), 1800, f"the history jobs {ids} to end")
        states = lab.wait(lambda: (lambda a: a if len(a) == len(ids) and all(r[1] is not None for r in a.values())
                                   else None)(lab.accounting(ids)), 120, "sacct to record every end")
        done += [j for j in jobs if states[j["job_id"]][2] == "COMPLETED"]
        lost = [j["job_id"] for j in jobs if states[j["job_id"]][2] != "COMPLETED"]
        if lost:
            print(f"history: jobs {lost} ended otherwise than COMPLETED (someone else's test?); run again",
                  file=sys.stderr)
    raise RuntimeError(f"the history was disturbed {attempts} times")


def quiet(lab: Lab, seconds: float = 20, timeout: float = 1800) -> None:
    """Wait until the lab's queue has held no job but the bench's for `seconds` in a row."""
    since = [time.monotonic()]

    def calm() -> bool:
        if lab.others():
            since[0] = time.monotonic()
        return time.monotonic() - since[0] >= seconds

    lab.wait(calm, timeout, f"{seconds:g} s without another job in the lab", interval=2.0)


def one_round(lab: Lab, rng: random.Random, count: int) -> dict[str, Any]:
    quiet(lab)
    drawn = [rng.choice(KINDS) for _ in range(count)]
    jobs = {}
    for name, gpus, nodes, median, limit, known in drawn:
        seconds = run_time(rng, median)
        job = lab.submit(name, gpus, nodes, seconds, limit)
        jobs[job] = {"job_id": job, "name": name, "gpus": gpus, "run_s": seconds, "limit_s": 60 * limit,
                     "history": known}
    ids = sorted(jobs)
    # squeue --start shows what Slurm's backfill planned: wait for two of its passes after the submissions
    passes = lab.backfill_cycles()
    lab.wait(lambda: lab.backfill_cycles() >= passes + 2, 60, "two backfill passes")
    slurm_at = time.time()
    slurm = lab.squeue_start(ids)
    dike = lab.dike("queue", "--user", lab.user)
    prior = lab.dike("status", "--user", lab.user)["service_prior"]  # as the expected starts used it, a moment later
    dike_rows = {row["job_id"]: row for row in dike["jobs"]}
    foreign = set()

    def ended() -> bool:
        queue = set(lab.queue())
        foreign.update(queue - lab.mine)
        return not set(ids) & queue

    lab.wait(ended, 3600, f"the round's jobs {ids} to end")
    actual = lab.wait(lambda: (lambda a: a if len(a) == len(ids) and all(r[1] is not None for r in a.values()) else None)(
        lab.accounting(ids)), 120, "sacct to record every end")
    lost = {job: state for job, (_, _, state) in actual.items() if state != "COMPLETED"}
    if foreign or lost:
        raise Disturbed(f"other jobs ran during the round ({sorted(foreign)}) or ours ended otherwise ({lost})")
    for job, entry in jobs.items():
        row = dike_rows.get(job, {})
        entry.update({
            "pending_at_t0": job in slurm and row.get("state") == "PENDING", "t0": slurm_at,
            "squeue_start": slurm.get(job), "dike_start": row.get("expected_start"),
            "dike_note": row.get("expected_start_note"), "actual_start": actual[job][0], "actual_end": actual[job][1],
        })
    return {"squeue_at": slurm_at, "dike_at": dike["expected_starts"]["at"] if dike["expected_starts"] else None,
            "method": dike["expected_starts"]["method"] if dike["expected_starts"] else None, "service_prior": prior,
            "jobs": list(jobs.values())}


def errors(jobs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    values = [job[key] - job["actual_start"] for job in jobs]
    absolute = sorted(abs(v) for v in values)
    if not absolute:
        return {"jobs": 0}
    return {"jobs": len(values), "mean_abs_s": round(statistics.fmean(absolute), 1),
            "median_abs_s": round(statistics.median(absolute), 1),
            "p90_abs_s": round(absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))], 1),
            "max_abs_s": round(absolute[-1], 1), "mean_signed_s": round(statistics.fmean(values), 1)}


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    pending = [job for r in rounds for job in r["jobs"] if job["pending_at_t0"]]
    both = [j for j in pending if j["squeue_start"] is not None and j["dike_start"] is not None]
    out = {
        "pending_at_t0": len(pending),
        "squeue_predicted": sum(1 for j in pending if j["squeue_start"] is not None),
        "dike_predicted": sum(1 for j in pending if j["dike_start"] is not None),
        "both": {"squeue --start": errors(both, "squeue_start"), "dike": errors(both, "dike_start")},
        "mean_wait_s": round(statistics.fmean(j["actual_start"] - j["t0"] for j in pending), 1) if pending else None,
    }
    for label, known in (("history", True), ("no_history", False)):
        part = [j for j in both if j["history"] is known]
        out[label] = {"squeue --start": errors(part, "squeue_start"), "dike": errors(part, "dike_start")}
    return out


def cost(sizes: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """The forward simulation's own time on invented queues (no lab): per (nodes, pending jobs), two
    4-GPU jobs running on each 8-GPU node with limits of 1, 4 or 24 hours, pending jobs of 1 to 32
    GPUs with such limits, each expected to run 5-90% of it, in random priority order."""
    from dike_slurm.domain.model import Job, JobState, Node, Topology
    from dike_slurm.sim.forward import ForwardInputs, expected_starts
    from dike_slurm.sim.kernel.records import SimSettings

    rows = []
    for node_count, pending_count in sizes:
        rng, at = random.Random(1), 1_800_000_000.0
        nodes = [Node(f"n{i}", 8, cpus=64, partitions=("gpu",)) for i in range(node_count)]
        jobs, expected = [], {}
        for i in range(node_count):
            for _ in range(2):
                limit = rng.choice((3600, 4 * 3600, 86400))
                jobs.append(Job(len(jobs) + 1, "u", JobState.RUNNING, at - 86400, gpus=4, cpus=8, partition="gpu",
                                start_time=at - rng.uniform(0, limit), time_limit_s=limit, nodes=(f"n{i}",)))
        for i in range(pending_count):
            gpus = rng.choice((1, 2, 4, 8, 16, 32))
            limit = rng.choice((3600, 4 * 3600, 86400))
            jobs.append(Job(len(jobs) + 1, f"u{i % 20}", JobState.PENDING, at - i, gpus=gpus,
                            num_nodes=max(1, gpus // 8), cpus=8 * max(1, gpus // 8), partition="gpu",
                            time_limit_s=limit, priority=rng.randint(1, 10 ** 6), slurm_reason="Priority"))
            expected[len(jobs)] = limit * rng.uniform(0.05, 0.9)
        started = time.perf_counter()
        forecast = expected_starts(ForwardInputs(at, jobs, nodes, Topology(), expected,
                                                 settings=SimSettings(batch_sched_delay_s=3)))
        rows.append({"nodes": node_count, "running": 2 * node_count, "pending": pending_count,
                     "simulated": forecast.simulated, "seconds": round(time.perf_counter() - started, 2)})
        print(f"{node_count:5} nodes, {2 * node_count:5} running, {pending_count:6} pending ({forecast.simulated} "
              f"simulated): {rows[-1]['seconds']:.2f} s")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=os.environ.get("DIKE_LAB_SLURM", "22.05"))
    parser.add_argument("--user", default="dikeuser1")
    parser.add_argument("--history", type=int, default=3, help="finished runs of each known kind before the rounds")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=18, help="jobs per round")
    parser.add_argument("--attempts", type=int, default=5, help="tries of a round (or the history) someone else disturbed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "out" / "expected-start" / "expected_start.json")
    parser.add_argument("--cost", action="store_true", help="time the forward simulation alone on invented "
                        "queues (no lab) and stop")
    args = parser.parse_args()
    if args.cost:
        cost([(20, 100), (50, 500), (200, 1000), (1000, 20000)])
        return
    rng = random.Random(args.seed)
    state_dir = Path(tempfile.mkdtemp(prefix="dike-expected-start-"))
    since = int(time.time())
    lab = Lab(args.version, args.user, since, state_dir, args.history * sum(1 for k in KINDS if k[5]))
    try:
        past = history(lab, rng, args.history, args.attempts)
        rounds = []
        for number in range(args.rounds):
            for attempt in range(args.attempts):
                try:
                    rounds.append(one_round(lab, rng, args.jobs))
                    break
                except Disturbed as exc:
                    print(f"round {number + 1}, attempt {attempt + 1}: {exc}; again", file=sys.stderr)
                    mine = sorted(set(lab.queue()) & lab.mine)
                    if mine:
                        lab.slurm("scancel", *map(str, mine))
            else:
                raise RuntimeError(f"round {number + 1} disturbed {args.attempts} times")
    finally:
        mine = sorted(set(lab.queue()) & lab.mine)
        if mine:
            lab.slurm("scancel", *map(str, mine))
    result = {"command": shlex.join([Path(sys.executable).name, *sys.argv]), "lab": args.version, "seed": args.seed,
              "since": since, "history": past, "rounds": rounds, "summary": summary(rounds)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print_summary(result["summary"])
    print(f"written: {args.out}")


def print_summary(figures: dict[str, Any]) -> None:
    print(f"jobs pending at t0: {figures['pending_at_t0']} (mean wait {figures['mean_wait_s']} s); predicted by "
          f"squeue --start: {figures['squeue_predicted']}, by dike: {figures['dike_predicted']}")
    for label in ("both", "history", "no_history"):
        print(f"{label}:")
        for who, e in figures[label].items():
            if e["jobs"]:
                print(f"  {who:15} n={e['jobs']:3}  mean |err| {e['mean_abs_s']:7.1f} s  median {e['median_abs_s']:7.1f} s"
                      f"  p90 {e['p90_abs_s']:7.1f} s  max {e['max_abs_s']:7.1f} s  mean signed {e['mean_signed_s']:+7.1f} s")


if __name__ == "__main__":
    main()
