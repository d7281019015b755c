"""make fidelity: does the replay predict the real cluster? The lab against the simulator, on one workload.

    .venv/bin/python bench/fidelity.py [--jobs 200] [--runs fifo,fifo,dike,dike,dike+preempt,dike+preempt] [--out out/fidelity]

1. A workload is generated (`generate_workload`): jobs of 1-16 GPUs, single- and multi-node,
   from several users (root, dikeuser1, dikeuser2), arriving in bursts, each a `sleep` of
   5-20 s, most with a time limit (whole minutes, as Slurm keeps them) and some without.
2. Each run (a policy; the same policy twice measures the noise between two real runs) takes the
   lab lock (/tmp/dike-lab.lock), brings the lab up (`scripts/slurm-lab --slurm 22.05 up`),
   starts `dike-slurm run --apply` with the run's configuration (a cycle every 3 s), submits
   the jobs with sbatch at their arrival times, waits for them to finish, stops the engine, dumps
   sacct, and brings the lab down again (also when something failed): one lab session per
   run, so the lab is free for others between runs.
3. The dump of each run is replayed through the simulator with the same slurm.conf,
   topology.conf and configuration (replay interval = engine interval, comm penalty 0: a
   `sleep` does not slow down when spread).
4. Per job, the replay is compared with the run (and the second run of a policy with its first):
   Kendall's tau of the start order, start-time error (median, p95, and as a share of the mean
   wait), mean JCT, the number of leaf switches of every multi-node job, preemptions.
5. out/fidelity/: fidelity.json, table.md (the table of docs/replay.md's Fidelity section),
   fidelity.png (simulated against real start times; real run 2 against real run 1 in grey),
   fidelity.html (the table and the plot in the replay report's format, one self-contained page).

Known errors (the lab does not come up, sbatch refuses a job, a run does not finish in time)
end in one line and exit status 1; the lab is brought down whatever happened. `--replay-only`
re-replays the dumps an earlier run left in --out (no lab needed).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime
import fcntl
import json
import math
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dike_slurm.errors import DikeError
from dike_slurm.sim.eval.fidelity import JobOutcome, compare, real_outcomes, replay_outcomes

REPO = Path(__file__).resolve().parents[1]
LAB_SCRIPT = REPO / "scripts" / "slurm-lab"
LAB_VERSION = "22.05"
LOCK_FILE = Path("/tmp/dike-lab.lock")
USERS = ("root", "dikeuser1", "dikeuser2")
NAME_PREFIX = "fid-"
ENGINE_INTERVAL_S = 3.0
LOOKBACK_DAYS = 1  # the engine's accounting window, and so the replay's history (history.txt)
# each kind twice: the second run of a kind against its first is the noise floor
DEFAULT_RUNS = "fifo,fifo,dike,dike,dike+preempt,dike+preempt"
LAB_GPUS = 32
SACCT_FORMAT = (
    "JobID,JobIDRaw,JobName,User,Account,Partition,QOS,State,Submit,Eligible,Start,End,Elapsed,ElapsedRaw,"
    "Timelimit,NNodes,NCPUS,NodeList,ReqTRES,AllocTRES,Priority,Flags"
)

# (GPUs, nodes) of a job and how often it comes: mostly small single-node jobs, some whole
# nodes, some two-node jobs (16 GPUs = 2 x 8, 8 = 2 x 4, 4 = 2 x 2).
SHAPES: tuple[tuple[int, int, float], ...] = (
    (1, 1, 0.52), (2, 1, 0.16), (4, 1, 0.10), (8, 1, 0.07), (4, 2, 0.05), (8, 2, 0.05), (16, 2, 0.05),
)


class FidelityError(Exception):
    """A known failure: one line for the user, no traceback."""


# ---------------------------------------------------------------------------- the workload


@dataclass(frozen=True)
class WorkJob:
    """One job of the workload: when it arrives (seconds from the start), who, what, how long."""

    index: int
    arrival_s: float
    user: str
    gpus: int
    nodes: int
    duration_s: int
    time_limit_min: int | None  # None: no --time (the partition's limit: unlimited)

    @property
    def name(self) -> str:
        return f"{NAME_PREFIX}{self.index:04d}"

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes


def generate_workload(
    jobs: int = 200, seed: int = 14, load: float = 1.2, cluster_gpus: int = LAB_GPUS,
    min_duration_s: int = 5, max_duration_s: int = 20, burst_mean: float = 3.0, unlimited_share: float = 0.25,
) -> list[WorkJob]:
    """A bursty workload whose GPU-seconds offered over its arrival span are `load` x the cluster.

    Bursts arrive as a Poisson process; a burst holds a geometric number of jobs (mean
    `burst_mean`) arriving within a second. Durations are log-uniform in [min, max] seconds
    (two-node jobs at most half the maximum); a share `unlimited_share` of jobs has no time
    limit, the others ask for ceil(1.5 x duration) rounded up to whole minutes.
    """
    if jobs < 1 or load <= 0 or min_duration_s < 1 or max_duration_s < min_duration_s:
        raise ValueError("need jobs >= 1, load > 0 and 1 <= min_duration_s <= max_duration_s")
    rng = random.Random(seed)
    weights = [w for _, _, w in SHAPES]
    drawn = []
    for _ in range(jobs):
        gpus, nodes, _ = rng.choices(SHAPES, weights)[0]
        top = max_duration_s if nodes == 1 else max(min_duration_s, max_duration_s // 2)
        duration = round(math.exp(rng.uniform(math.log(min_duration_s), math.log(top))))
        limit = None if rng.random() < unlimited_share else max(1, math.ceil(1.5 * duration / 60))
        drawn.append((rng.choice(USERS), gpus, nodes, duration, limit))
    gpu_seconds = sum(gpus * duration for _, gpus, _, duration, _ in drawn)
    span = gpu_seconds / (cluster_gpus * load)
    burst_rate = jobs / burst_mean / span
    arrivals: list[float] = []
    now = 0.0
    while len(arrivals) < jobs:
        size = 1
        while rng.random() > 1.0 / burst_mean:
            size += 1
        for _ in range(min(size, jobs - len(arrivals))):
            arrivals.append(round(now + rng.uniform(0.0, 1.0), 2))
        now += rng.expovariate(burst_rate)
    arrivals.sort()
    arrivals = [a - arrivals[0] for a in arrivals]
    return [
        WorkJob(i, arrivals[i], user, gpus, nodes, duration, limit)
        for i, (user, gpus, nodes, duration, limit) in enumerate(drawn)
    ]


def sbatch_argv(job: WorkJob, *, preemptible: bool = False) -> list[str]:
    """The job's sbatch command (as root; a user's goes through runuser in front of it)."""
    argv = [
        "sbatch", "--parsable", "--output=/dev/null", "--chdir=/tmp", f"--job-name={job.name}",
        f"--nodes={job.nodes}", "--ntasks-per-node=1", f"--gres=gpu:{job.gpus_per_node}",
    ]
    if job.time_limit_min is not None:
        argv.append(f"--time={job.time_limit_min}")
    if preemptible:
        argv += ["--requeue", "--comment=dike:preemptible"]
    argv += ["--wrap", f"sleep {job.duration_s}"]
    return argv


def workload_index(name: str) -> int | None:
    """The workload index in a job name `fid-0042`; None for any other name (names are untrusted)."""
    if not name.startswith(NAME_PREFIX):
        return None
    digits = name[len(NAME_PREFIX):]
    return int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 6 else None


# ---------------------------------------------------------------------------- the runs


@dataclass(frozen=True)
class RunSpec:
    """One lab run: a label (fifo-1), the policy, whether jobs may be preempted."""

    label: str
    policy: str
    preempt: bool = False


def parse_runs(text: str) -> list[RunSpec]:
    """`fifo,fifo,dike,dike+preempt` -> labelled runs (the n-th run of a kind is `kind-n`)."""
    runs: list[RunSpec] = []
    seen: dict[str, int] = {}
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        policy, plus, extra = item.partition("+")
        if policy not in ("fifo", "dike") or (plus and extra != "preempt") or (policy == "fifo" and extra):
            raise FidelityError(f"--runs: unknown run {item!r} (known: fifo, dike, dike+preempt)")
        seen[item] = seen.get(item, 0) + 1
        runs.append(RunSpec(f"{item.replace('+', '-')}-{seen[item]}", policy, bool(extra)))
    if not runs:
        raise FidelityError("--runs names no run")
    return runs


def run_config(spec: RunSpec, run_dir: Path, slurm_conf: Path) -> str:
    """The configuration of one run: the live engine's and, in [replay], the simulator's.

    Thresholds and waits are scaled to a workload of seconds: Dike's levels at 36 and 180
    GPU-seconds, a 20 s consolidation wait. The fair-share term is on, as sites run it: the lab's
    accounting keeps the usage of earlier runs, and the run's replay starts warm from the same
    accounting (history.txt, the run's `lookback_days` before it: `run_on_lab`).
    The priority span is wide enough (1e8, `priority_mode = "over"`: the lab's QOS tiers would cut
    it to 886,999) that Slurm's own multifactor terms (at most ~13,000 on the lab) never reorder
    two jobs the policy ranked.
    """
    preemptible = '["gpu"]' if spec.preempt else "[]"
    return f"""# bench/fidelity.py: run {spec.label}
[engine]
policy = "{spec.policy}"
interval_s = {ENGINE_INTERVAL_S}
priority_span = 100000000
priority_mode = "over"
state_db = "{run_dir / 'state.sqlite'}"
max_changes_per_cycle = 2000
breaker_change_fraction = 1.0
max_requeues_per_cycle = 2
preemptible_partitions = {preemptible}
cycle_deadline_s = 20

[scope]
partitions = ["gpu"]

[slurm]
backend = "cli"
slurm_conf = "{slurm_conf}"
command_timeout_s = 30

[accounting]
usage_half_life_h = 24
lookback_days = {LOOKBACK_DAYS}

[replay]
interval_s = {ENGINE_INTERVAL_S}
comm_penalty = 0
restart_cost_s = 0
checkpoint_interval_s = 1000000000
preemptible = {1 if spec.preempt else 0}

[policies.dike]
levels = 3
thresholds_gpuh = [0.01, 0.05]
wait_weight = 1.0
wait_scale_s = 60
comm_gpus = 16
max_consolidation_wait_s = 20
steer_light_jobs = false
preemption = {'true' if spec.preempt else 'false'}
min_runtime_s = 5
"""


def _say(message: str) -> None:
    print(f"fidelity: {message}", flush=True)


LOCKING = True  # --no-lock: the caller holds the lab lock already


@contextmanager
def lab_session(env: dict[str, str], log: Path):
    """The lab lock, the lab up, and the lab down again at the end, whatever happened."""
    LOCK_FILE.touch(exist_ok=True)
    with LOCK_FILE.open("r") as lock:
        started = time.monotonic()
        try:
            if LOCKING:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say(f"the lab is in use: waiting for its lock ({LOCK_FILE})")
            fcntl.flock(lock, fcntl.LOCK_EX)
            _say(f"got the lab lock after {time.monotonic() - started:.0f} s")
        try:
            with log.open("a") as out:
                up = subprocess.run([str(LAB_SCRIPT), "--slurm", LAB_VERSION, "up"], env=env, stdout=out,
                                    stderr=subprocess.STDOUT, timeout=600)
            if up.returncode != 0:
                raise FidelityError(f"the lab did not come up (scripts/slurm-lab up exited {up.returncode}; see {log})")
            yield
        finally:
            with log.open("a") as out:
                subprocess.run([str(LAB_SCRIPT), "--slurm", LAB_VERSION, "down"], env=env, stdout=out,
                               stderr=subprocess.STDOUT, timeout=300)


def lab_exports(version: str, env: Mapping[str, str]) -> dict[str, str]:
    """The variables `scripts/slurm-lab --slurm VERSION env` exports (SLURM_CONF, DIKE_CONFIG, ...)."""
    out = subprocess.run([str(LAB_SCRIPT), "--slurm", version, "env"], capture_output=True, text=True,
                         check=False, env=dict(env))
    if out.returncode != 0:
        raise FidelityError(f"scripts/slurm-lab env failed: {out.stderr.strip() or out.returncode}")
    exports = {}
    for line in out.stdout.splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, value = words[1].split("=", 1)
            exports[key] = value
    return exports


def lab_env() -> dict[str, str]:
    """os.environ plus `scripts/slurm-lab env` (SLURM_CONF, ...), without the engine's DIKE_* settings."""
    # the engine's own DIKE_SECTION__KEY variables and DIKE_CONFIG would change the runs' configuration
    env = {k: v for k, v in os.environ.items() if not (k.startswith("DIKE_") and ("__" in k or k == "DIKE_CONFIG"))}
    env.update(lab_exports(LAB_VERSION, env))
    env.pop("DIKE_CONFIG", None)
    return env


def _run(argv: list[str], env: Mapping[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout, cwd="/tmp")


def _queue_ids(env: Mapping[str, str]) -> set[int]:
    out = _run(["squeue", "-h", "-o", "%A"], env)
    if out.returncode != 0:
        raise FidelityError(f"squeue failed: {out.stderr.strip()}")
    return {int(x) for x in out.stdout.split() if x.isdigit()}


def run_on_lab(spec: RunSpec, workload: Sequence[WorkJob], run_dir: Path, deadline_s: float) -> dict:
    """One run on the lab (inside its own lab session); writes the dump and returns the run's facts."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "lab.log"
    env = lab_env()
    slurm_conf = Path(env["SLURM_CONF"])
    with lab_session(env, log):
        shutil.copy(slurm_conf, run_dir / "slurm.conf")
        shutil.copy(slurm_conf.parent / "topology.conf", run_dir / "topology.conf")
        config = run_dir / "dike.toml"
        config.write_text(run_config(spec, run_dir, slurm_conf), encoding="utf-8")
        for leftover in ("state.sqlite", "state.sqlite-wal", "state.sqlite-shm", "state.sqlite.lock"):
            (run_dir / leftover).unlink(missing_ok=True)
        stale = _queue_ids(env)
        if stale:
            _run(["scancel", *map(str, sorted(stale))], env)
            _wait(lambda: not _queue_ids(env), 60, "the lab's queue to empty before the run")
        # What the engine's accounting holds as it starts (its lookback_days): the replay's warm start
        since = datetime.datetime.fromtimestamp(time.time() - LOOKBACK_DAYS * 86400).strftime("%Y-%m-%dT%H:%M:%S")
        history = _run(["sacct", "--allusers", "--allocations", "--duplicates", "--parsable2", "-S", since, "-E", "now",
                         f"--format={SACCT_FORMAT}"], env)
        if history.returncode != 0:
            raise FidelityError(f"sacct of the run's history failed: {history.stderr.strip().splitlines()[-1:]}")
        (run_dir / "history.txt").write_text(history.stdout, encoding="utf-8")
        engine_log = (run_dir / "engine.log").open("w")
        engine = subprocess.Popen(
            [str(Path(sys.executable).parent / "dike-slurm"), "run", "--apply", "--config", str(config)],
            env=env, stdout=engine_log, stderr=subprocess.STDOUT, cwd="/tmp",
        )
        ids: dict[int, int] = {}  # job id -> workload index
        try:
            time.sleep(1.0)  # the engine's first cycle (an empty queue) is under way
            if engine.poll() is not None:
                raise FidelityError(f"dike-slurm run exited {engine.returncode} at once (see {run_dir / 'engine.log'})")
            t0 = time.time()
            origin = time.monotonic()
            for job in workload:
                delay = origin + job.arrival_s - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                argv = sbatch_argv(job, preemptible=spec.preempt)
                if job.user != "root":
                    argv = ["runuser", "-u", job.user, "--", *argv]
                out = _run(argv, env)
                if out.returncode != 0:
                    raise FidelityError(f"sbatch of {job.name} failed: {out.stderr.strip().splitlines()[-1:]}")
                ids[int(out.stdout.strip().split(";")[0])] = job.index
            submitted = time.monotonic() - origin
            _say(f"{spec.label}: {len(ids)} jobs submitted in {submitted:.0f} s; waiting for them to finish")
            _wait(lambda: not (_queue_ids(env) & set(ids)), deadline_s, f"run {spec.label}'s jobs to finish",
                  on_timeout=lambda: _run(["scancel", *map(str, sorted(ids))], env))
            finished = time.monotonic() - origin
        finally:
            engine.send_signal(signal.SIGTERM)
            try:
                engine.wait(timeout=60)
            except subprocess.TimeoutExpired:
                engine.kill()
                engine.wait()
            engine_log.close()
        dump = run_dir / "sacct.txt"
        start = datetime.datetime.fromtimestamp(t0 - 120).strftime("%Y-%m-%dT%H:%M:%S")
        argv = ["sacct", "--allusers", "--allocations", "--duplicates", "--parsable2", "-S", start, "-E", "now",
                f"--format={SACCT_FORMAT}", "-j", ",".join(map(str, sorted(ids)))]

        def complete() -> str | None:
            out = _run(argv, env)
            if out.returncode != 0:
                return None
            rows = [line.split("|") for line in out.stdout.splitlines()[1:]]
            states = [r[7] for r in rows if len(r) > 7]
            ended = {r[1] for r in rows if len(r) > 11 and r[11] not in ("", "Unknown") and r[7] != "RUNNING"}
            done = len(ended) >= len(ids) and not any(s in ("RUNNING", "PENDING") for s in states)
            return out.stdout if done else None

        text = _wait(complete, 60, "sacct to record every job's end")
        dump.write_text(text, encoding="utf-8")
    (run_dir / "ids.json").write_text(json.dumps({str(k): v for k, v in sorted(ids.items())}) + "\n")
    _say(f"{spec.label}: done in {finished:.0f} s; sacct dump {dump}")
    return {"label": spec.label, "policy": spec.policy, "preempt": spec.preempt, "submit_span_s": round(submitted, 1),
            "run_s": round(finished, 1)}


def _wait(predicate, timeout: float, what: str, interval: float = 1.0, on_timeout=None):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            if on_timeout is not None:
                on_timeout()
            raise FidelityError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)



# ---------------------------------------------------------------------------- the report


def _fmt(value: float, digits: int = 1, pct: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{100 * value:+.{digits}f}%" if pct else f"{value:.{digits}f}"


TABLE_HEADERS = ("comparison", "jobs", "Kendall tau", "start error median / p95 (s)", "mean start error / mean wait",
                 "mean JCT ref / other (s)", "mean JCT error", "multi-node jobs on the same number of leaves",
                 "preemptions ref / other")


def table_cells(rows: Sequence[tuple[str, dict]]) -> list[list[str]]:
    """Each comparison's row as text, for the markdown table and the HTML page alike."""
    return [
        [label, str(m["jobs"]), _fmt(m["kendall_tau"], 3),
         f"{_fmt(m['start_error_median_s'])} / {_fmt(m['start_error_p95_s'])}",
         f"{_fmt(m['start_error_wait_share'], 2)} (wait {_fmt(m['mean_wait_s'])} s)",
         f"{_fmt(m['mean_jct_reference_s'])} / {_fmt(m['mean_jct_other_s'])}", _fmt(m["mean_jct_error"], pct=True),
         f"{m['same_leaves']}/{m['multi_node_jobs']} "
         f"({_fmt(m['same_leaves_share'] * 100 if m['multi_node_jobs'] else float('nan'), 0)}%)",
         f"{m['preemptions_reference']} / {m['preemptions_other']}"]
        for label, m in rows
    ]


def table(rows: Sequence[tuple[str, dict]]) -> str:
    """The markdown table of docs/replay.md's Fidelity section."""
    lines = ["| " + " | ".join(TABLE_HEADERS) + " |", "|" + "---|" * len(TABLE_HEADERS)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_cells(rows)]
    return "\n".join(lines) + "\n"


def html_page(rows: Sequence[tuple[str, dict]], png: Path, meta: Mapping) -> str:
    """fidelity.html: the table and the plot (embedded) in the replay report's format, one file
    that loads nothing from the network."""
    from dike_slurm.sim.eval.report import template_environment

    image = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")
    settings = [(key, str(meta[key])) for key in ("date", "commit", "lab", "runs", "jobs", "seed", "load",
                                                  "engine_interval_s") if key in meta]
    return template_environment().get_template("fidelity.html.j2").render(
        headers=TABLE_HEADERS, cells=table_cells(rows), image=image, settings=settings)


def plot(path: Path, panels: Sequence[tuple[str, dict[int, JobOutcome], dict[int, JobOutcome], dict[int, JobOutcome] | None]]) -> None:
    """Per policy: the replay's start against the real start of every job, and (grey) the second
    real run against the first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 5), squeeze=False)
    for ax, (title, real, sim, second) in zip(axes[0], panels):
        top = 0.0
        if second is not None:
            keys = sorted(set(real) & set(second))
            xs, ys = [real[k].start for k in keys], [second[k].start for k in keys]
            ax.scatter(xs, ys, s=9, color="0.65", label="real run 2 vs real run 1", zorder=1)
            top = max([top, *xs, *ys])
        keys = sorted(set(real) & set(sim))
        xs, ys = [real[k].start for k in keys], [sim[k].start for k in keys]
        multi = [real[k].nodes > 1 for k in keys]
        ax.scatter([x for x, m in zip(xs, multi) if not m], [y for y, m in zip(ys, multi) if not m], s=10,
                   color="#1f77b4", label="replay vs real run 1 (one node)", zorder=2)
        ax.scatter([x for x, m in zip(xs, multi) if m], [y for y, m in zip(ys, multi) if m], s=18, marker="^",
                   color="#d62728", label="replay vs real run 1 (two nodes)", zorder=3)
        top = max([top, *xs, *ys]) * 1.03
        ax.plot([0, top], [0, top], color="black", linewidth=0.8, linestyle="--", zorder=0)
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_title(title)
        ax.set_xlabel("real start (s after the first submission)")
        ax.set_ylabel("replayed (or second real) start (s)")
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def analyse(out: Path, runs: Sequence[RunSpec], meta: dict) -> dict:
    """Replay every run's dump and compare; write fidelity.json, table.md, fidelity.png and fidelity.html."""
    document: dict = {"meta": meta, "runs": {}, "comparisons": {}}
    real: dict[str, dict[int, JobOutcome]] = {}
    sim: dict[str, dict[int, JobOutcome]] = {}
    for spec in runs:
        run_dir = out / spec.label
        outcomes, origin, index_of = real_outcomes(run_dir, workload_index)
        replayed, stats = replay_outcomes(run_dir, spec.policy, origin, index_of)
        real[spec.label], sim[spec.label] = outcomes, replayed
        document["runs"][spec.label] = {"policy": spec.policy, "preempt": spec.preempt, "jobs": len(outcomes),
                                        "replay": stats}
    rows: list[tuple[str, dict]] = []
    kinds: dict[str, list[RunSpec]] = {}
    for spec in runs:
        kinds.setdefault(spec.label.rsplit("-", 1)[0], []).append(spec)
    panels = []
    for kind, specs in kinds.items():
        first = specs[0].label
        for spec in specs:
            label = f"{kind}: replay vs lab run {spec.label.rsplit('-', 1)[1]}"
            rows.append((label, compare(real[spec.label], sim[spec.label])))
        for spec in specs[1:]:
            label = f"{kind}: lab run {spec.label.rsplit('-', 1)[1]} vs lab run 1 (noise)"
            rows.append((label, compare(real[first], real[spec.label])))
        panels.append((kind, real[first], sim[first], real[specs[1].label] if len(specs) > 1 else None))
    document["comparisons"] = {label: metrics for label, metrics in rows}
    (out / "fidelity.json").write_text(json.dumps(document, indent=2, default=_json_default) + "\n", encoding="utf-8")
    (out / "table.md").write_text(table(rows), encoding="utf-8")
    plot(out / "fidelity.png", panels)
    (out / "fidelity.html").write_text(html_page(rows, out / "fidelity.png", meta), encoding="utf-8")
    jobs = {label: {str(k): dataclasses.asdict(v) for k, v in sorted(outcomes.items())} for label, outcomes in real.items()}
    replays = {label: {str(k): dataclasses.asdict(v) for k, v in sorted(outcomes.items())} for label, outcomes in sim.items()}
    (out / "jobs.json").write_text(json.dumps({"real": jobs, "replay": replays}) + "\n", encoding="utf-8")
    return document


def _json_default(value):
    raise TypeError(f"not JSON: {value!r}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200, help="jobs in the workload")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--load", type=float, default=1.2, help="offered GPU load over the arrival span")
    parser.add_argument("--runs", default=DEFAULT_RUNS, help="lab runs, e.g. fifo,fifo,dike,dike+preempt")
    parser.add_argument("--out", type=Path, default=REPO / "out" / "fidelity")
    parser.add_argument("--run-deadline", type=float, default=480.0, help="seconds a run may take after its last submission")
    parser.add_argument("--replay-only", action="store_true", help="compare the dumps already in --out")
    parser.add_argument("--no-lock", action="store_true", help=f"the caller holds the lab lock ({LOCK_FILE})")
    args = parser.parse_args(argv)
    global LOCKING
    LOCKING = not args.no_lock
    signal.signal(signal.SIGTERM, _interrupted)  # the lab still goes down (lab_session's finally)
    try:
        runs = parse_runs(args.runs)
        out: Path = args.out.resolve()
        out.mkdir(parents=True, exist_ok=True)
        workload = generate_workload(args.jobs, args.seed, args.load)
        meta = {"jobs": args.jobs, "seed": args.seed, "load": args.load, "runs": args.runs,
                "engine_interval_s": ENGINE_INTERVAL_S, "lab": LAB_VERSION, "commit": _commit(),
                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
        if not args.replay_only:
            if os.geteuid() != 0:
                raise FidelityError("the lab needs root (scripts/slurm-lab up): run make fidelity as root")
            (out / "workload.json").write_text(json.dumps([dataclasses.asdict(j) for j in workload], indent=0) + "\n")
            span = workload[-1].arrival_s
            _say(f"workload: {len(workload)} jobs over {span:.0f} s, {sum(j.gpus * j.duration_s for j in workload)} "
                 f"GPU-seconds; runs {', '.join(r.label for r in runs)}")
            meta["lab_runs"] = [run_on_lab(spec, workload, out / spec.label, args.run_deadline) for spec in runs]
        elif (out / "fidelity.json").exists():
            meta["lab_runs"] = json.loads((out / "fidelity.json").read_text()).get("meta", {}).get("lab_runs", [])
        document = analyse(out, runs, meta)
    except (FidelityError, DikeError) as exc:
        print(f"fidelity: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a run folder or dump that is not there (--replay-only), a full disk
        print(f"fidelity: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fidelity: interrupted", file=sys.stderr)
        return 130
    print((out / "table.md").read_text(), end="")
    _say(f"wrote {out / 'fidelity.json'}, {out / 'table.md'}, {out / 'fidelity.png'}, {out / 'fidelity.html'}")
    return 0 if document["comparisons"] else 1


def _interrupted(signum, frame) -> None:  # noqa: ANN001 - a signal handler
    raise KeyboardInterrupt


def _commit() -> str:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
