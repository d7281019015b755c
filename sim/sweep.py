"""Sweeps: a grid of replays (inputs x policy variants x penalties x seeds), one cell per replay.

`dike-slurm sweep` (dike_slurm/cli/sweep_cmd.py) is a thin layer over this module:

- `load_spec` reads a SPEC.toml, `expand` turns it into cells (deterministic order and keys);
- `write_plan` writes a sweep folder: plan.json, cells/NNNN.json, the sbatch array script;
- `run_cell` runs one cell (what each array task calls) and writes results/NNNN.json by
  write-then-rename, so a partial result is never taken for a finished one; a cell with a result
  of status ok is skipped, so running a cell again is harmless;
- `run_local` runs the unfinished cells in N local processes, `submit` as a Slurm job array;
- `status` reads the cells' files (never Slurm), `merge` combines the finished cells into one
  JSON, one CSV table and one report, listing failed and missing cells with their logs.

Nothing that depends on where or when a cell ran (host, wall time, job id) enters the merged
numbers: the same SPEC gives the same merged.json, run locally or on Slurm.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dike_slurm.errors import InputError, SlurmError

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
DEFAULT_MAX_PARALLEL = 32

# Text that goes into #SBATCH lines: sbatch parses those itself, so only plain words are allowed.
_SLURM_WORD = re.compile(r"^[A-Za-z0-9._,:+-]+$")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9._/+,:@=-]+$")  # no space, quote, % (a Slurm filename pattern) or $

TOP_KEYS = {"name", "config", "dump", "corpus", "policies", "grid", "variant", "penalties", "seeds",
            "preemptible", "replay", "slurm"}
SLURM_KEYS = {"partition", "account", "qos", "max_parallel", "mem_mb", "time_min", "cpus_per_task", "job_name"}
DUMP_KEYS = {"path", "slurm_conf", "topology", "name"}
VARIANT_KEYS = {"label", "policy", "params"}


# ------------------------------------------------------------------------------------ the SPEC


@dataclass(frozen=True)
class SweepInput:
    """A dump and the cluster it replays on (absolute paths)."""

    name: str
    dump: str
    slurm_conf: str
    topology: str | None = None


@dataclass(frozen=True)
class SweepVariant:
    """A policy as the sweep runs it: a label, the registry name, parameter overrides."""

    label: str
    policy: str
    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SlurmOptions:
    """How the array is submitted; None: estimated (mem, time) or the cluster's default."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    max_parallel: int = DEFAULT_MAX_PARALLEL
    mem_mb: int | None = None
    time_min: int | None = None
    cpus_per_task: int = 1
    job_name: str | None = None


@dataclass(frozen=True)
class Spec:
    """A validated SPEC: what the grid holds. `config` is the whole configuration, as data."""

    name: str
    inputs: tuple[SweepInput, ...]
    variants: tuple[SweepVariant, ...]
    penalties: tuple[float, ...]
    seeds: tuple[int, ...]
    preemptible: tuple[float | str, ...]  # shares, or "live" (the engine's opt-in rule)
    config: dict
    slurm: SlurmOptions = SlurmOptions()
    source: str = ""
    preset: dict | None = None  # e.g. {"kind": "tune", ...}: what `merge` adds for it


def share_text(share: float | str) -> str:
    """A cell's preemptible setting as text: a share ("0.5"), or "live" (the engine's opt-in rule)."""
    return share if isinstance(share, str) else f"{share:g}"


@dataclass(frozen=True)
class Cell:
    """One replay of the grid."""

    id: int
    input: SweepInput
    variant: SweepVariant
    comm_penalty: float
    seed: int
    preemptible: float | str

    def description(self) -> dict:
        return {
            "input": asdict(self.input),
            "label": self.variant.label,
            "policy": self.variant.policy,
            "params": self.variant.params,
            "comm_penalty": self.comm_penalty,
            "seed": self.seed,
            "preemptible": self.preemptible,
        }

    def key(self, config_sha: str) -> str:
        """What the cell computes, hashed: the same key means the same numbers."""
        return _sha({"cell": self.description(), "config": config_sha})[:16]


