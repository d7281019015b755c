"""How `decide` of every live policy scales with the queue: a table, JSON and the fitted exponent.

Usage: python bench/policy_scale.py [--out bench/results] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from dike_slurm.registry import default_registry  # noqa: E402
from synthetic import SIZES, snapshot  # noqa: E402

POLICIES = ("fifo", "multifactor", "tiresias", "dike")


def fitted_exponent(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(x)."""
    lx = [math.log(x) for x in xs]
    ly = [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def measure(repeat: int) -> dict:
    registry = default_registry()
    results: dict = {"sizes": [], "policies": {}}
    for size in SIZES:
        snap = snapshot(size)
        results["sizes"].append({"pending": size.pending, "running": size.running, "nodes": size.nodes})
        for name in POLICIES:
            policy = registry.create(name)
            params = policy.Params()
            best = math.inf
            for _ in range(repeat):
                started = time.perf_counter()
                policy.decide(snap, params, random.Random(0))
                best = min(best, time.perf_counter() - started)
            results["policies"].setdefault(name, []).append(best)
    pending = [s["pending"] for s in results["sizes"]]
    results["exponents"] = {name: fitted_exponent(pending, times) for name, times in results["policies"].items()}
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    results = measure(args.repeat)
    table = Table(title="decide() time, best of %d (s)" % args.repeat)
    table.add_column("policy")
    for s in results["sizes"]:
        table.add_column(f"{s['pending']} x {s['running']} x {s['nodes']}", justify="right")
    table.add_column("exponent", justify="right")
    for name, times in results["policies"].items():
        table.add_row(name, *(f"{t:.3f}" for t in times), f"{results['exponents'][name]:.2f}")
    Console().print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "policy_scale.json").write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
