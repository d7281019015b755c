"""The engine's writes at scale on the real lab (issue 29): a bench, not a test.

Needs the lab up (`scripts/slurm-lab --slurm 22.05 up`) and root. It submits one job holding
every GPU and `--pending` one-GPU jobs behind it (two users, half each), then measures, in one run:

1. each way of writing a SiteFactor to `--sample` pending jobs, `--runs` times: one `scontrol
   update` process per job (the engine before issue 29), and one `scontrol` fed a line per job
   (the engine now): wall, client CPU and slurmctld CPU (from /proc) per job;
2. the idle controller for `--watch` seconds: slurmctld's share of one core and a user's
   `squeue -u USER` latency (p50, p95);
3. the engine from an empty state: a dry run, then an applied cycle, until a dry run plans no
   write: cycles until Slurm holds the policy's values for every job, writes per cycle, the
   engine's CPU (its own and its children's: the real scontrol) per write;
4. the engine as a service (`run --apply`, a cycle a minute) for `--watch` seconds: writes per
   minute, slurmctld's share of one core, a user's squeue latency, against the idle figures;
5. the audit against Slurm: every SiteFactor and AdminComment the state store says it wrote is
   what Slurm holds.

Run: .venv/bin/python bench/lab_writes.py --pending 5000 (about 20 minutes); writes
out/lab-writes/lab_writes.json and prints the figures. The jobs it submitted are cancelled at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from fidelity import lab_exports  # noqa: E402
USERS = ("dikeuser1", "dikeuser2")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Lab:
    def __init__(self, version: str) -> None:
        self.version = version
        self.env = {**os.environ, **lab_exports(version, os.environ)}
        self.bin = Path(self.env.get("DIKE_LAB_BIN", "/usr/bin"))
        self.lab_dir = Path(self.env["SLURM_CONF"]).parents[1]
        self.chroot = version != "22.05"

    def command(self, name: str) -> str:
        return str(self.bin / name)

    def run(self, *argv: str, user: str | None = None, stdin: str | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
        cmd, env = list(argv), self.env
        if user is not None and self.chroot:
            env = {**env, "DIKE_LAB_USER": user}
        elif user is not None:
            cmd = ["runuser", "-u", user, "--", *cmd]
        proc = subprocess.run(cmd, env=env, input=stdin, capture_output=True, text=True, timeout=timeout, cwd="/tmp")
        if proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        return proc

    def ctld_cpu(self) -> float:
        """slurmctld's CPU seconds so far (utime + stime of /proc/PID/stat)."""
        pid = int((self.lab_dir / "run" / "slurmctld.pid").read_text().strip())
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def pending(self) -> list[int]:
        out = self.run(self.command("squeue"), "-h", "-t", "PD", "-o", "%i").stdout
        return sorted(int(word) for word in out.split() if word.isdigit())

    def site_factors(self) -> dict[int, int]:
        out = self.run(self.command("sprio"), "-h", "-o", "%i|%S").stdout
        return {int(a): int(b) for a, b in (line.split("|") for line in out.split()) if a.isdigit()}


def submit(lab: Lab, pending: int) -> int:
    """The blocker, then `pending` one-GPU jobs in two shell loops (one per user); the blocker's id."""
    blocker = int(lab.run(lab.command("sbatch"), "--parsable", "-N4", "--gres=gpu:8", "--wrap", "sleep 7200",
                          user=USERS[0]).stdout.strip().split(";")[0])
    deadline = time.monotonic() + 60
    while lab.run(lab.command("squeue"), "-h", "-j", str(blocker), "-o", "%T").stdout.strip() != "RUNNING":
        if time.monotonic() > deadline:
            raise RuntimeError("the blocker did not start")
        time.sleep(0.5)
    loop = (f"i=0; while [ $i -lt {{n}} ]; do {shlex.quote(lab.command('sbatch'))} -Q --gres=gpu:1 -t 10 "
            f"--wrap 'sleep 60' || exit 1; i=$((i + 1)); done")
    threads = []
    for index, user in enumerate(USERS):
        count = pending // 2 + (pending % 2 if index == 0 else 0)
        thread = threading.Thread(target=lab.run, args=("sh", "-c", loop.format(n=count)),
                                  kwargs={"user": user, "timeout": 3600})
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    deadline = time.monotonic() + 120
    while len(lab.site_factors()) < pending:  # sprio lists eligible pending jobs only
        if time.monotonic() > deadline:
            raise RuntimeError(f"sprio lists {len(lab.site_factors())} of {pending} pending jobs")
        time.sleep(1)
    return blocker


def per_job(wall: float, client: float, ctld: float, jobs: int) -> dict[str, float]:
    return {"wall_ms": 1000 * wall / jobs, "client_cpu_ms": 1000 * client / jobs, "slurmctld_cpu_ms": 1000 * ctld / jobs}