def _sha(value: Any) -> str:
    return hashlib.sha256(_canonical(value).encode("utf-8")).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def load_spec(path: Path) -> Spec:
    """Read and check a SPEC.toml; every error names the file and the key."""
    source = str(path)
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise InputError("no such file", source=source) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", source=source) from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"not valid TOML: {exc}", source=source) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", source=source) from None
    return spec_from_data(data, base=path.resolve().parent, source=source)


def _fail(source: str, key: str, message: str) -> InputError:
    return InputError(f"{key}: {message}", source=source)


def _str_list(data: dict, key: str, source: str) -> list[str]:
    value = data.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _fail(source, key, "expected a list of names or paths")
    return value


def _number_list(data: dict, key: str, source: str, *, integer: bool = False) -> list | None:
    if key not in data:
        return None
    value = data[key]
    if not isinstance(value, list):
        value = [value]
    kinds = (int,) if integer else (int, float)
    if not value or not all(isinstance(v, kinds) and not isinstance(v, bool) for v in value):
        raise _fail(source, key, f"expected a non-empty list of {'integers' if integer else 'numbers'}")
    if not integer and any(not math.isfinite(v) or v < 0 for v in value):
        raise _fail(source, key, "values must be finite and >= 0")
    return list(dict.fromkeys(int(v) if integer else float(v) for v in value))


def _path(base: Path, text: str) -> Path:
    path = Path(text).expanduser()
    return (path if path.is_absolute() else base / path).resolve()


def spec_from_data(data: dict, *, base: Path, source: str) -> Spec:
    """The checks of load_spec on already parsed TOML (paths relative to `base`)."""
    from dike_slurm.config import ReplaySettings, load_config
    from dike_slurm.errors import ConfigError, RegistryError
    from dike_slurm.registry import default_registry
    from pydantic import ValidationError

    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise _fail(source, unknown[0], f"unknown key (known: {', '.join(sorted(TOP_KEYS))})")
    name = data.get("name", Path(source).stem or "sweep")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name):
        raise _fail(source, "name", "letters, digits, '.', '_' or '-' (at most 64)")

    # The configuration: the named file (never $DIKE_CONFIG nor DIKE_* variables: the SPEC alone
    # decides), with the SPEC's [replay] table on top.
    config_path = None
    if "config" in data:
        if not isinstance(data["config"], str):
            raise _fail(source, "config", "expected a path")
        config_path = _path(base, data["config"])
    replay = data.get("replay", {})
    if not isinstance(replay, dict):
        raise _fail(source, "replay", "expected a table")
    try:
        ReplaySettings.model_validate(replay)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = ".".join(["replay", *(str(p) for p in error["loc"])])
        raise _fail(source, key, "unknown key" if error["type"] == "extra_forbidden" else error["msg"]) from None
    try:
        config = load_config(config_path, environ={}, overrides={"replay": replay})
    except ConfigError as exc:
        raise _fail(source, "config", str(exc)) from None

    inputs = _inputs(data, base, source)
    registry = default_registry()
    policies = _str_list(data, "policies", source)
    grid = data.get("grid", {})
    if not isinstance(grid, dict):
        raise _fail(source, "grid", "expected a table of policies, e.g. [grid.dike]")
    variants: list[SweepVariant] = []
    for policy in dict.fromkeys(policies):
        try:
            params_model = registry.get(policy).Params
        except RegistryError as exc:
            raise _fail(source, "policies", str(exc)) from None
        if policy in grid:
            variants.extend(_grid_variants(policy, grid[policy], params_model, source))
        else:
            variants.append(SweepVariant(policy, policy, {}))
    for policy in grid:
        if policy not in policies:
            raise _fail(source, f"grid.{policy}", f"{policy!r} is not in policies")
    for where, raw in _tables(data, "variant", VARIANT_KEYS, source, "expected [[variant]] tables"):
        policy, params = raw.get("policy"), raw.get("params", {})
        if not isinstance(policy, str):
            raise _fail(source, f"{where}.policy", "expected a policy name")
        try:
            params_model = registry.get(policy).Params
        except RegistryError as exc:
            raise _fail(source, f"{where}.policy", str(exc)) from None
        if not isinstance(params, dict):
            raise _fail(source, f"{where}.params", "expected a table of parameters")
        for key in params:
            if key not in params_model.model_fields:
                raise _fail(source, f"{where}.params.{key}", f"policy {policy} has no parameter {key!r}")
        label = raw.get("label", policy)
        if not isinstance(label, str) or not label.strip():
            raise _fail(source, f"{where}.label", "expected a non-empty text")
        variants.append(SweepVariant(label, policy, dict(params)))
    if not variants:
        raise _fail(source, "policies", "give at least one policy (or a [[variant]])")
    seen: set[str] = set()
    for variant in variants:
        if variant.label in seen:
            raise _fail(source, "variant", f"two variants are labelled {variant.label!r}")
        seen.add(variant.label)

    penalties = _number_list(data, "penalties", source) or [config.replay.comm_penalty]
    seeds = _number_list(data, "seeds", source, integer=True) or [config.replay.seed]
    preemptible: list = _number_list(data, "preemptible", source) or [config.replay.preemptible]  # or "live"
    if any(p != "live" and p > 1 for p in preemptible):
        raise _fail(source, "preemptible", "shares must be between 0 and 1")
    return Spec(
        name=name, inputs=tuple(inputs), variants=tuple(variants), penalties=tuple(penalties),
        seeds=tuple(seeds), preemptible=tuple(preemptible), config=config.model_dump(mode="json"),
        slurm=_slurm_options(data.get("slurm", {}), source), source=source,
    )


