"""One cell of a sweep, as an array task or a local process runs it: its replay, its result written
by write-then-rename (a cell with a result of status ok is skipped), and why a killed one has none."""

from __future__ import annotations

import json
import os
import re
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dike_slurm.errors import InputError
from dike_slurm.sim.sweep.plan import (cell_file, json_text, log_file, read_plan, result_file, started_file,
                                       write_atomic)


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
        write_atomic(path, json_text(value))
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
    from dike_slurm.sim.kernel.replay import load_input, run_policy, sim_settings

    config = Config.model_validate(plan["config"])
    source = cell["input"]
    topology = Path(source["topology"]) if source["topology"] else None
    history = Path(source["history"]) if source.get("history") else None  # plans written before it have none
    replay_input = load_input(Path(source["dump"]), Path(source["slurm_conf"]), topology, history)
    settings = sim_settings(config, replay_input.conf, comm_penalty=cell["comm_penalty"], seed=cell["seed"],
                            preemptible=cell["preemptible"], source=source["slurm_conf"])
    run = run_policy(cell["policy"], replay_input, config, settings, params_override=cell["params"] or None)
    return dict(run.metrics.summary), replay_input.input_summary()
