"""A queue longer than what Slurm looks at, replayed as the live engine writes it (issue 28).

    .venv/bin/python bench/large_queue.py [--jobs 4000 --nodes 4 --load 3 --bf-max-job-test 100]

Generates a congested synthetic trace (`dike-slurm trace generate`, kept in RESULTS/traces) whose
slurm.conf sets SchedulerParameters=bf_max_job_test (a site's setting: the engine's head window is
twice it), and replays it under each policy three ways:

- instant: every decision written at once (the replay before issue 28: no window, no cap, writes
  free);
- engine before: what the engine wrote before issue 28: every pending job, 200 writes per cycle
  (the old `max_changes_per_cycle`);
- window + budget: the defaults now: the head window, the 20 s write budget at 1 ms a write, the
  10,000 cap.

Prints the table and writes RESULTS/large_queue.json; docs/results.md, "A large queue", has it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dike_slurm.config import Config
from dike_slurm.sim.kernel.replay import load_input, run_policy, sim_settings

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = {
    "instant": {"engine": {"head_window": 0, "max_changes_per_cycle": 10**9}, "replay": {"write_cost_s": 0.0}},
    "engine before": {"engine": {"head_window": 0, "max_changes_per_cycle": 200}},
    "window + budget": {},
}
POLICIES = ("multifactor", "dike")


def trace(folder: Path, jobs: int, nodes: int, load: float, depth: int) -> Path:
    """The congested trace, generated once; its slurm.conf given the site's bf_max_job_test."""
    out = folder / f"large-queue-{jobs}j-{nodes}n-load{load:g}-bf{depth}"
    if not (out / "sacct.txt").exists():
        subprocess.run([sys.executable, "-m", "dike_slurm", "trace", "generate", "--out", str(out), "--jobs", str(jobs),
                        "--nodes", str(nodes), "--load", str(load), "--seed", "1"], check=True, capture_output=True)
        conf = out / "slurm.conf"
        conf.write_text(conf.read_text() + f"SchedulerParameters=bf_max_job_test={depth}\n")
    return out


def replay(task: tuple[Path, str, str]) -> dict:
    folder, policy, variant = task
    config = Config.model_validate(VARIANTS[variant])
    replay_input = load_input(folder / "sacct.txt", folder / "slurm.conf", folder / "topology.conf")
    settings = sim_settings(config, replay_input.conf, preemptible=1.0)
    run = run_policy(policy, replay_input, config, settings)
    summary, stats = run.metrics.summary, run.stats
    return {"policy": policy, "variant": variant, "head_window": settings.head_window,
            "writes_per_cycle": settings.writes_per_cycle, "avg_jct_s": summary["avg_jct_s"],
            "p95_jct_s": summary["p95_jct_s"], "worst_user_slowdown": summary["worst_user_slowdown"],
            "gpu_utilization": summary["gpu_utilization"], "preemptions": summary["preemptions"],
            "engine_writes": stats.engine_writes, "writes_held": stats.writes_held,
            "cycles": stats.decide_calls, "most_pending": stats.most_pending}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--load", type=float, default=3.0)
    parser.add_argument("--bf-max-job-test", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    folder = trace(args.results / "traces", args.jobs, args.nodes, args.load, args.bf_max_job_test)
    tasks = [(folder, "fifo", "instant")] + [(folder, p, v) for p in POLICIES for v in VARIANTS]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        rows = list(pool.map(replay, tasks))
    fifo = rows[0]["avg_jct_s"]
    table = Table(title=f"{folder.name}: every job preemptible, penalty 1 (fifo/policy: avg JCT, above 1 is better)")
    for column in ("policy", "writes", "window", "writes/cycle", "fifo/policy", "p95 JCT h", "worst-user slowdown",
                   "GPU util", "preemptions", "writes landed", "held back", "longest queue"):
        table.add_column(column, justify="right")
    for row in rows:
        row["fifo_over_policy"] = round(fifo / row["avg_jct_s"], 3)
        table.add_row(row["policy"], row["variant"], str(row["head_window"] or "-"),
                      str(row["writes_per_cycle"] if row["writes_per_cycle"] and row["writes_per_cycle"] < 10**9 else "-"),
                      f"{row['fifo_over_policy']:.3f}", f"{row['p95_jct_s'] / 3600:.1f}",
                      f"{row['worst_user_slowdown']:.1f}", f"{row['gpu_utilization']:.3f}", str(row["preemptions"]),
                      f"{row['engine_writes']:,}", f"{row['writes_held']:,}", f"{row['most_pending']:,}")
    Console(width=180).print(table)
    out = args.results / "large_queue.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"trace": folder.name, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
