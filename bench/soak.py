"""Months of service in minutes (`make soak`): the live engine, `--apply`, over 90 simulated days.

    .venv/bin/python bench/soak.py                       # 90 days of philly-b436b2-s4, a cycle every 20 min
    .venv/bin/python bench/soak.py --days 30 --interval-s 300

The corpus case is repeated end to end (copy k submitted `--period-days` x k later, job ids
offset by 1,000,000 x k) until it covers `--days`: a case's own arrivals span days, not months.
Each cycle is `service.run_cycle(engine, apply=True)`, as `dike-slurm run --apply` runs it:
the reads, accounting, decide, diff, the write-ahead-audited writes, the cycle record, the
jobs/runs pruning and the retention pass; the backend is the replay simulator
(`slurm.backend = "simulated"`), which steps to each cycle while jobs wait and one of them could
start (a cycle with nothing to decide is skipped, so a day has at most 86400 / interval cycles).

At the end of each simulated day it records the process's RSS, the state file's size (with its
-wal and -shm), the rows of each table and that day's cycles' CPU time (p50, p99; the whole
cycle, and the part spent in the engine: the cycle less the simulated Slurm's reads). It prints
a table, writes RESULTS/soak.json and RESULTS/soak.png, and fits the growth per day by least
squares over the steady days: after every window has filled (accounting.lookback_days, the
retention's audit_days and cycles_days).

What the harness does besides driving the engine: the simulated slurmdbd's finished-job records
older than the look-back (which the engine never asks for again) are dropped, and the
simulator's replay metrics are not collected; both would otherwise grow in this process and be
counted as the engine's memory. CPU seconds throughout (the machine is shared).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import json
import math
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

from dike_slurm.config import Config  # noqa: E402
from dike_slurm.cycle.engine import Engine  # noqa: E402
from dike_slurm.parsing.durations import format_timestamp, parse_timestamp  # noqa: E402
from dike_slurm.ops.service import run_cycle  # noqa: E402
from dike_slurm.sim.backend import SimulatedBackend  # noqa: E402
from dike_slurm.store.state import StateStore  # noqa: E402

RESULTS = HERE / "results"
DAY = 86400.0
ID_OFFSET = 1_000_000
TIME_COLUMNS = ("Submit", "Eligible", "Start", "End")
ID_COLUMNS = ("JobID", "JobIDRaw")
SERIES = ("rss_mb", "rss_anon_mb", "py_arenas", "py_blocks", "sqlite_mb", "state_mb", "state_bytes_per_row",
          "cycle_p50_ms", "cycle_p99_ms", "engine_p50_ms", "engine_p99_ms")


def repeated_trace(case: Path, out: Path, days: float, period_days: float) -> int:
    """The case's sacct dump repeated every `period_days` until it spans `days`; copies made."""
    lines = (case / "sacct.txt").read_text().splitlines()
    header = lines[0].split("|")
    times = [header.index(c) for c in TIME_COLUMNS]
    ids = [header.index(c) for c in ID_COLUMNS]
    rows = [line.split("|") for line in lines[1:] if line.strip()]
    copies = max(1, math.ceil(days / period_days) + 1)  # one more: the last days keep a queue
    result = [lines[0]]
    for copy in range(copies):
        shift = copy * period_days * DAY
        for row in rows:
            row = list(row)
            for i in times:
                stamp = parse_timestamp(row[i])
                if stamp is not None:
                    row[i] = format_timestamp(stamp + shift)
            for i in ids:
                head, _, tail = row[i].partition("_")
                row[i] = str(int(head) + copy * ID_OFFSET) + (f"_{tail}" if tail else "")
            result.append("|".join(row))
    out.mkdir(parents=True, exist_ok=True)
    (out / "sacct.txt").write_text("\n".join(result) + "\n")
    for name in ("slurm.conf", "topology.conf"):
        shutil.copy(case / name, out / name)
    return copies


