"""A sweep folder: its layout, plan.json, one file per cell and the sbatch array script; files are
written beside and renamed, so a reader never sees a part of one."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dike_slurm.errors import InputError
from dike_slurm.sim.sweep.spec import Spec, content_sha, expand

PLAN_FILE = "plan.json"
SCRIPT_FILE = "sweep.sbatch"
CELLS = "cells"
RESULTS = "results"
LOGS = "logs"
MERGE = "merge"
FORMAT = 1  # plan.json's format; a folder of another format is refused

# Per-task resources, estimated from the largest dump of the sweep (docs/sweeps.md, "Sizing").
# Measured: a replay of the bundled sample (0.7 MB dump, 2,500 jobs) peaks at about 50 MB RSS and
# takes 6-30 s; a 1,000,000-job dump (about 290 MB) peaks at 995 MB (docs/benchmarks.md).
MEM_BASE_MB = 256
MEM_PER_DUMP_MB = 4
TIME_BASE_MIN = 10
TIME_PER_DUMP_MB_MIN = 5

_SAFE_PATH = re.compile(r"^[A-Za-z0-9._/+,:@=-]+$")  # no space, quote, % (a Slurm filename pattern) or $


def cell_file(out: Path, cell_id: int) -> Path:
    return out / CELLS / f"{cell_id:04d}.json"


def result_file(out: Path, cell_id: int) -> Path:
    return out / RESULTS / f"{cell_id:04d}.json"


def started_file(out: Path, cell_id: int) -> Path:
    return out / RESULTS / f"{cell_id:04d}.started"


def log_file(cell_id: int) -> str:
    """The cell's log, relative to the sweep folder (the array writes `logs/cell-%a.log`)."""
    return f"{LOGS}/cell-{cell_id}.log"


def write_atomic(path: Path, text: str) -> None:
    """Write beside, then rename: a reader sees the old file or the whole new one, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def json_text(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=False) + "\n"


@dataclass(frozen=True)
class Plan:
    """A written sweep folder."""

    out: Path
    name: str
    cells: int
    created: bool  # False: the folder already held this sweep (its results are kept)
    script: str
    mem_mb: int
    time_min: int


def estimate(spec: Spec) -> tuple[int, int]:
    """Memory (MB) and time (minutes) per task from the largest dump: see docs/sweeps.md."""
    largest = max(Path(i.dump).stat().st_size for i in spec.inputs) / 1e6
    mem = spec.slurm.mem_mb or 64 * math.ceil((MEM_BASE_MB + MEM_PER_DUMP_MB * largest) / 64)
    minutes = spec.slurm.time_min or math.ceil(TIME_BASE_MIN + TIME_PER_DUMP_MB_MIN * largest)
    return mem, minutes


def write_plan(spec: Spec, out: Path, *, python: str | None = None) -> Plan:
    """Write (or check and keep) the sweep folder: plan.json, one file per cell, the array script.

    A folder that holds the same cells keeps its results (that is how a sweep resumes); one that
    holds other cells is refused.
    """
    out = out.resolve()
    _check_folder(out)
    cells = expand(spec)
    config_sha = content_sha(spec.config)
    keys = [cell.key(config_sha) for cell in cells]
    mem_mb, time_min = estimate(spec)
    plan = {
        "format": FORMAT,
        "name": spec.name,
        "spec": spec.source,
        "config": spec.config,
        "config_sha256": config_sha,
        "cells": len(cells),
        "keys": keys,
        "grid": {
            "inputs": [i.as_dict() for i in spec.inputs],
            "variants": [asdict(v) for v in spec.variants],
            "penalties": list(spec.penalties),
            "seeds": list(spec.seeds),
            "preemptible": list(spec.preemptible),
        },
        "preset": spec.preset,
    }
    existing = out / PLAN_FILE
    created = True
    if existing.exists():
        old = read_plan(out)
        if old.get("keys") != keys:
            raise InputError(
                "this folder holds another sweep (its cells differ from this SPEC's); "
                "use another --out, or remove the folder", source=str(out))
        created = False
    try:
        for sub in (CELLS, RESULTS, LOGS):
            (out / sub).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the sweep folder: {exc.strerror}", source=str(out)) from None
    for cell, key in zip(cells, keys):
        write_atomic(cell_file(out, cell.id), json_text({"id": cell.id, "key": key, **cell.description()}))
    write_atomic(existing, json_text(plan))
    script = array_script(spec, out, len(cells), mem_mb, time_min, python or sys.executable)
    write_atomic(out / SCRIPT_FILE, script)
    return Plan(out, spec.name, len(cells), created, script, mem_mb, time_min)


def _check_folder(out: Path) -> None:
    if not _SAFE_PATH.match(str(out)):
        raise InputError("the sweep folder's path must be plain (letters, digits, / . _ - + , : @ =): "
                         "sbatch reads it from an #SBATCH line", source=str(out))


def read_plan(out: Path) -> dict:
    path = out / PLAN_FILE
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("not a sweep folder (no plan.json): run `dike-slurm sweep plan SPEC --out DIR` first",
                         source=str(out)) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read: {exc}", source=str(path)) from None
    if not isinstance(plan, dict) or plan.get("format") != FORMAT:
        raise InputError(f"not a sweep plan of format {FORMAT}", source=str(path))
    return plan


def array_script(spec: Spec, out: Path, cells: int, mem_mb: int, time_min: int, python: str) -> str:
    """The sbatch script: one array task per cell, each `sweep run DIR $SLURM_ARRAY_TASK_ID`."""
    _check_folder(out)
    options = spec.slurm
    job_name = options.job_name or f"dike-sweep-{spec.name}"
    hours, minutes = divmod(time_min, 60)
    lines = [
        "#!/bin/bash",
        f"# dike-slurm sweep {spec.name}: {cells} cells; written by `dike-slurm sweep plan`.",
        f"# Memory and time per task: estimated from the largest dump ({MEM_BASE_MB} MB + {MEM_PER_DUMP_MB} x its size;",
        f"# {TIME_BASE_MIN} min + {TIME_PER_DUMP_MB_MIN} min per MB), or [slurm] mem_mb / time_min: docs/sweeps.md.",
        "# `sweep submit` passes --array with the unfinished cells only; each task skips a finished cell.",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --array=0-{cells - 1}%{options.max_parallel}",
        "#SBATCH --ntasks=1",
        f"#SBATCH --cpus-per-task={options.cpus_per_task}",
        f"#SBATCH --mem={mem_mb}M",
        f"#SBATCH --time={hours}:{minutes:02d}:00",
        f"#SBATCH --output={out}/{LOGS}/cell-%a.log",
        "#SBATCH --open-mode=append",
    ]
    for key in ("partition", "account", "qos"):
        value = getattr(options, key)
        if value:
            lines.append(f"#SBATCH --{key}={value}")
    run = [python, "-m", "dike_slurm", "sweep", "run", str(out)]
    lines += ["", f'exec {shlex.join(run)} "$SLURM_ARRAY_TASK_ID"', ""]
    return "\n".join(lines)