def _tables(data: dict, name: str, keys: set[str], source: str, expected: str) -> Iterator[tuple[str, dict]]:
    """The SPEC's [[name]] tables as (`name[i]`, table); a non-list, a non-table or an unknown key
    is an error naming the key."""
    tables = data.get(name, [])
    if not isinstance(tables, list):
        raise _fail(source, name, expected)
    for index, raw in enumerate(tables):
        where = f"{name}[{index}]"
        if not isinstance(raw, dict):
            raise _fail(source, where, "expected a table")
        extra = sorted(set(raw) - keys)
        if extra:
            raise _fail(source, f"{where}.{extra[0]}", f"unknown key (known: {', '.join(sorted(keys))})")
        yield where, raw


def _inputs(data: dict, base: Path, source: str) -> list[SweepInput]:
    from dike_slurm.sim.evaluate import find_cases

    inputs: list[SweepInput] = []
    for where, raw in _tables(data, "dump", DUMP_KEYS, source,
                              "expected [[dump]] tables (path, slurm_conf, topology, name)"):
        paths = {}
        for key in ("path", "slurm_conf", "topology"):
            if key not in raw:
                if key == "topology":
                    continue
                raise _fail(source, f"{where}.{key}", "missing")
            if not isinstance(raw[key], str):
                raise _fail(source, f"{where}.{key}", "expected a path")
            paths[key] = _path(base, raw[key])
            if not paths[key].is_file():
                raise _fail(source, f"{where}.{key}", f"no such file: {paths[key]}")
        default = paths["path"].parent.name if paths["path"].stem == "sacct" else paths["path"].stem
        name = raw.get("name", default)
        if not isinstance(name, str) or not name:
            raise _fail(source, f"{where}.name", "expected a non-empty text")
        topology = paths.get("topology")
        inputs.append(SweepInput(name, str(paths["path"]), str(paths["slurm_conf"]), str(topology) if topology else None))
    folders = _str_list(data, "corpus", source)
    if folders:
        try:
            cases = find_cases([_path(base, folder) for folder in folders])
        except InputError as exc:
            raise _fail(source, "corpus", str(exc)) from None
        for case in cases:
            folder = case.folder.resolve()
            inputs.append(SweepInput(case.name, str(folder / "sacct.txt"), str(folder / "slurm.conf"),
                                     str(folder / "topology.conf")))
    if not inputs:
        raise _fail(source, "dump", "give at least one [[dump]] or a corpus folder")
    names = [i.name for i in inputs]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise _fail(source, "dump", f"two inputs are named {duplicate!r} (set dump.name)")
    return inputs