class TimedBackend(SimulatedBackend):
    """The simulated cluster, keeping the CPU seconds of its reads (the simulated Slurm's share
    of a cycle) and dropping the slurmdbd records the engine will not ask for again."""

    def __init__(self, *args, keep_records_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.keep_records_s = keep_records_s
        self.read_cpu_s = 0.0
        self.collector = lambda result: None  # the replay's metrics: not the engine's memory

    def read_cluster(self):
        started = time.process_time()
        try:
            return super().read_cluster()
        finally:
            self.read_cpu_s += time.process_time() - started

    def accounting(self, start: float, end: float):
        started = time.process_time()
        try:
            oldest = end - self.keep_records_s
            if self.records and self.records[0].end is not None and self.records[0].end < oldest:
                self.records = [r for r in self.records if r.end is None or r.end >= oldest]
            return super().accounting(start, end)
        finally:
            self.read_cpu_s += time.process_time() - started


def rss_mb(key: str = "VmRSS") -> float:
    """The process's resident memory now (VmRSS; RssAnon: its heaps, without mapped files)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024.0
    return math.nan


def python_arenas() -> int:
    """Python's small-object allocator's arenas (1 MiB each in CPython 3.10+) now, from
    `sys._debugmallocstats`, which prints only to the C stderr: -1 where that is not CPython's."""
    if not hasattr(sys, "_debugmallocstats"):
        return -1
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        match = re.search(rb"# arenas allocated current\s*=\s*([\d,]+)", capture.read())
    return int(match.group(1).replace(b",", b"")) if match else -1


def sqlite_memory() -> Callable[[], float]:
    """SQLite's own heap in MB now (sqlite3_memory_used: its page cache and statements), from the
    library Python's sqlite3 module loaded; NaN where that library cannot be found."""
    name = ctypes.util.find_library("sqlite3")
    if name is None:
        return lambda: math.nan
    used = ctypes.CDLL(name).sqlite3_memory_used
    used.restype = ctypes.c_int64
    return lambda: used() / 2**20


def state_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists())


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def fit(days: list[int], values: list[float]) -> dict[str, float]:
    """Least-squares growth per day, its standard error, the mean, and the growth a year at that
    slope as a share of the mean."""
    points = [(d, v) for d, v in zip(days, values) if not math.isnan(v)]
    n = len(points)
    if n < 3:
        return {"slope_per_day": math.nan, "stderr": math.nan, "mean": math.nan, "year_pct": math.nan, "days": n}
    mx = sum(d for d, _ in points) / n
    my = sum(v for _, v in points) / n
    sxx = sum((d - mx) ** 2 for d, _ in points)
    slope = sum((d - mx) * (v - my) for d, v in points) / sxx
    residual = sum((v - my - slope * (d - mx)) ** 2 for d, v in points)
    stderr = math.sqrt(residual / (n - 2) / sxx)
    return {"slope_per_day": slope, "stderr": stderr, "mean": my,
            "year_pct": 100.0 * slope * 365 / my if my else math.nan, "days": n}


def trend(result: dict[str, float]) -> str | None:
    """"flat": the slope is within two standard errors of zero, or a year of it is under 5 % of
    the mean; otherwise "grows" or "falls" (None: too few days to say)."""
    slope = result["slope_per_day"]
    if math.isnan(slope):
        return None
    if abs(slope) <= 2 * result["stderr"] or abs(result["year_pct"]) < 5.0:
        return "flat"
    return "grows" if slope > 0 else "falls"


def soak_config(trace: Path, state: Path, args: argparse.Namespace) -> Config:
    return Config.model_validate({
        # Every job opted in to preemption (the replay's default), guardrails opened as in the
        # engine-through-simulator tests: a latched breaker would stop the writes for good.
        "engine": {"state_db": str(state), "interval_s": args.interval_s, "max_changes_per_cycle": 10000,
                   "breaker_min_jobs": 100000, "preemptible_partitions": ["gpu"]},
        "slurm": {"backend": "simulated", "simulated_trace": str(trace / "sacct.txt"),
                  "slurm_conf": str(trace / "slurm.conf"), "topology_conf": str(trace / "topology.conf")},
        "replay": {"interval_s": args.interval_s},
        "accounting": {"lookback_days": args.lookback_days},
        "retention": {"audit_days": args.audit_days, "cycles_days": args.audit_days},
    })


