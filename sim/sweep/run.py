"""Running a sweep's unfinished cells: by local processes, or submitted as one Slurm job array."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dike_slurm.errors import InputError, SlurmError
from dike_slurm.sim.sweep.plan import SCRIPT_FILE, log_file, read_plan
from dike_slurm.sim.sweep.spec import DEFAULT_MAX_PARALLEL
from dike_slurm.sim.sweep.status import cell_states, unfinished_ids


def run_local(out: Path, workers: int, *, python: str | None = None,
              on_done: Callable[[int, int, int], None] | None = None) -> dict:
    """Run the unfinished cells in `workers` local processes, each `sweep run DIR ID` with its
    output appended to logs/cell-ID.log, exactly as an array task does."""
    out = out.resolve()
    if workers < 1:
        raise InputError("--local/-j needs at least 1 process")
    todo = unfinished_ids(out)
    python = python or sys.executable
    codes: dict[int, int] = {}
    started = time.perf_counter()

    def one(cell_id: int) -> int:
        with (out / log_file(cell_id)).open("ab") as log:
            proc = subprocess.run([python, "-m", "dike_slurm", "sweep", "run", str(out), str(cell_id)],
                                  stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, check=False)
            if proc.returncode < 0:  # as slurmstepd does for a killed task: say so in the log
                name = signal.Signals(-proc.returncode).name if -proc.returncode in signal.valid_signals() else -proc.returncode
                log.write(f"dike-slurm sweep local: cell {cell_id} killed by signal {name}\n".encode())
        return proc.returncode

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for cell_id, code in zip(todo, pool.map(one, todo)):
            codes[cell_id] = code
            if on_done is not None:
                on_done(cell_id, code, len(todo))
    return {"ran": todo, "exit_codes": codes, "workers": workers, "wall_s": round(time.perf_counter() - started, 2)}


def compress_ids(ids: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2,5,7-8" (sbatch --array syntax)."""
    parts, run = [], []
    for value in sorted(ids):
        if run and value == run[-1] + 1:
            run.append(value)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [value]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def submit_argv(out: Path, ids: Sequence[int], max_parallel: int, sbatch: str = "sbatch") -> list[str]:
    """The sbatch command line (an argv list: no shell) for these cells of the array."""
    return [sbatch, "--parsable", f"--array={compress_ids(ids)}%{max_parallel}", str(out.resolve() / SCRIPT_FILE)]


def submit(out: Path, *, sbatch: str = "sbatch", env: dict | None = None) -> dict:
    """Submit the unfinished cells as one job array; returns the job id and the cells.

    Cells that are started but have no result are left out when a task may still run them;
    they are submitted again once they are older than the array's time limit.
    """
    out = out.resolve()
    plan = read_plan(out)
    _, states = cell_states(out)
    limit_s = _script_time_s(out)
    now = time.time()
    ids = []
    for entry in states:
        if entry["state"] == "ok":
            continue
        if entry["state"] == "started" and now - float(entry["started"].get("at", 0)) < limit_s:
            continue
        ids.append(entry["id"])
    if not ids:
        return {"job_id": None, "cells": [], "argv": []}
    argv = submit_argv(out, ids, _script_max_parallel(out), sbatch)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    except FileNotFoundError:
        raise SlurmError(f"{sbatch}: command not found (give --sbatch PATH)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{sbatch} did not answer within 60 s") from None
    if proc.returncode != 0:
        raise SlurmError(f"sbatch failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    job_id = proc.stdout.strip().split(";", 1)[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id: {proc.stdout.strip()!r}")
    return {"job_id": int(job_id), "cells": ids, "argv": argv, "sweep": plan["name"]}


def _script_option(out: Path, option: str) -> str | None:
    try:
        text = (out / SCRIPT_FILE).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read the array script: {exc.strerror}", source=str(out / SCRIPT_FILE)) from None
    match = re.search(rf"^#SBATCH --{option}=(\S+)$", text, re.MULTILINE)
    return match.group(1) if match else None


def _script_max_parallel(out: Path) -> int:
    array = _script_option(out, "array") or ""
    _, _, limit = array.partition("%")
    return int(limit) if limit.isdigit() else DEFAULT_MAX_PARALLEL


def _script_time_s(out: Path) -> float:
    text = _script_option(out, "time") or "0:00:00"
    hours, minutes, seconds = (int(part) for part in text.split(":"))
    return hours * 3600.0 + minutes * 60.0 + seconds