def methods(lab: Lab, jobs: list[int], runs: int) -> dict[str, list[dict[str, float]]]:
    """SiteFactor written to each of `jobs`, one process per job, then one fed scontrol: `runs` each."""
    scontrol = lab.command("scontrol")
    figures: dict[str, list[dict[str, float]]] = {"process per job": [], "one scontrol on stdin": []}
    for run in range(runs):
        for method in figures:
            values = {job: random.randrange(1, 10**6) for job in jobs}
            wall0, client0, ctld0 = time.perf_counter(), children_cpu(), lab.ctld_cpu()
            if method == "process per job":
                for job in jobs:
                    lab.run(scontrol, "update", f"JobId={job}", f"SiteFactor={values[job]}")
            else:
                lab.run(scontrol, stdin="".join(f"update JobId={j} SiteFactor={v}\n" for j, v in values.items()))
            figures[method].append(per_job(time.perf_counter() - wall0, children_cpu() - client0,
                                           lab.ctld_cpu() - ctld0, len(jobs)))
            held = lab.site_factors()
            wrong = [j for j in jobs if held.get(j) != values[j]]
            if wrong:
                raise RuntimeError(f"{method}, run {run + 1}: {len(wrong)} job(s) do not hold what was written")
    return figures


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def watch(lab: Lab, seconds: float, audit: Path | None = None) -> dict[str, float]:
    """slurmctld's share of one core and a user's `squeue -u USER` latency over `seconds`."""
    latencies = []
    start, ctld0 = time.monotonic(), lab.ctld_cpu()
    while time.monotonic() - start < seconds:
        t0 = time.perf_counter()
        lab.run(lab.command("squeue"), "-u", USERS[1], user=USERS[1])
        latencies.append(time.perf_counter() - t0)
        time.sleep(max(0.0, 1.0 - (time.perf_counter() - t0)))
    took = time.monotonic() - start
    return {
        "seconds": took,
        "slurmctld_core_percent": 100 * (lab.ctld_cpu() - ctld0) / took,
        "squeue_p50_ms": 1000 * statistics.median(latencies),
        "squeue_p95_ms": 1000 * percentile(latencies, 95),
        "squeue_samples": len(latencies),
    }


class Engine:
    """`python -m dike_slurm` on the lab with a private state file."""

    def __init__(self, lab: Lab, folder: Path, started: float, **settings: str) -> None:
        self.lab, self.started = lab, started
        self.state_db = folder / "state.sqlite"
        self.env = {**lab.env, "DIKE_ENGINE__STATE_DB": str(self.state_db),
                    "DIKE_ENGINE__METRICS_FILE": str(folder / "metrics.prom"), **settings}

    def environ(self) -> dict[str, str]:
        return {**self.env, "DIKE_ACCOUNTING__LOOKBACK_DAYS": repr((time.time() - self.started + 30) / 86400)}

    def cycle(self, apply: bool) -> dict[str, Any]:
        """One cycle (`run --once [--apply] --json`): its document, wall and CPU (with its children)."""
        argv = [sys.executable, "-m", "dike_slurm", "run", "--once", "--json", *(["--apply"] if apply else [])]
        wall0, cpu0 = time.perf_counter(), children_cpu()
        proc = subprocess.run(argv, env=self.environ(), capture_output=True, text=True, timeout=900, cwd="/tmp")
        wall, cpu = time.perf_counter() - wall0, children_cpu() - cpu0
        if proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv[2:])} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
        document = json.loads(proc.stdout)
        return {"document": document, "wall_s": wall, "cpu_s": cpu}

    def service(self) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "dike_slurm", "run", "--apply"], env=self.environ(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, cwd="/tmp")


def converge(engine: Engine, limit: int = 6) -> list[dict[str, Any]]:
    """Dry run, applied cycle, ... until a dry run plans no write (at most `limit` applied cycles)."""
    cycles = []
    for _ in range(limit):
        dry = engine.cycle(apply=False)
        planned = len(dry["document"]["writes"])
        if planned == 0:
            break
        applied = engine.cycle(apply=True)
        writes = applied["document"]["writes"]
        done = sum(1 for w in writes if w["result"] == "ok")
        failed = [w["result"] for w in writes if w["result"] not in ("ok", "not run")]
        cycles.append({
            "planned": planned, "written": done, "failed": len(failed), "first_failure": failed[0] if failed else None,
            "dry_run_cpu_s": dry["cpu_s"], "dry_run_wall_s": dry["wall_s"],
            "apply_cpu_s": applied["cpu_s"], "apply_wall_s": applied["wall_s"],
            "engine_cpu_ms_per_write": 1000 * (applied["cpu_s"] - dry["cpu_s"]) / done if done else None,
            "notes": applied["document"]["notes"],
        })
    return cycles


