"""How fast the replay is: generated traces of several sizes on a 1,000-node cluster, per policy.

    .venv/bin/python bench/replay_scale.py                      # 10k and 100k jobs, five policies
    .venv/bin/python bench/replay_scale.py --sizes 100000 --policies fifo,dike --load 0.7
    .venv/bin/python bench/replay_scale.py --sizes 100000 --comm-penalty 1   # saturated: minutes

Each replay runs in a fresh process (one core) so that its peak memory is its own. Printed as a
table and written as JSON (bench/results/replay_scale.json by default). Figures: CPU seconds,
events and jobs per second, policy cycles evaluated and the time spent inside the policy's
`decide`, peak RSS, and the ratio to a bare event loop that only pushes and pops as many
events (the floor no simulator can beat).
"""

from __future__ import annotations

import argparse
import heapq
import json
import multiprocessing
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dike_slurm.config import Config
from dike_slurm.registry import default_registry
from dike_slurm.sim.replay import load_input, run_policy, sim_settings
from dike_slurm.sim.tracegen import ClusterSpec, WorkloadModel, generate_sample

RESULTS = Path(__file__).resolve().parent / "results"


def trace_folder(jobs: int, nodes: int, load: float, seed: int, root: Path) -> Path:
    """Generate (once) a trace of `jobs` jobs on `nodes` nodes (leaves of 20, fan-out 5)."""
    folder = root / f"trace-{jobs}-{nodes}-{load:g}-{seed}"
    if not (folder / "sacct.txt").is_file():
        cluster = ClusterSpec(nodes=nodes, nodes_per_leaf=20, switch_fanout=5)
        generate_sample(folder, jobs, cluster, replace(WorkloadModel(), n_users=200, target_load=load), seed)
    return folder


def _replay_in_child(folder: str, policy: str, interval: float | None, penalty: float | None, answer) -> None:
    """One replay in this (forked) process; sends its figures back."""
    started = time.process_time()
    replay_input = load_input(Path(folder) / "sacct.txt", Path(folder) / "slurm.conf", Path(folder) / "topology.conf")
    read_s = time.process_time() - started
    config = Config()
    settings = sim_settings(config, replay_input.conf, comm_penalty=penalty)
    if interval is not None:
        settings = replace(settings, interval_s=interval)
    policy_class = default_registry().get(policy)
    decide = policy_class.decide
    spent = [0.0]

    def timed_decide(self, snapshot, params, rng):
        begin = time.process_time()
        try:
            return decide(self, snapshot, params, rng)
        finally:
            spent[0] += time.process_time() - begin

    policy_class.decide = timed_decide
    run = run_policy(policy, replay_input, config, settings)
    stats = run.stats
    answer.send({
        "policy": policy,
        "jobs": run.metrics.summary["jobs"],
        "read_cpu_s": round(read_s, 2),
        "replay_cpu_s": round(run.cpu_s, 2),
        "replay_wall_s": round(run.wall_s, 2),
        "decide_cpu_s": round(spent[0], 2),
        "simulator_cpu_s": round(run.cpu_s - spent[0], 2),
        "events": stats.events,
        "events_per_s": round(stats.events / run.cpu_s),
        "jobs_per_s": round(run.metrics.summary["jobs"] / run.cpu_s),
        "decide_calls": stats.decide_calls,
        "cycles_due": stats.cycles,
        "main_passes": stats.passes,
        "backfill_passes": stats.backfill_passes,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "avg_jct_h": round(run.metrics.summary["avg_jct_s"] / 3600, 2),
        "gpu_utilization": run.metrics.summary["gpu_utilization"],
    })


def bare_event_loop(events: int) -> float:
    """CPU seconds to push and pop `events` (time, kind, sequence, payload) tuples through a heap."""
    started = time.process_time()
    heap: list = []
    pending = 0
    for sequence in range(events):
        heapq.heappush(heap, (float(sequence % 977) + sequence, 1, sequence, None))
        pending += 1
        if pending > 2000:
            heapq.heappop(heap)
            pending -= 1
    while heap:
        heapq.heappop(heap)
    return time.process_time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="jobs per trace, comma-separated")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--load", type=float, default=0.7, help="offered GPU load of the generated traces")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--policies", default="fifo,tiresias,dike,multifactor,srtf_oracle")
    parser.add_argument("--interval", type=float, default=None, help="policy cycle (default: the config's 60 s)")
    parser.add_argument(
        "--comm-penalty", type=float, default=0.0,
        help="0 (default) keeps the generated load at --load; the config's 1.0 slows spread jobs so much that "
             "the cluster saturates and the queue (and the replay time) grows without bound",
    )
    parser.add_argument("--traces", type=Path, default=RESULTS / "traces", help="where generated traces are kept")
    parser.add_argument("--out", type=Path, default=RESULTS / "replay_scale.json")
    args = parser.parse_args(argv)
    context = multiprocessing.get_context("fork")
    rows = []
    console = Console(width=200)
    for size in (int(s) for s in args.sizes.split(",")):
        folder = trace_folder(size, args.nodes, args.load, args.seed, args.traces)
        for policy in args.policies.split(","):
            receive, send = context.Pipe(duplex=False)
            child = context.Process(target=_replay_in_child, args=(str(folder), policy, args.interval, args.comm_penalty, send))
            child.start()
            row = receive.recv()
            child.join()
            row["trace_jobs"] = size
            row["floor_cpu_s"] = round(bare_event_loop(row["events"]), 3)
            row["ratio_to_floor"] = round(row["replay_cpu_s"] / max(row["floor_cpu_s"], 1e-9), 1)
            rows.append(row)
            console.print(f"{size} jobs, {policy}: {row['replay_cpu_s']} s CPU", highlight=False)
    table = Table(title=f"replay scale: {args.nodes} nodes, load {args.load:g}")
    columns = ["trace_jobs", "policy", "replay_cpu_s", "decide_cpu_s", "simulator_cpu_s", "decide_calls",
               "events_per_s", "jobs_per_s", "ratio_to_floor", "peak_rss_mb", "read_cpu_s", "avg_jct_h"]
    for column in columns:
        table.add_column(column.replace("_", " "), justify="right")
    for row in rows:
        table.add_row(*(str(row[c]) for c in columns))
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {"nodes": args.nodes, "load": args.load, "seed": args.seed, "interval_s": args.interval,
                "comm_penalty": args.comm_penalty, "python": sys.version.split()[0], "runs": rows}
    args.out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    console.print(f"written: {args.out}", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