def _grid_variants(policy: str, axes: Any, params_model: Any, source: str) -> list[SweepVariant]:
    """One variant per combination of the axes, in the order the keys are written."""
    where = f"grid.{policy}"
    if not isinstance(axes, dict) or not axes:
        raise _fail(source, where, "expected a table of parameter lists")
    for key, values in axes.items():
        if key not in params_model.model_fields:
            raise _fail(source, f"{where}.{key}", f"policy {policy} has no parameter {key!r}")
        if not isinstance(values, list) or not values:
            raise _fail(source, f"{where}.{key}", "expected a non-empty list of values (one per grid point)")
    combinations: list[dict] = [{}]
    for key, values in axes.items():
        combinations = [{**combo, key: value} for combo in combinations for value in values]
    return [
        SweepVariant(f"{policy} " + ",".join(f"{k}={_canonical(v)}" for k, v in combo.items()), policy, combo)
        for combo in combinations
    ]


def _slurm_options(raw: Any, source: str) -> SlurmOptions:
    if not isinstance(raw, dict):
        raise _fail(source, "slurm", "expected a table")
    extra = sorted(set(raw) - SLURM_KEYS)
    if extra:
        raise _fail(source, f"slurm.{extra[0]}", f"unknown key (known: {', '.join(sorted(SLURM_KEYS))})")
    values: dict[str, Any] = {}
    for key in ("partition", "account", "qos", "job_name"):
        if key in raw:
            if not isinstance(raw[key], str) or not _SLURM_WORD.match(raw[key]):
                raise _fail(source, f"slurm.{key}", "letters, digits and . _ , : + - only")
            values[key] = raw[key]
    for key in ("max_parallel", "mem_mb", "time_min", "cpus_per_task"):
        if key in raw:
            if not isinstance(raw[key], int) or isinstance(raw[key], bool) or raw[key] < 1:
                raise _fail(source, f"slurm.{key}", "expected an integer >= 1")
            values[key] = raw[key]
    return SlurmOptions(**values)


def expand(spec: Spec) -> list[Cell]:
    """The grid in a fixed order: input, then variant, then penalty, then seed, then preemptible."""
    cells = []
    for sweep_input in spec.inputs:
        for variant in spec.variants:
            for penalty in spec.penalties:
                for seed in spec.seeds:
                    for share in spec.preemptible:
                        cells.append(Cell(len(cells), sweep_input, variant, penalty, seed, share))
    return cells


# ------------------------------------------------------------------------------------ the folder


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


def _json_text(value: Any) -> str:
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
    config_sha = _sha(spec.config)
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
            "inputs": [asdict(i) for i in spec.inputs],
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
        write_atomic(cell_file(out, cell.id), _json_text({"id": cell.id, "key": key, **cell.description()}))
    write_atomic(existing, _json_text(plan))
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


# ------------------------------------------------------------------------------------ one cell


@dataclass(frozen=True)
class CellOutcome:
    id: int
    status: str  # "ok", "failed", "skipped"
    error: str | None = None
    wall_s: float = 0.0


def read_cell(out: Path, cell_id: int, plan: dict) -> dict:
    cells = plan["cells"]
    if not 0 <= cell_id < cells:
        raise InputError(f"no cell {cell_id}: this sweep has cells 0-{cells - 1}", source=str(out))
    path = cell_file(out, cell_id)
    try:
        cell = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the cell: {exc}", source=str(path)) from None
    if cell.get("key") != plan["keys"][cell_id]:
        raise InputError("the cell does not match plan.json (edited by hand?)", source=str(path))
    return cell