def counts(engine: Engine) -> tuple[int, int, int]:
    """Cycles recorded, writes that succeeded, and the cycles' errors, so far."""
    with sqlite3.connect(engine.state_db) as db:
        cycles, errors = db.execute("SELECT COUNT(*), COALESCE(SUM(errors), 0) FROM cycles").fetchone()
        writes = db.execute("SELECT COUNT(*) FROM audit WHERE action = 'update' AND ok = 1").fetchone()[0]
    return cycles, writes, errors


def audit_matches(lab: Lab, engine: Engine) -> dict[str, int]:
    """Every value the state store owns (wrote, and was told Slurm took) against what Slurm holds."""
    from dike_slurm.slurm.backends.cli import SlurmCliBackend
    from dike_slurm.config import SlurmSettings

    cluster = SlurmCliBackend(SlurmSettings(slurm_conf=Path(lab.env["SLURM_CONF"]), bin_dir=lab.bin),
                              environ=lab.env).read_cluster()
    db = sqlite3.connect(engine.state_db)
    counts = {"checked": 0, "differ": 0, "not_visible": 0, "unconfirmed": 0}
    for job_id, field, written in db.execute("SELECT job_id, field, written FROM owned"):
        held = {"SiteFactor": cluster.site_factors, "AdminComment": cluster.admin_comments}.get(field)
        if held is None:
            continue
        if job_id not in held:
            counts["not_visible"] += 1  # ended or started: sprio lists eligible pending jobs only
            continue
        counts["checked"] += 1
        if held[job_id] != json.loads(written):
            counts["differ"] += 1
    counts["unconfirmed"] = db.execute("SELECT COUNT(*) FROM audit WHERE message LIKE 'unconfirmed%'").fetchone()[0]
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slurm", default="22.05")
    parser.add_argument("--pending", type=int, default=5000)
    parser.add_argument("--sample", type=int, default=1000, help="jobs per run of the methods' bench")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--watch", type=float, default=300, help="seconds of the idle and of the service watch")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "lab-writes")
    args = parser.parse_args()
    lab = Lab(args.slurm)
    started = time.time()
    result: dict[str, Any] = {"slurm": args.slurm, "pending": args.pending, "command": shlex.join(sys.argv)}
    t0 = time.monotonic()
    blocker = submit(lab, args.pending)
    result["submit_s"] = time.monotonic() - t0
    print(f"submitted {args.pending} pending jobs behind job {blocker} in {result['submit_s']:.0f} s", flush=True)
    try:
        jobs = lab.pending()
        result["methods"] = methods(lab, random.Random(1).sample(jobs, min(args.sample, len(jobs))), args.runs)
        for method, runs in result["methods"].items():
            print(f"{method:>22}: " + "; ".join(
                f"wall {r['wall_ms']:.2f} ms, client CPU {r['client_cpu_ms']:.2f} ms, slurmctld CPU "
                f"{r['slurmctld_cpu_ms']:.2f} ms per job" for r in runs), flush=True)
        # the methods' values off again: the engine starts from Slurm's own
        lab.run(lab.command("scontrol"), stdin="".join(f"update JobId={j} SiteFactor=0\n" for j in jobs))
        result["idle"] = watch(lab, args.watch)
        print(f"idle controller: {result['idle']}", flush=True)
        with tempfile.TemporaryDirectory(prefix="dike-lab-writes-") as folder:
            engine = Engine(lab, Path(folder), started, DIKE_ENGINE__MAX_CHANGES_PER_CYCLE=str(4 * args.pending),
                            DIKE_ENGINE__INTERVAL_S="60")
            result["max_changes_per_cycle"] = 4 * args.pending
            result["cycles"] = converge(engine)
            for number, cycle in enumerate(result["cycles"], start=1):
                print(f"cycle {number}: {cycle}", flush=True)
            service = engine.service()
            try:
                before = counts(engine)
                result["service"] = watch(lab, args.watch)
                after = counts(engine)
                if service.poll() is not None:
                    raise RuntimeError(f"the service exited {service.returncode} during the watch")
            finally:
                service.terminate()
                service.wait(120)
            result["service"]["cycles"] = after[0] - before[0]
            result["service"]["cycle_errors"] = after[2] - before[2]
            result["service"]["writes_per_minute"] = (after[1] - before[1]) * 60 / result["service"]["seconds"]
            result["service"]["added_core_percent"] = (result["service"]["slurmctld_core_percent"]
                                                       - result["idle"]["slurmctld_core_percent"])
            print(f"service: {result['service']}", flush=True)
            result["audit"] = audit_matches(lab, engine)
            print(f"audit against Slurm: {result['audit']}", flush=True)
    finally:
        lab.run(lab.command("scancel"), "-u", USERS[0])
        lab.run(lab.command("scancel"), "-u", USERS[1])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lab_writes.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out / 'lab_writes.json'}")


if __name__ == "__main__":
    main()