def run(args: argparse.Namespace) -> dict:
    out = args.results / "soak"
    if out.exists():
        shutil.rmtree(out)
    trace = out / "trace"
    copies = repeated_trace(ROOT / "examples" / "corpus" / args.case, trace, args.days, args.period_days)
    state = out / "state.sqlite"
    config = soak_config(trace, state, args)
    backend = TimedBackend(config, trace / "sacct.txt", trace / "slurm.conf", trace / "topology.conf",
                           keep_records_s=(args.lookback_days + 1) * DAY)
    store = StateStore(state)
    engine = Engine(config, backend, store)
    wall_started = time.monotonic()
    sqlite_mb = sqlite_memory()
    days_file = out / "days.jsonl"  # on disk, not in this process: the harness's records are not the engine's memory
    first: float | None = None
    day_cycles: list[float] = []
    day_engine: list[float] = []
    day_writes = 0
    day = 0
    total_cycles = total_writes = 0

    def close_day() -> None:
        nonlocal day_cycles, day_engine, day_writes
        tables = store.table_rows()
        # As the service's own collector would: what a cycle froze (dike_slurm/cycle/gcpause.py) stays
        # frozen, so garbage that only a full collection of the frozen objects would find counts.
        gc.collect()
        row = {
            "day": day + 1, "cycles": len(day_cycles), "writes": day_writes,
            "rss_mb": round(rss_mb(), 2), "rss_anon_mb": round(rss_mb("RssAnon"), 2),
            "sqlite_mb": round(sqlite_mb(), 3), "py_arenas": python_arenas(),
            "state_mb": round(state_bytes(state) / 2**20, 3),
            "py_objects": len(gc.get_objects()) + gc.get_freeze_count(), "py_blocks": sys.getallocatedblocks(),
            "state_bytes_per_row": round(state_bytes(state) / max(1, sum(tables.values())), 1),
            "cycle_p50_ms": round(1000 * percentile(day_cycles, 50), 2),
            "cycle_p99_ms": round(1000 * percentile(day_cycles, 99), 2),
            "engine_p50_ms": round(1000 * percentile(day_engine, 50), 2),
            "engine_p99_ms": round(1000 * percentile(day_engine, 99), 2),
            "rows": tables, "active_jobs": last_jobs,
        }
        with days_file.open("a") as stream:
            stream.write(json.dumps(row) + "\n")
        if args.verbose:
            print(format_row(row), flush=True)
        day_cycles, day_engine, day_writes = [], [], 0

    last_jobs = 0
    while not backend.finished():
        read_before = backend.read_cpu_s
        started = time.process_time()
        report = run_cycle(engine, apply=True)
        cpu = time.process_time() - started
        if backend.finished():
            break
        now = report.plan.time
        first = now if first is None else first
        while now - first >= (day + 1) * DAY:  # the cycle belongs to a later day: close the finished ones
            close_day()
            day += 1
        if day >= args.days:
            break
        written = sum(1 for _, o in report.outcomes if o.ok)
        day_cycles.append(cpu)
        day_engine.append(cpu - (backend.read_cpu_s - read_before))
        day_writes += written
        total_cycles += 1
        total_writes += written
        last_jobs = len(report.plan.jobs)
    if day_cycles and day < args.days:
        close_day()
    store.close()
    rows = [json.loads(line) for line in days_file.read_text().splitlines()]
    steady = [r for r in rows if r["day"] >= args.steady_from_day]
    fits = {name: fit([r["day"] for r in steady], [r[name] for r in steady]) for name in SERIES}
    fits["audit_rows"] = fit([r["day"] for r in steady], [r["rows"]["audit"] for r in steady])
    return {
        "case": args.case, "copies": copies, "period_days": args.period_days, "days": len(rows),
        "interval_s": args.interval_s, "lookback_days": args.lookback_days, "audit_days": args.audit_days,
        "cycles": total_cycles, "writes": total_writes, "wall_s": round(time.monotonic() - wall_started, 1),
        "steady_from_day": args.steady_from_day, "per_day": rows, "periods": periods(rows, args.period_days),
        "fits": fits, "trend": {name: trend(f) for name, f in fits.items() if name in SERIES},
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }


def periods(rows: list[dict], period_days: float) -> list[dict]:
    """Each whole repeat of the trace: its workload (cycles, writes) and the means of the series."""
    length = int(period_days)
    result = []
    for start in range(1, len(rows) - length + 2, length):
        days = [r for r in rows if start <= r["day"] < start + length]

        def mean(name: str, days: list[dict] = days) -> float:
            values = [r[name] for r in days if not math.isnan(r[name])]
            return round(sum(values) / len(values), 2) if values else math.nan

        result.append({
            "days": f"{start}-{start + length - 1}", "cycles": sum(r["cycles"] for r in days),
            "writes": sum(r["writes"] for r in days),
            "audit_rows": round(sum(r["rows"]["audit"] for r in days) / len(days)),
            **{name: mean(name) for name in SERIES}, "rss_max_mb": max(r["rss_mb"] for r in days),
            "state_max_mb": max(r["state_mb"] for r in days),
        })
    return result


def format_row(row: dict) -> str:
    tables = row["rows"]
    return (f"{row['day']:>4} {row['cycles']:>6} {row['writes']:>7} {row['active_jobs']:>6} {row['rss_mb']:>8.1f} "
            f"{row['py_blocks'] / 1000:>8.1f} "
            f"{row['state_mb']:>8.2f} {tables['audit']:>8} {tables['cycles']:>7} {tables['jobs']:>6} "
            f"{tables['owned']:>6} {tables['runs']:>6} {row['cycle_p50_ms']:>8.1f} {row['cycle_p99_ms']:>8.1f} "
            f"{row['engine_p50_ms']:>8.1f} {row['engine_p99_ms']:>8.1f}")


HEADER = (f"{'day':>4} {'cycles':>6} {'writes':>7} {'active':>6} {'RSS MB':>8} {'blocks k':>8} {'state MB':>8} {'audit':>8} "
          f"{'cycles':>7} {'jobs':>6} {'owned':>6} {'runs':>6} {'p50 ms':>8} {'p99 ms':>8} {'eng p50':>8} "
          f"{'eng p99':>8}")