def read_result(out: Path, cell_id: int, key: str) -> dict | None:
    """A cell's result, or None when there is none for this key (a stale or unreadable one counts as none)."""
    try:
        result = json.loads(result_file(out, cell_id).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(result, dict) or result.get("key") != key:
        return None
    return result


def _where() -> dict:
    job = os.environ.get("SLURM_ARRAY_JOB_ID")
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    return {
        "runner": "slurm" if job else "local",
        "slurm_job": f"{job}_{task}" if job else None,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def run_cell(out: Path, cell_id: int, *, on_start: Callable[[dict], None] | None = None) -> CellOutcome:
    """Run one cell unless it has a result of status ok; write its result by write-then-rename.

    Any failure of the replay itself (a bad parameter value, MemoryError, a bug) becomes a result
    of status failed with the error. A killed process (out of memory, time limit) leaves no
    result: `status`, `merge` and `submit` then read why from the cell's log (`killed_reason`).
    `on_start(where)` is called once the cell is marked started: the command prints the line
    that `killed_reason` looks after.
    """
    out = out.resolve()
    plan = read_plan(out)
    cell = read_cell(out, cell_id, plan)
    key = cell["key"]
    previous = read_result(out, cell_id, key)
    if previous is not None and previous.get("status") == "ok":
        return CellOutcome(cell_id, "skipped")
    where = _where()
    _write_state(started_file(out, cell_id), {"key": key, **where, "at": time.time()})
    if on_start is not None:
        on_start(where)
    started, cpu_started = time.perf_counter(), time.process_time()
    result: dict[str, Any] = {"id": cell_id, "key": key}
    try:
        summary, input_summary = _replay(plan, cell)
        result.update(status="ok", summary=summary, input_summary=input_summary)
    except Exception as exc:  # noqa: BLE001 - any failure of this cell is recorded, never spread
        result.update(status="failed", error=error_text(exc), traceback=traceback.format_exc(limit=-6))
    wall = time.perf_counter() - started
    result["run"] = {**where, "wall_s": round(wall, 3), "cpu_s": round(time.process_time() - cpu_started, 3)}
    _write_state(result_file(out, cell_id), result)
    started_file(out, cell_id).unlink(missing_ok=True)
    return CellOutcome(cell_id, result["status"], result.get("error"), wall)


def _write_state(path: Path, value: dict) -> None:
    try:
        write_atomic(path, _json_text(value))
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", source=str(path)) from None


def start_line(cell_id: int, where: dict) -> str:
    """What `sweep run` prints when a cell starts; a kill message after it belongs to this attempt."""
    job = f"Slurm job {where['slurm_job']}" if where.get("slurm_job") else f"pid {where.get('pid')}"
    return f"cell {cell_id}: started on {where.get('host')} ({job})"


# What Slurm (slurmstepd) or `sweep local` writes into the output of a killed task.
_KILLED = (
    (re.compile(r"oom[-_ ]kill|out[- ]of[- ]memory|exceeded (job )?memory limit", re.IGNORECASE), "out of memory"),
    (re.compile(r"DUE TO TIME LIMIT"), "time limit"),
    (re.compile(r"DUE TO NODE FAIL"), "node failure"),
    (re.compile(r"DUE TO PREEMPTION"), "preempted"),
    (re.compile(r"\*\*\* JOB \S+ ON \S+ CANCELLED"), "cancelled"),
    (re.compile(r"killed by signal (\w+)"), "signal"),
)
LOG_TAIL_BYTES = 65536


def killed_reason(out: Path, cell_id: int) -> str | None:
    """Why a started cell has no result, from its log after its last start line; None: no word
    of it (still running, or died silently)."""
    try:
        with (out / log_file(cell_id)).open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - LOG_TAIL_BYTES))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    marker = f"cell {cell_id}: started"
    if marker in text:
        text = text[text.rindex(marker):]
    for pattern, reason in _KILLED:
        match = pattern.search(text)
        if match:
            return f"{reason} {match.group(1)}" if reason == "signal" else reason
    return None


