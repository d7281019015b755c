"""How long `dike-slurm` takes to start, as a ratio to `python -c pass` (docs/benchmarks.md).

    .venv/bin/python bench/cli_start.py [--repeat 7] [--out bench/results/cli_start.json]

Runs `--help`, `status`, `breaker status` and `explain JOB` as an admin would, in fresh
interpreters, against stand-in Slurm commands (shell scripts printing a small synthetic queue:
20 pending, 10 running, 16 nodes, so that the figure is the start and not the table) and a
fresh state store. Wall seconds, best of --repeat;
`python -c pass` is measured between the commands' runs, so the ratio is taken on the machine
as it was at the time. A second floor, `libraries`, imports what any command with an option
needs before it does anything (typer, which coerces options with pydantic, and rich). Also
prints the heavy modules each command leaves imported.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from cycle import topology_conf  # noqa: E402
from synthetic import Size, slurm_json  # noqa: E402

SIZE = Size(20, 10, 16)
LIBRARIES = "import typer._adapters, rich.console, rich.table, pydantic.main"
HEAVY = ("numpy", "pandas", "matplotlib", "jinja2", "prometheus_client", "dike_slurm.sim")
STUB = """#!/bin/sh
case "$(basename "$0") $1" in
  "squeue --json") cat {dir}/squeue.json ;;
  "squeue -h") cat {dir}/switches.txt ;;
  "sinfo --json") cat {dir}/sinfo.json ;;
  "sprio -h") cat {dir}/sprio.txt ;;
  "sacct --allusers") ;;
  *) echo "unexpected: $0 $*" >&2; exit 1 ;;
esac
"""
# Runs one command in this interpreter as the console script does, then lists the heavy modules.
PROBE = """import runpy, sys
sys.argv = ['dike-slurm', *sys.argv[1:]]
try:
    runpy.run_module('dike_slurm', run_name='__main__')
except SystemExit:
    pass
finally:
    print('\\nHEAVY=' + ','.join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr)
"""


def stand_in_slurm(folder: Path) -> tuple[Path, int]:
    """Stub Slurm commands and a configuration using them; also a pending job's id."""
    squeue, sinfo = slurm_json(SIZE)
    jobs = json.loads(squeue)["jobs"]
    pending = [j for j in jobs if j["job_state"] == "PENDING"]
    (folder / "squeue.json").write_text(squeue)
    (folder / "sinfo.json").write_text(sinfo)
    (folder / "switches.txt").write_text("".join(f"{j['job_id']}|0|00:00:00|\n" for j in pending))
    (folder / "sprio.txt").write_text("".join(f"{j['job_id']}|0|{j['priority']}\n" for j in pending))
    (folder / "topology.conf").write_text(topology_conf(SIZE.nodes))
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for name in ("squeue", "sinfo", "sprio", "sacct", "scontrol"):
        script = bin_dir / name
        script.write_text(STUB.format(dir=folder))
        script.chmod(0o755)
    config = folder / "dike.toml"
    config.write_text(f'[engine]\nstate_db = "{folder}/state.sqlite"\n'
                      f'[slurm]\nbin_dir = "{bin_dir}"\ntopology_conf = "{folder}/topology.conf"\n')
    return config, pending[0]["job_id"]


def wall(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stderr}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "cli_start.json")
    args = parser.parse_args(argv)
    python = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        config, job_id = stand_in_slurm(Path(tmp))
        env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "DIKE_CONFIG": str(config)}
        commands = {
            "--help": ["--help"],
            "status": ["status"],
            "breaker status": ["breaker", "status"],
            "explain": ["explain", str(job_id)],
        }
        floor = libraries = math.inf
        best = {name: math.inf for name in commands}
        for _ in range(args.repeat):
            floor = min(floor, wall([python, "-c", "pass"], env))
            libraries = min(libraries, wall([python, "-c", LIBRARIES], env))
            for name, words in commands.items():
                best[name] = min(best[name], wall([python, "-m", "dike_slurm", *words], env))
        heavy = {}
        for name, words in commands.items():
            probe = subprocess.run([python, "-c", PROBE.format(heavy=HEAVY), *words],
                                   capture_output=True, text=True, env=env)
            heavy[name] = probe.stderr.rsplit("HEAVY=", 1)[-1].strip().split(",") if "HEAVY=" in probe.stderr else ["?"]
    results = {
        "python": sys.version.split()[0], "repeat": args.repeat, "python_c_pass_s": round(floor, 4),
        "libraries_s": round(libraries, 4), "libraries_ratio": round(libraries / floor, 1),
        "commands": {name: {"seconds": round(best[name], 4), "ratio": round(best[name] / floor, 1),
                            "heavy_modules": [m for m in heavy[name] if m]} for name in commands},
    }
    print(f"python -c pass: {floor:.3f} s (best of {args.repeat}); "
          f"libraries (typer, pydantic, rich): {libraries:.3f} s {libraries / floor:.1f}x")
    for name, row in results["commands"].items():
        print(f"dike-slurm {name:15} {row['seconds']:.3f} s  {row['ratio']:5.1f}x  "
              f"heavy: {', '.join(row['heavy_modules']) or '-'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
