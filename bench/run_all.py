"""Every benchmark in one run (`make bench`, under 10 minutes here): engine cycle, replay, plots.

    .venv/bin/python bench/run_all.py          # cycle at 1k/10k/50k pending; replays of 10k and 100k jobs
                                               # (fifo, tiresias, dike) and of 1M jobs (fifo)
    .venv/bin/python bench/run_all.py --full   # 1M jobs for every replay policy too, and the congested
                                               # 100k at communication penalty 1 (about an hour)

Prints tables, writes RESULTS/run_all.json and RESULTS/{cycle,decide,replay}.png (--results,
default bench/results; generated traces are kept in RESULTS/traces and reused). All times are
CPU seconds of the process doing the work (best of --repeat for the cycle), as the machine is
shared; every figure also comes as a ratio to its floor measured in the same run.
docs/benchmarks.md explains each figure.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from cycle import POLICIES, READS, SlurmText, best_of  # noqa: E402
from plots import fitted_exponent, loglog  # noqa: E402
from replay_bench import run_one, trace_for  # noqa: E402
from synthetic import SIZES, Size  # noqa: E402

from dike_slurm.cycle import reconcile  # noqa: E402
from dike_slurm.config import Config  # noqa: E402
from dike_slurm.cycle.engine import Engine  # noqa: E402
from dike_slurm.store.state import StateStore  # noqa: E402

RESULTS = HERE / "results"
REPLAY_POLICIES = ("fifo", "tiresias", "dike")
QUICK_REPLAY_SIZES = (10_000, 100_000)  # at communication penalty 0: the cluster keeps up
MILLION_POLICIES = ("fifo",)  # --full: every replay policy
CONGESTED_PENALTY = 1.0  # the configuration's default: the 100k trace's queue grows to thousands
NLOGN_SLACK = 1.2  # n log n over 1k..50k has a log-log slope of about 1.1
WRITE_COST_S = Config().replay.write_cost_s  # one write on the lab (docs/benchmarks.md, "Writes on the real lab")
WRITE_BUDGET_S = Config().engine.write_budget_s


class Timed:
    """Wraps a callable and keeps the CPU seconds of its last call."""

    def __init__(self, function):
        self.function = function
        self.last: float | None = None
        self.result = None

    def __call__(self, *args, **kwargs):
        started = time.process_time()
        try:
            self.result = self.function(*args, **kwargs)
            return self.result
        finally:
            self.last = time.process_time() - started


def timed_plans(make: Callable[[], tuple[Engine, object]], text: SlurmText, repeat: int, job_read: str = "lean",
                *, running: bool = False, minute: bool = False) -> dict:
    """Best of `repeat` Engine.plan() runs, each phase timed inside the same runs (read_cluster,
    decide, reconcile.diff, reconcile.guardrails; `other` is the rest: accounting, usage, enrich,
    snapshot).

    `make` opens an engine and its backend as a starting service would. Each run is that of a
    new engine (nothing kept from an earlier cycle), or with `running` the next cycle of one
    engine that already ran one (planned and applied) on the same queue (what it keeps between
    cycles: the lean read's jobs, the state store's owned fields and remembered jobs, the
    enriched jobs and the diff's contexts); then the plan is applied too, as `run --apply` does,
    and timed apart (`apply_s`: the writes through the fake runner, the cycle record and the
    jobs' memories). With `minute` each of those cycles comes a minute after the last (the
    engine's default interval) on a queue where nothing else moved: the policies' scores move
    with the clock (wait, fair-share), and Slurm then holds what each applied plan wrote.

    The floor (splitting the lean text on its token, or json.loads of the JSON text: the read the
    backend makes) is measured right before every run, and the ratio
    is the best of the runs' own cycle/floor: this shared machine's speed drifts by tens of
    percent within minutes, which a floor measured once would fold into the ratio.
    """
    best: dict = {}
    module_functions = reconcile.diff, reconcile.guardrails
    engine, backend = make()
    if running:
        engine.apply(engine.plan())
    try:
        for run in range(repeat):
            if run and not running:
                engine, backend = make()
            if minute:
                backend.clock = lambda now=backend.clock() + 60.0: now
            read = backend.read_cluster = Timed(backend.read_cluster)
            decide = engine.policy.decide = Timed(engine.policy.decide)
            diff = reconcile.diff = Timed(module_functions[0])
            guard = reconcile.guardrails = Timed(module_functions[1])
            floor = best_of(1, lambda: text.floor(job_read))
            started = time.process_time()
            plan = engine.plan()
            figures = {"cycle_s": time.process_time() - started, "read_s": read.last, "decide_s": decide.last,
                       "diff_s": diff.last, "guardrails_s": guard.last, "floor_s": floor}
            figures["ratio_to_floor"] = figures["cycle_s"] / floor
            if running:
                started = time.process_time()
                engine.apply(plan)
                figures["apply_s"] = time.process_time() - started
            for key, value in figures.items():
                if value is not None:
                    best[key] = min(best.get(key, math.inf), value)
            best["writes"] = max(best.get("writes", 0), len(plan.writes) + len(plan.held_back))
            best["breaker_tripped"] = best.get("breaker_tripped", 0) + bool(plan.breaker)  # runs whose writes it stopped
            backend.read_cluster = read.function
            if minute and plan.writes:  # Slurm holds what was written, for the next minute's cycle
                text = text.holding(plan)
                backend.runner = text.runner
    finally:  # the module functions are shared by every engine: unwrap them for the next one
        reconcile.diff, reconcile.guardrails = module_functions
    known = sum(best.get(k, 0.0) for k in ("read_s", "decide_s", "diff_s", "guardrails_s"))
    best["other_s"] = max(0.0, best["cycle_s"] - known)
    best.update(jobs=len(plan.jobs), plan=plan)
    return best


def cycle_size(size: Size, policies: tuple[str, ...], repeat: int, folder: Path, console: Console,
               reads: tuple[str, ...] = READS) -> dict:
    """One size, per policy and read (lean: squeue -O; json: squeue --json): the first cycle (Slurm
    holds nothing of the engine's: every job needs a write), the steady cycle (every write of the
    first one took effect, the state store remembers them, nothing moved) of an engine just
    started, the same steady cycle of an engine that ran one before (`steady_running`), and that
    engine's cycles a minute apart (`minute_later`); each against the floor of its own read
    (splitting the same text, or json.loads of it)."""
    text = SlurmText(size, folder)
    row: dict = {"size": size.label, "pending": size.pending, "running": size.running, "nodes": size.nodes,
                 "input_mb": round(text.megabytes, 1), "lean_input_mb": round(text.lean_megabytes, 1),
                 "lean_bytes_per_job": round(len(text.lean_squeue) / (size.pending + size.running)),
                 "json_bytes_per_job": round(len(text.squeue) / (size.pending + size.running)), "repeat": repeat}
    row["policies"] = {}
    settings = {"max_changes_per_cycle": 10**9, "cycle_deadline_s": 1e9}
    for name in policies:
        config = Config.model_validate({"engine": {"policy": name, **settings}})
        figures: dict = {}
        for job_read in reads:
            def first_engine(text=text, job_read=job_read):
                backend = text.backend(job_read)
                return Engine(config, backend, StateStore(None)), backend

            first = timed_plans(first_engine, text, repeat, job_read)
            # apply the first plan through an engine with a state store, so the steady cycle reads
            # the store's memory of every field it owns, as a live engine would
            state = folder / f"state-{name}-{job_read}.sqlite"
            state.unlink(missing_ok=True)
            plan = first.pop("plan")
            first_backend = text.backend(job_read)
            Engine(config, first_backend, StateStore(state)).apply(plan)
            held = text.holding(plan)

            def steady_engine(held=held, job_read=job_read, state=state):
                backend = held.backend(job_read)
                return Engine(config, backend, StateStore(state)), backend

            steady = timed_plans(steady_engine, held, repeat, job_read)
            running = timed_plans(steady_engine, held, repeat, job_read, running=True)
            minute = timed_plans(steady_engine, held, repeat, job_read, running=True, minute=True)
            for figures_of_kind in (steady, running, minute):
                figures_of_kind.pop("plan")
            figures[job_read] = {**first, "steady": steady, "steady_running": running, "minute_later": minute}
            # the size's floors for the tables and plots: the best of those measured beside every run
            key = "floor_s" if job_read == "lean" else "json_floor_s"
            row[key] = min(row.get(key, math.inf), first["floor_s"])
            console.print(f"  cycle {size.label:<18} {name:<12} {job_read:<4} first {first['cycle_s']:6.2f} s "
                          f"({first['ratio_to_floor']:.1f}x floor, {first['writes']} writes), steady "
                          f"{steady['cycle_s']:6.2f} s ({steady['ratio_to_floor']:.1f}x floor, {steady['writes']} writes), "
                          f"steady running {running['cycle_s']:6.2f} s ({running['ratio_to_floor']:.1f}x floor; "
                          f"its apply {running['apply_s']:.2f} s), a minute later {minute['cycle_s']:6.2f} s "
                          f"({minute['writes']} writes{', breaker tripped' if minute['breaker_tripped'] else ''}; "
                          f"its apply {minute['apply_s']:.2f} s)",
                          highlight=False)
        primary = figures.get("lean") or figures["json"]
        row["policies"][name] = {**primary, **({"json": figures["json"]} if "json" in figures and "lean" in figures else {})}
    return row


def cycle_tables(rows: list[dict], console: Console) -> None:
    table = Table(title="Engine cycle without Slurm I/O (CPU s, best of N): Engine.plan() and its phases; "
                        "first: every job needs a write, steady: Slurm already holds every value (an engine just started, "
                        "or running: its second such cycle, and apply: that cycle's apply, which writes nothing to Slurm); lean: squeue -O "
                        "(floor: splitting its text), json: squeue --json (floor: json.loads)")
    for column in ("size", "MB lean/json", "floor lean/json", "policy", "read", "cycle kind", "writes", "read s",
                   "decide", "diff+guard", "other", "cycle", "cycle/floor", "apply"):
        table.add_column(column, justify="right")
    for row in rows:
        first_row = True
        for name, lean in row["policies"].items():
            for job_read, figures in (("lean", lean), ("json", lean.get("json"))):
                if figures is None:
                    continue
                for kind, p in (("first", figures), ("steady", figures["steady"]),
                                ("steady running", figures["steady_running"]), ("a minute later", figures["minute_later"])):
                    diff = (p.get("diff_s") or 0.0) + (p.get("guardrails_s") or 0.0)
                    table.add_row(
                        row["size"] if first_row else "",
                        f"{row.get('lean_input_mb', 0):.1f}/{row['input_mb']:.1f}" if first_row else "",
                        f"{row['floor_s']:.3f}/{row.get('json_floor_s', math.nan):.3f}" if first_row else "",
                        name if kind == "first" and job_read == "lean" else "", job_read if kind == "first" else "",
                        kind, str(p["writes"]), f"{p.get('read_s', math.nan):.3f}", f"{p.get('decide_s', math.nan):.3f}",
                        f"{diff:.3f}", f"{p['other_s']:.3f}", f"{p['cycle_s']:.3f}", f"{p['ratio_to_floor']:.1f}x",
                        f"{p['apply_s']:.3f}" if "apply_s" in p else "",
                    )
                    first_row = False
    console.print(table)


def replay_table(rows: list[dict], console: Console) -> None:
    table = Table(title="Replay on 1,000 nodes x 8 GPUs (CPU s; one fresh process per run)")
    for column in ("trace jobs", "penalty", "policy", "jobs", "events", "replay s", "decide s", "events/s", "jobs/s",
                   "floor s", "replay/floor", "peak MB", "jobs/decide", "read s"):
        table.add_column(column, justify="right")
    for row in rows:
        if "timed_out_after_s" in row:
            done = row.get("jobs_finished", 0)
            table.add_row(
                str(row["size"]), f"{row.get('comm_penalty', 0):g}", row["policy"], f"{done}/{row.get('jobs_replayed', '?')}", "",
                f">{row['timed_out_after_s']:.0f} (stopped)", f"{row.get('decide_s', math.nan):.1f}", "",
                f"{done / row['replay_s']:.0f}" if row.get("replay_s") else "", "", "",
                f"{row.get('peak_rss_mb', math.nan):.0f}", "", f"{row.get('read_s', math.nan):.1f}",
            )
            continue
        table.add_row(
            str(row["size"]), f"{row['comm_penalty']:g}", row["policy"], str(row["jobs"]), str(row["events"]),
            f"{row['replay_s']:.1f}",
            f"{row['decide_s']:.1f}", f"{row['events_per_s']:.0f}", f"{row['jobs_per_s']:.0f}",
            f"{row['floor_s']:.3f}", f"{row['ratio_to_floor']:.0f}x", f"{row['peak_rss_mb']:.0f}",
            f"{row['mean_jobs_per_decide']:.0f}", f"{row['read_s']:.1f}",
        )
    console.print(table)


def plots_and_exponents(cycle_rows: list[dict], replay_rows: list[dict], console: Console, results: Path) -> dict:
    exponents: dict = {}
    if cycle_rows:
        pending = [r["pending"] for r in cycle_rows]
        names = list(cycle_rows[0]["policies"])
        series = {}
        for n in names:
            series[f"{n} first"] = (pending, [r["policies"][n]["cycle_s"] for r in cycle_rows])
            series[f"{n} steady"] = (pending, [r["policies"][n]["steady"]["cycle_s"] for r in cycle_rows])
        exponents["cycle"] = loglog(
            results / "cycle.png", "Engine cycle (no Slurm I/O) vs pending jobs", "pending jobs", "CPU seconds",
            series, (pending, [r["floor_s"] for r in cycle_rows]), "floor: splitting the squeue -O text",
        )
        exponents["decide"] = loglog(
            results / "decide.png", "Policy decide() inside the cycle vs pending jobs", "pending jobs", "CPU seconds",
            {n: (pending, [r["policies"][n]["decide_s"] for r in cycle_rows]) for n in names},
        )
        exponents["phases"] = {
            phase: fitted_exponent(pending, [r["policies"][names[-1]].get(f"{phase}_s") for r in cycle_rows])
            for phase in ("read", "diff", "other")
        }
    main_penalty = replay_rows[0].get("comm_penalty") if replay_rows else None
    done = [r for r in replay_rows if "timed_out_after_s" not in r and r.get("comm_penalty") == main_penalty]
    if done:
        names = sorted({r["policy"] for r in done}, key=lambda n: REPLAY_POLICIES.index(n) if n in REPLAY_POLICIES else 99)
        series = {}
        for name in names:
            mine = sorted((r for r in done if r["policy"] == name), key=lambda r: r["size"])
            series[name] = ([r["size"] for r in mine], [r["replay_s"] for r in mine])
        floor_rows = sorted((r for r in done if r["policy"] == names[0]), key=lambda r: r["size"])
        exponents["replay"] = loglog(
            results / "replay.png", f"Replay CPU time vs trace size (1,000 nodes, comm penalty {main_penalty:g})",
            "jobs in trace", "CPU seconds",
            series, ([r["size"] for r in floor_rows], [r["floor_s"] for r in floor_rows]), "floor: bare heapq loop",
        )
    table = Table(title="Fitted exponents (log-log slope of time against size)")
    table.add_column("what")
    table.add_column("exponent", justify="right")
    table.add_column("note")
    for group in ("cycle", "decide", "phases", "replay"):
        for name, value in exponents.get(group, {}).items():
            note = ""
            if group == "decide" and value is not None:
                note = "ok (<= n log n)" if value <= NLOGN_SLACK else "WORSE THAN n log n: a bug"
            table.add_row(f"{group}: {name}", "-" if value is None else f"{value:.2f}", note)
    console.print(table)
    return exponents


def targets(cycle_rows: list[dict], replay_rows: list[dict], console: Console) -> list[str]:
    lines = []
    big = next((r for r in cycle_rows if r["pending"] >= 50_000), None)
    if big:
        for name, first in big["policies"].items():
            for kind, p in (("first", first), ("steady", first["steady"]), ("steady running", first["steady_running"]),
                            ("a minute later", first["minute_later"])):
                lines.append(f"cycle at {big['size']}, {name}, {kind} (lean read): {p['cycle_s']:.2f} s (target < 1 s: "
                             f"{'met' if p['cycle_s'] < 1 else 'MISSED'}), {p['ratio_to_floor']:.1f}x floor "
                             f"(target <= 3x: {'met' if p['ratio_to_floor'] <= 3 else 'MISSED'})")
            # issue 28 (write what matters): what the writes grow with, and what they cost
            minute, pending = first["minute_later"], big["pending"]
            lines.append(f"writes at {big['size']}, {name}: a quiet minute later {minute['writes']} "
                         f"({minute['writes'] / pending:.2%} of the pending jobs; target <= 1%: "
                         f"{'met' if minute['writes'] <= 0.01 * pending else 'MISSED'}), its apply "
                         f"{minute['apply_s']:.2f} s of engine CPU (target <= 1 s: "
                         f"{'met' if minute['apply_s'] <= 1 else 'MISSED'}); a running engine's quiet plan "
                         f"{first['steady_running']['cycle_s']:.2f} s (target <= 1 s: "
                         f"{'met' if first['steady_running']['cycle_s'] <= 1 else 'MISSED'}); a first cycle's "
                         f"{first['writes']} writes take {first['writes'] * WRITE_COST_S:.1f} s at "
                         f"{WRITE_COST_S * 1000:g} ms each (the lab's fed scontrol; target <= the "
                         f"{WRITE_BUDGET_S:g} s write budget: {'met' if first['writes'] * WRITE_COST_S <= WRITE_BUDGET_S else 'MISSED'})")
    for row in replay_rows:
        if row["size"] == 100_000:
            seconds = row.get("replay_s")
            stopped = "timed_out_after_s" in row
            lines.append(f"replay 100k, {row['policy']}, penalty {row.get('comm_penalty', 0):g}: "
                         f"{'>' if stopped else ''}{seconds or row.get('timed_out_after_s'):.0f} s "
                         f"(target < 60 s: {'met' if not stopped and seconds < 60 else 'MISSED'})")
        if row["size"] >= 1_000_000:
            peak = row.get("peak_rss_mb")
            if peak is not None:
                lines.append(f"replay 1M, {row['policy']}: peak {peak:.0f} MB{' (so far; stopped)' if 'timed_out_after_s' in row else ''} "
                             f"(target < 2048 MB: {'met' if peak < 2048 else 'MISSED'})")
    for line in lines:
        console.print(line, highlight=False)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true",
                        help="1M jobs under every replay policy, and 100k jobs at communication penalty 1 (long)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cycle figure (2 at 50k pending)")
    parser.add_argument("--cycle-sizes", default="0,1,2", help="indexes into synthetic.SIZES; empty: skip")
    parser.add_argument("--cycle-policies", default=",".join(POLICIES))
    parser.add_argument("--cycle-reads", default=",".join(READS), help="lean, json or both (the lean read is the engine's)")
    parser.add_argument("--replay-sizes", default=None,
                        help="jobs per trace, comma-separated (default 10k, 100k and 1M); empty: skip")
    parser.add_argument("--replay-policies", default=",".join(REPLAY_POLICIES))
    parser.add_argument("--million-policies", default=",".join(MILLION_POLICIES),
                        help="policies replayed at 1M jobs (--full: every replay policy)")
    parser.add_argument("--replay-timeout", type=float, default=1800.0, help="seconds per replay of 100k jobs or more")
    parser.add_argument("--comm-penalty", type=float, default=0.0,
                        help="of the replays (0: the cluster keeps up; --full adds 100k at the default 1)")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="tasks side by side: the cycle benchmark and the replays (each replay in its own process)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="folder of run_all.json, the plots and the generated traces (made once, then reused)")
    args = parser.parse_args(argv)
    console = Console(width=160)
    began, began_cpu = time.time(), time.process_time()
    machine = {"python": platform.python_version(), "cpus": os.cpu_count(), "load_at_start": os.getloadavg(),
               "platform": platform.platform()}
    console.print(f"dike-slurm benchmarks: Python {machine['python']}, {machine['cpus']} CPUs, "
                  f"load {machine['load_at_start'][0]:.1f} at start (shared machine: CPU time, best of N)", highlight=False)
    random.seed(0)

    def cycles() -> list[dict]:
        rows: list[dict] = []
        if not args.cycle_sizes:
            return rows
        policies = tuple(args.cycle_policies.split(","))
        with tempfile.TemporaryDirectory(prefix="dike-bench-") as folder:
            for index in args.cycle_sizes.split(","):
                size = SIZES[int(index)]
                repeat = args.repeat if size.pending < 50_000 else min(args.repeat, 2)
                rows.append(cycle_size(size, policies, repeat, Path(folder), console,
                                       tuple(args.cycle_reads.split(","))))
        return rows

    replay_policies = args.replay_policies.split(",")
    sizes = [int(s) for s in (args.replay_sizes or "").split(",") if s] if args.replay_sizes is not None \
        else list(QUICK_REPLAY_SIZES)
    runs = [(size, args.comm_penalty, replay_policies) for size in sizes]
    if args.replay_sizes is None:
        runs.append((1_000_000, args.comm_penalty, replay_policies if args.full else args.million_policies.split(",")))
    if args.full:
        runs.append((100_000, CONGESTED_PENALTY, replay_policies))
    jobs = [(size, penalty, policy) for size, penalty, names in runs for policy in names]
    traces = {size: trace_for(size, args.results / "traces") for size in sorted({size for size, _, _ in jobs})}

    def replay(job: tuple[int, float, str]) -> dict:
        size, penalty, policy = job
        row = run_one(traces[size], policy, args.replay_timeout if size >= 100_000 else None, penalty)
        row["size"] = size
        label = f"  replay {size} {policy} (penalty {penalty:g})"
        if "timed_out_after_s" in row:
            console.print(f"{label}: stopped after {args.replay_timeout:.0f} s, "
                          f"{row.get('jobs_finished', 0)} jobs done", highlight=False)
        else:
            console.print(f"{label}: {row['replay_s']:.1f} s, {row['ratio_to_floor']:.0f}x floor, "
                          f"{row['peak_rss_mb']:.0f} MB", highlight=False)
        return row

    # --workers tasks side by side: the cycle benchmark (in this process; it is the only task
    # that computes here) and the replays (each a child process timed by its own CPU clock,
    # its thread here only waits). The 1M-job replays start first, the cycles next to them.
    ordered = sorted(jobs, key=lambda job: -job[0])
    longest = [job for job in ordered if job[0] >= 1_000_000]
    with ThreadPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = {job: pool.submit(replay, job) for job in longest}
        cycle_future = pool.submit(cycles)
        futures.update({job: pool.submit(replay, job) for job in ordered if job not in futures})
        done = {job: future.result() for job, future in futures.items()}
        cycle_rows = cycle_future.result()
    replay_rows = [done[job] for job in jobs]
    if cycle_rows:
        cycle_tables(cycle_rows, console)
    if replay_rows:
        replay_table(replay_rows, console)

    exponents = plots_and_exponents(cycle_rows, replay_rows, console, args.results)
    target_lines = targets(cycle_rows, replay_rows, console)
    machine["load_at_end"] = os.getloadavg()
    document = {
        "machine": machine,
        "wall_s": time.time() - began,
        "cpu_s_this_process": time.process_time() - began_cpu,
        "cycle": cycle_rows,
        "replay": replay_rows,
        "exponents": exponents,
        "targets": target_lines,
    }
    out = args.results / "run_all.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    console.print(f"written: {out} and the plots cycle.png, decide.png, replay.png beside it "
                  f"({document['wall_s']:.0f} s wall)", highlight=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