def error_text(exc: BaseException) -> str:
    """One line: the exception's type and message (a parameter's validation error names the key)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        message = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or '(value)'}: {error['msg']}" for error in exc.errors())
        return f"bad parameter: {message}"
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _replay(plan: dict, cell: dict) -> tuple[dict, dict]:
    from dike_slurm.config import Config
    from dike_slurm.sim.replay import load_input, run_policy, sim_settings

    config = Config.model_validate(plan["config"])
    source = cell["input"]
    topology = Path(source["topology"]) if source["topology"] else None
    replay_input = load_input(Path(source["dump"]), Path(source["slurm_conf"]), topology)
    settings = sim_settings(config, replay_input.conf, comm_penalty=cell["comm_penalty"], seed=cell["seed"],
                            preemptible=cell["preemptible"], source=source["slurm_conf"])
    run = run_policy(cell["policy"], replay_input, config, settings, params_override=cell["params"] or None)
    return dict(run.metrics.summary), replay_input.input_summary()


# ------------------------------------------------------------------------------------ state


def cell_states(out: Path) -> tuple[dict, list[dict]]:
    """The plan and, per cell, its state read from the files: ok, failed, started or missing."""
    out = out.resolve()
    plan = read_plan(out)
    states = []
    for cell_id, key in enumerate(plan["keys"]):
        result = read_result(out, cell_id, key)
        entry: dict[str, Any] = {"id": cell_id, "log": log_file(cell_id)}
        if result is not None and result.get("status") in ("ok", "failed"):
            entry["state"] = result["status"]
            entry["result"] = result
        elif started_file(out, cell_id).exists():
            entry["state"] = "started"
            try:
                entry["started"] = json.loads(started_file(out, cell_id).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                entry["started"] = {}
            reason = killed_reason(out, cell_id)
            if reason is not None:  # killed: it failed, with no result of its own
                entry["state"] = "failed"
                entry["result"] = {"status": "failed", "error": f"killed ({reason}); no result written"}
        else:
            entry["state"] = "missing"
        states.append(entry)
    return plan, states


def status(out: Path) -> dict:
    """Progress by the cells' files (not Slurm): counts, and the cells not done."""
    plan, states = cell_states(out)
    counts = {state: 0 for state in ("ok", "failed", "started", "missing")}
    for entry in states:
        counts[entry["state"]] += 1
    unfinished = [
        {"id": e["id"], "state": e["state"], "log": e["log"],
         **({"error": e["result"]["error"]} if e["state"] == "failed" else {}),
         **({"host": e["started"].get("host"), "slurm_job": e["started"].get("slurm_job")} if e["state"] == "started" else {})}
        for e in states if e["state"] != "ok"
    ]
    wall = [e["result"]["run"]["wall_s"] for e in states if e["state"] == "ok" and "run" in e["result"]]
    return {
        "sweep": plan["name"], "folder": str(out.resolve()), "cells": plan["cells"], "counts": counts,
        "done": counts["ok"] == plan["cells"], "cell_wall_s": round(sum(wall), 1), "unfinished": unfinished,
    }


def unfinished_ids(out: Path, *, include_started: bool = True) -> list[int]:
    """Cells without a result of status ok (failed ones are run again: a failure may be transient)."""
    _, states = cell_states(out)
    return [e["id"] for e in states if e["state"] != "ok" and (include_started or e["state"] != "started")]


# ------------------------------------------------------------------------------------ running


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


# ------------------------------------------------------------------------------------ merge


def _metric_table() -> list:
    from dike_slurm.sim.report_compare import METRICS

    return [m for m in METRICS if m.better]


def _mean(values: list) -> float | None:
    if any(v is None for v in values) or not values:
        return None
    return sum(values) / len(values)