def report_text(result: dict) -> str:
    lines = [f"soak: {result['case']} x{result['copies']} (a copy every {result['period_days']:g} days), "
             f"{result['days']} simulated days, a cycle every {result['interval_s']:g} s while jobs wait: "
             f"{result['cycles']} cycles, {result['writes']} writes, {result['wall_s']:.0f} s wall",
             "   (active: jobs at the day's last cycle; blocks k: Python's allocated memory blocks after a collection, "
             "thousands; anon MB: RSS less mapped files; arenas: Python's 1 MiB arenas; sqlite MB: SQLite's own "
             "heap; audit..runs: rows per table; p50/p99: the day's cycles, CPU ms; eng: the cycle less the "
             "simulated Slurm's reads)",
             HEADER]
    lines += [format_row(r) for r in result["per_day"]]
    lines.append(f"per repeat of the trace ({result['period_days']:g} days; means of the days):")
    lines.append(f"{'days':>7} {'cycles':>6} {'writes':>6} {'audit':>6} {'RSS MB':>7} {'max':>6} {'anon MB':>7} "
                 f"{'arenas':>6} {'blocks':>8} {'sqlite MB':>9} {'state MB':>8} {'max':>6} {'B/row':>6} {'p50 ms':>7} "
                 f"{'p99 ms':>7} {'eng p50':>7} {'eng p99':>7}")
    for p in result["periods"]:
        lines.append(f"{p['days']:>7} {p['cycles']:>6} {p['writes']:>6} {p['audit_rows']:>6} {p['rss_mb']:>7.2f} "
                     f"{p['rss_max_mb']:>6.1f} {p['rss_anon_mb']:>7.2f} {p['py_arenas']:>6.1f} {p['py_blocks']:>8.0f} "
                     f"{p['sqlite_mb']:>9.2f} "
                     f"{p['state_mb']:>8.2f} {p['state_max_mb']:>6.2f} "
                     f"{p['state_bytes_per_row']:>6.0f} "
                     f"{p['cycle_p50_ms']:>7.1f} {p['cycle_p99_ms']:>7.1f} {p['engine_p50_ms']:>7.1f} "
                     f"{p['engine_p99_ms']:>7.1f}")
    lines.append(f"growth per day over days {result['steady_from_day']}-{result['days']} (least squares over the days; "
                 f"look-back {result['lookback_days']:g} d, retention {result['audit_days']:g} d):")
    for name, f in result["fits"].items():
        verdict = {None: "  (too few days)", "flat": "  flat", "grows": "  GROWS", "falls": "  falls"}[
            result["trend"][name]] if name in result["trend"] else ""
        lines.append(f"  {name:<14} {f['slope_per_day']:+.4g} /day (+/- {f['stderr']:.2g}), mean {f['mean']:.4g}, "
                     f"a year of it: {f['year_pct']:+.1f}% of the mean{verdict}")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    days = [r["day"] for r in result["per_day"]]
    figure, axes = plt.subplots(2, 2, figsize=(10, 6.5), dpi=110, sharex=True)
    panels = [
        (axes[0][0], "process RSS, its heaps, SQLite's heap (MB); Python's allocated blocks (thousands)", {
            "RSS": [r["rss_mb"] for r in result["per_day"]],
            "RSS anon": [r["rss_anon_mb"] for r in result["per_day"]],
            "SQLite": [r["sqlite_mb"] for r in result["per_day"]],
            "blocks / 1000": [r["py_blocks"] / 1000 for r in result["per_day"]]}),
        (axes[0][1], "state file with -wal, -shm (MB)", {"state": [r["state_mb"] for r in result["per_day"]]}),
        (axes[1][0], "cycle CPU time (ms)", {
            "cycle p50": [r["cycle_p50_ms"] for r in result["per_day"]],
            "cycle p99": [r["cycle_p99_ms"] for r in result["per_day"]],
            "engine p50": [r["engine_p50_ms"] for r in result["per_day"]],
            "engine p99": [r["engine_p99_ms"] for r in result["per_day"]]}),
        (axes[1][1], "rows", {name: [r["rows"][name] for r in result["per_day"]]
                              for name in ("audit", "cycles", "jobs", "owned", "runs")}),
    ]
    for axis, title, series in panels:
        for label, values in series.items():
            axis.plot(days, values, label=label, linewidth=1.2)
        axis.axvline(result["steady_from_day"], color="grey", linestyle=":", linewidth=1)
        axis.set_title(title, fontsize=10)
        axis.set_ylim(bottom=0)
        if len(series) > 1:
            axis.legend(fontsize=7)
    for axis in axes[1]:
        axis.set_xlabel("simulated day")
    figure.suptitle(f"soak: {result['case']}, cycle every {result['interval_s']:g} s, retention "
                    f"{result['audit_days']:g} d (dotted: steady from day {result['steady_from_day']})", fontsize=10)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", default="philly-b436b2-s4",
                        help="examples/corpus case (default: %(default)s: its last job ends 20.3 days after its first "
                             "submission, so copies 21 days apart hardly overlap and from the second copy on the "
                             "load is the same in each)")
    parser.add_argument("--days", type=int, default=90, help="simulated days (default: %(default)s)")
    parser.add_argument("--interval-s", type=float, default=1200.0, help="cycle interval, simulated (default: %(default)s)")
    parser.add_argument("--period-days", type=float, default=21.0,
                        help="a copy of the case every this many days (default: %(default)s: offered load 4.0 x "
                             "3.4/21 = 0.65)")
    parser.add_argument("--lookback-days", type=float, default=14.0,
                        help="accounting.lookback_days (default: %(default)s; the built-in 30 would leave fewer steady days)")
    parser.add_argument("--audit-days", type=float, default=14.0,
                        help="retention of the audit and cycle rows (default: %(default)s, so that it fills early)")
    parser.add_argument("--steady-from-day", type=int, default=43,
                        help="fit the growth from this day (default: %(default)s: after two copies; the 14-day windows "
                             "are full and the first copy's jobs have ended)")
    parser.add_argument("--judge", type=judged_series, default=SERIES, metavar="SERIES,...",
                        help="the series whose verdict sets the exit code (default: all of them); a short run names "
                             "the ones its few steady days can fit")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder for soak.json, soak.png (default: bench/results)")
    parser.add_argument("--verbose", "-v", action="store_true", help="print each day as it closes")
    args = parser.parse_args(argv)
    if args.verbose:
        print(HEADER, flush=True)
    result = run(args)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "soak.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.results / "soak.png")
    print(report_text(result))
    print(f"wrote {args.results / 'soak.json'}, {args.results / 'soak.png'}")
    verdicts = [result["trend"][name] for name in args.judge]
    return 1 if "grows" in verdicts or None in verdicts else 0


def judged_series(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in SERIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"not a series: {', '.join(unknown) or text!r} (known: {', '.join(SERIES)})")
    return names


if __name__ == "__main__":
    sys.exit(main())
