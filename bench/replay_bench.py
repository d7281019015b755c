"""Replay speed per trace size and policy, against a bare heapq event loop, with peak memory.

    .venv/bin/python bench/replay_bench.py --sizes 10000,30000 --policies fifo,tiresias,dike

Each replay runs in a fresh interpreter (`--child`), so its peak RSS (ru_maxrss) is its own:
nothing of the parent (the engine-cycle benchmark's 50 MB of JSON, other replays) is counted.
The child swaps the simulator's `heapq` for a recorder that logs every push (time, round, kind) and
every pop to a file; after the replay (and its peak memory reading) the child pushes and pops
exactly that sequence through heapq with tuples of the same shape: the floor, an event loop
that does nothing per event, measured in the same process so that replays can run side by side.
Recording costs one Python call per heap operation (well under 1% of a replay).

Figures per run (CPU seconds): read (sacct dump, slurm.conf, topology), replay (the simulator,
reading excluded), decide (inside the policy), events/s and jobs/s of the replay, floor and
ratio replay/floor, peak RSS (VmHWM), the mean and largest number of active jobs a policy cycle saw.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from array import array
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RESULTS = HERE / "results"
NODES, LOAD, SEED = 1000, 0.7, 11
_FLUSH = 1 << 18


class RecordingHeapq:
    """Stands in for the heapq module inside the simulator: the same calls, logged to files."""

    def __init__(self, folder: Path) -> None:
        self.times = array("d")
        self.rounds = array("q")  # the simulator's heap entries are (time, round, kind, sequence, job)
        self.kinds = array("b")  # event kind for a push, -1 for a pop
        self._times_file = (folder / "times.bin").open("wb")
        self._rounds_file = (folder / "rounds.bin").open("wb")
        self._kinds_file = (folder / "kinds.bin").open("wb")

    def heappush(self, heap: list, item: tuple) -> None:
        self.times.append(item[0])
        self.rounds.append(item[1])
        self.kinds.append(item[2])
        heapq.heappush(heap, item)
        if len(self.kinds) >= _FLUSH:
            self.flush()

    def heappop(self, heap: list) -> tuple:
        self.kinds.append(-1)
        if len(self.kinds) >= _FLUSH:
            self.flush()
        return heapq.heappop(heap)

    def flush(self) -> None:
        self.times.tofile(self._times_file)
        self.rounds.tofile(self._rounds_file)
        self.kinds.tofile(self._kinds_file)
        del self.times[:]
        del self.rounds[:]
        del self.kinds[:]

    def close(self) -> None:
        self.flush()
        self._times_file.close()
        self._rounds_file.close()
        self._kinds_file.close()


def floor_seconds(folder: Path) -> tuple[float, int]:
    """CPU seconds to push and pop the recorded events through heapq (and how many were popped)."""
    times = array("d")
    rounds = array("q")
    kinds = array("b")
    for values, name in ((times, "times"), (rounds, "rounds"), (kinds, "kinds")):
        with (folder / f"{name}.bin").open("rb") as handle:
            values.frombytes(handle.read())
    time_list, round_list, kind_list = times.tolist(), rounds.tolist(), kinds.tolist()
    del times, rounds, kinds
    push, pop = heapq.heappush, heapq.heappop
    heap: list = []
    sequence = 0
    popped = 0
    started = time.process_time()
    for kind in kind_list:
        if kind < 0:
            pop(heap)
            popped += 1
        else:
            push(heap, (time_list[sequence], round_list[sequence], kind, sequence, None))
            sequence += 1
    return time.process_time() - started, popped


def peak_rss_kb() -> int:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, it starts afresh at exec,
    while ru_maxrss of a forked child starts at its parent's size)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def child(trace: Path, policy: str, record: Path | None, result: Path, comm_penalty: float | None = None) -> None:
    """One replay in this process; its figures go to `result` as JSON (penalty None: the config's)."""
    baseline_kb = peak_rss_kb()
    from dike_slurm.config import Config
    from dike_slurm.registry import default_registry
    from dike_slurm.sim.kernel import simulator as simulator_module
    from dike_slurm.sim.kernel.replay import load_input, run_policy, sim_settings

    imported_kb = peak_rss_kb()
    started = time.process_time()
    replay_input = load_input(trace / "sacct.txt", trace / "slurm.conf", trace / "topology.conf")
    read_s = time.process_time() - started
    read_kb = peak_rss_kb()
    config = Config()
    settings = sim_settings(config, replay_input.conf, comm_penalty=comm_penalty)
    policy_class = default_registry().get(policy)
    decide = policy_class.decide
    seen = {"decide_s": 0.0, "jobs": 0, "largest": 0}

    def timed_decide(self, snapshot, params, rng):
        begin = time.process_time()
        try:
            return decide(self, snapshot, params, rng)
        finally:
            seen["decide_s"] += time.process_time() - begin
            seen["jobs"] += len(snapshot.jobs)
            seen["largest"] = max(seen["largest"], len(snapshot.jobs))

    policy_class.decide = timed_decide
    recorder = None
    if record is not None:
        recorder = RecordingHeapq(record)
        simulator_module.heapq = recorder
    progress_file = result.with_name("progress.json")
    replay_started = time.process_time()

    def progress(finished: int) -> None:
        if finished % 10_000 == 0:
            progress_file.write_text(json.dumps({
                "jobs_finished": finished, "replay_s": time.process_time() - replay_started,
                "decide_s": seen["decide_s"], "peak_rss_mb": peak_rss_kb() / 1024.0,
                "jobs_replayed": len(replay_input.trace.jobs), "read_s": read_s,
            }))

    try:
        run = run_policy(policy, replay_input, config, settings, on_progress=progress)
    finally:
        if recorder is not None:
            recorder.close()
    peak_kb = peak_rss_kb()  # before the floor below loads the recorded events
    stats, summary = run.stats, run.metrics.summary
    kb = 1024.0
    figures = {
        "policy": policy,
        "comm_penalty": settings.comm_penalty,
        "jobs_replayed": len(replay_input.trace.jobs),
        "jobs": summary["jobs"],
        "read_s": read_s,
        "replay_s": run.cpu_s,
        "replay_wall_s": run.wall_s,
        "decide_s": seen["decide_s"],
        "events": stats.events,
        "events_per_s": stats.events / run.cpu_s,
        "jobs_per_s": summary["jobs"] / run.cpu_s,
        "decide_calls": stats.decide_calls,
        "cycles_due": stats.cycles,
        "mean_jobs_per_decide": seen["jobs"] / max(stats.decide_calls, 1),
        "largest_decide": seen["largest"],
        "peak_rss_mb": peak_kb / kb,
        "rss_after_imports_mb": imported_kb / kb,
        "rss_after_read_mb": read_kb / kb,
        "rss_interpreter_mb": baseline_kb / kb,
        "makespan_days": (stats.last_end - stats.first_submit) / 86400.0,
        "avg_jct_h": summary["avg_jct_s"] / 3600.0,
        "gpu_utilization": summary["gpu_utilization"],
    }
    if record is not None:  # the floor in this process too, so that replays can run side by side
        floor, popped = floor_seconds(record)
        figures.update(floor_s=floor, floor_events=popped, ratio_to_floor=run.cpu_s / floor if floor > 0 else None)
    result.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


def trace_for(jobs: int, root: Path = RESULTS / "traces") -> Path:
    """The generated trace of `jobs` jobs on 1,000 nodes (leaves of 20, fan-out 5), 200 users,
    offered load 0.7, seed 11 (made once, then reused)."""
    from dike_slurm.sim.tracegen.synthetic_cluster import ClusterSpec
    from dike_slurm.sim.tracegen.generate import generate_sample
    from dike_slurm.sim.tracegen.workload_model import WorkloadModel

    folder = root / f"trace-{jobs}-{NODES}-{LOAD:g}-{SEED}"
    if not (folder / "sacct.txt").is_file():
        cluster = ClusterSpec(nodes=NODES, nodes_per_leaf=20, switch_fanout=5)
        generate_sample(folder, jobs, cluster, replace(WorkloadModel(), n_users=200, target_load=LOAD), SEED)
    return folder


def run_one(trace: Path, policy: str, timeout_s: float | None = None, comm_penalty: float | None = None) -> dict:
    """A replay and its floor in a fresh interpreter; a replay over the timeout is reported as such."""
    with tempfile.TemporaryDirectory(prefix="dike-replay-") as scratch:
        folder = Path(scratch)
        result = folder / "result.json"
        argv = [sys.executable, str(Path(__file__).resolve()), "--child", str(trace), policy, str(folder), str(result)]
        if comm_penalty is not None:
            argv.append(repr(float(comm_penalty)))
        env = dict(os.environ, PYTHONHASHSEED="0")
        try:
            subprocess.run(argv, check=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            progress = folder / "progress.json"
            row = json.loads(progress.read_text(encoding="utf-8")) if progress.is_file() else {}
            row.update(policy=policy, timed_out_after_s=timeout_s, comm_penalty=comm_penalty)
            return row
        return json.loads(result.read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--child":
        trace, policy, folder, result = args[1:5]
        child(Path(trace), policy, Path(folder), Path(result), float(args[5]) if len(args) > 5 else None)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,30000")
    parser.add_argument("--policies", default="fifo,tiresias,dike")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per replay")
    parser.add_argument("--comm-penalty", type=float, default=None, help="default: the configuration's (1)")
    parser.add_argument("--out", type=Path, default=RESULTS / "replay.json")
    options = parser.parse_args(args)
    rows = []
    for size in (int(s) for s in options.sizes.split(",")):
        trace = trace_for(size)
        for policy in options.policies.split(","):
            row = run_one(trace, policy, options.timeout, options.comm_penalty)
            row["size"] = size
            rows.append(row)
            print(json.dumps(row), flush=True)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"runs": rows}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