def merge(out: Path) -> dict:
    """The finished cells in one document (deterministic: no host, time or job id in it)."""
    out = out.resolve()
    plan, states = cell_states(out)
    cells, failed, missing, inputs = [], [], [], {}
    for entry in states:
        description = {k: v for k, v in _read_json(cell_file(out, entry["id"])).items() if k not in ("key",)}
        description["input"] = description["input"]["name"]
        row = {**description, "status": entry["state"]}
        if entry["state"] == "ok":
            row["metrics"] = entry["result"]["summary"]
            inputs.setdefault(description["input"], entry["result"]["input_summary"])
        elif entry["state"] == "failed":
            row["error"] = entry["result"]["error"]
            failed.append({"id": entry["id"], "label": row["label"], "error": row["error"], "log": entry["log"]})
        else:
            row["status"] = "missing"
            missing.append({"id": entry["id"], "label": row["label"], "log": entry["log"],
                            "started": entry["state"] == "started"})
        cells.append(row)
    rows = _rows(cells)
    document = {
        "sweep": {"name": plan["name"], "cells": plan["cells"], "config_sha256": plan["config_sha256"],
                  "grid": plan["grid"]},
        "counts": {"ok": sum(c["status"] == "ok" for c in cells), "failed": len(failed), "missing": len(missing)},
        "inputs": {name: inputs[name] for name in sorted(inputs)},
        "cells": cells,
        "rows": rows,
        "best": _best(rows),
        "failed": failed,
        "missing": missing,
    }
    if plan.get("preset") and plan["preset"].get("kind") == "tune":
        document["tune"] = _tune_pick(plan["preset"], rows)
    return document


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read: {exc}", source=str(path)) from None


def _rows(cells: list[dict]) -> list[dict]:
    """One row per (input, variant, penalty, preemptible): the mean over its seeds, when all are ok."""
    groups: dict[tuple, list[dict]] = {}
    for cell in cells:
        groups.setdefault((cell["input"], cell["label"], cell["comm_penalty"], cell["preemptible"]), []).append(cell)
    rows = []
    for (name, label, penalty, share), members in groups.items():
        ok = [c for c in members if c["status"] == "ok"]
        row: dict[str, Any] = {"input": name, "label": label, "policy": members[0]["policy"],
                               "comm_penalty": penalty, "preemptible": share,
                               "seeds": [c["seed"] for c in members], "seeds_ok": len(ok)}
        if ok and len(ok) == len(members):
            row["metrics"] = {
                key: _mean([c["metrics"].get(key) for c in ok])
                for key, value in ok[0]["metrics"].items()
                if isinstance(value, (int, float)) and not isinstance(value, bool)
            }
        rows.append(row)
    return rows


def _best(rows: list[dict]) -> list[dict]:
    """Per (input, penalty, preemptible) and metric, the variant(s) with the best seed mean."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if "metrics" in row:
            groups.setdefault((row["input"], row["comm_penalty"], row["preemptible"]), []).append(row)
    best = []
    for (name, penalty, share), members in groups.items():
        for metric in _metric_table():
            scored = [(r["metrics"].get(metric.key), r["label"]) for r in members if r["metrics"].get(metric.key) is not None]
            if not scored:
                continue
            target = min(v for v, _ in scored) if metric.better == "lower" else max(v for v, _ in scored)
            best.append({"input": name, "comm_penalty": penalty, "preemptible": share, "metric": metric.key,
                         "better": metric.better, "value": target,
                         "labels": [label for value, label in scored if value == target],
                         "variants": len(members)})
    return best


def _tune_pick(preset: dict, rows: list[dict]) -> dict:
    """tune's answer: the candidate thresholds with the best average JCT."""
    candidates = {c["label"]: c["thresholds_gpuh"] for c in preset.get("candidates", [])}
    scored = [(r["metrics"]["avg_jct_s"], index, r["label"]) for index, r in enumerate(rows)
              if r["label"] in candidates and "metrics" in r and r["metrics"].get("avg_jct_s") is not None]
    if not scored:
        return {"best": None}
    _, _, label = min(scored)
    return {"best": label, "thresholds_gpuh": candidates[label]}


def write_merge(out: Path, document: dict) -> dict[str, Path]:
    """merge/merged.json, merge/summary.csv (a row per cell) and merge/report.md."""
    folder = out.resolve() / MERGE
    folder.mkdir(parents=True, exist_ok=True)
    files = {"json": folder / "merged.json", "csv": folder / "summary.csv", "report": folder / "report.md"}
    write_atomic(files["json"], _json_text(document))
    write_atomic(files["csv"], _csv(document))
    write_atomic(files["report"], report_markdown(document))
    return files


CSV_METRICS = ("avg_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s", "avg_wait_s", "makespan_s", "gpu_utilization",
               "avg_slowdown", "user_jain_index", "worst_user_slowdown", "preemptions",
               "heavy_consolidated_fraction", "preemption_lost_gpu_h")


def _csv(document: dict) -> str:
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["id", "input", "label", "policy", "comm_penalty", "seed", "preemptible", "status", "jobs",
                     *CSV_METRICS, "error"])
    for cell in document["cells"]:
        metrics = cell.get("metrics", {})
        writer.writerow([cell["id"], cell["input"], cell["label"], cell["policy"], repr(cell["comm_penalty"]),
                         cell["seed"], repr(cell["preemptible"]), cell["status"], metrics.get("jobs", ""),
                         *("" if metrics.get(k) is None else repr(metrics[k]) for k in CSV_METRICS),
                         cell.get("error", "")])
    return buffer.getvalue()


def format_metric(key: str, value: float | None) -> str:
    from dike_slurm.sim.report_compare import METRICS

    if value is None:
        return "-"
    for metric in METRICS:
        if metric.key == key:
            return metric.format(value)
    return f"{value:g}"


REPORT_METRICS = ("avg_jct_s", "p95_jct_s", "avg_wait_s", "gpu_utilization", "user_jain_index",
                  "worst_user_slowdown", "preemptions")


def report_markdown(document: dict) -> str:
    """The report: best per metric, the seed means per variant, failed and missing cells."""
    from dike_slurm.sim.report_compare import METRICS

    labels = {m.key: m.label for m in METRICS}
    sweep, counts = document["sweep"], document["counts"]
    lines = [f"# Sweep {sweep['name']}", "",
             f"{sweep['cells']} cells: {counts['ok']} ok, {counts['failed']} failed, {counts['missing']} missing. "
             "Rows are means over the seeds (a row needs all its seeds ok).", ""]
    groups: dict[tuple, list[dict]] = {}
    for row in document["rows"]:
        groups.setdefault((row["input"], row["comm_penalty"], row["preemptible"]), []).append(row)
    for (name, penalty, share), rows in groups.items():
        lines += [f"## {name}, comm penalty {penalty:g}, preemptible {share_text(share)}", "", "Best per metric:", "",
                  "| metric | best | value |", "|---|---|---|"]
        for best in document["best"]:
            if (best["input"], best["comm_penalty"], best["preemptible"]) == (name, penalty, share):
                lines.append(f"| {labels.get(best['metric'], best['metric'])} ({best['better']} is better) | "
                             f"{', '.join(best['labels'])} | {format_metric(best['metric'], best['value'])} |")
        lines += ["", "| variant | seeds ok | " + " | ".join(labels[k] for k in REPORT_METRICS) + " |",
                  "|---|---|" + "---|" * len(REPORT_METRICS)]
        for row in rows:
            metrics = row.get("metrics", {})
            lines.append(f"| {row['label']} | {row['seeds_ok']}/{len(row['seeds'])} | "
                         + " | ".join(format_metric(k, metrics.get(k)) for k in REPORT_METRICS) + " |")
        lines.append("")
    if document["failed"]:
        lines += ["## Failed cells", "", "| cell | variant | error | log |", "|---|---|---|---|"]
        for cell in document["failed"]:
            error = cell["error"].replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {cell['id']} | {cell['label']} | {error} | {cell['log']} |")
        lines.append("")
    if document["missing"]:
        lines += ["## Missing cells", "", "| cell | variant | started | log |", "|---|---|---|---|"]
        for cell in document["missing"]:
            lines.append(f"| {cell['id']} | {cell['label']} | {'yes (killed?)' if cell['started'] else 'no'} | {cell['log']} |")
        lines.append("")
    if "tune" in document and document["tune"].get("best"):
        thresholds = ", ".join(f"{t:g}" for t in document["tune"]["thresholds_gpuh"])
        lines += ["## tune", "", f"Best average JCT: {document['tune']['best']}; to use it:", "", "```toml",
                  "[policies.dike]", f"thresholds_gpuh = [{thresholds}]", "```", ""]
    return "\n".join(lines)
