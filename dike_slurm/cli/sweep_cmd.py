"""`dike-slurm sweep plan|submit|local|run|status|merge`: grids of replays, on Slurm or locally.

Each command parses, calls one function of dike_slurm.sim.sweep, and renders (or prints JSON).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

import typer

from dike_slurm.cli.group import app, console, err_console
from dike_slurm.errors import InputError

sweep_app = typer.Typer(
    help="Grids of replays (policies x parameters x penalties x seeds x dumps), as a Slurm job array or locally.",
    no_args_is_help=True,
)
app.add_typer(sweep_app, name="sweep")

JSON_OPTION = typer.Option(False, "--json", help="print one JSON document")
SBATCH_OPTION = typer.Option(None, "--sbatch", metavar="PATH", help="the sbatch command (default: sbatch on PATH)")


def _print(text: str) -> None:
    console.print(text, highlight=False, markup=False, soft_wrap=True)


def _json(document: dict) -> None:
    print(json.dumps(document, indent=2, default=str))


def _sbatch(path: Optional[str]) -> str:
    if path:
        return path
    found = shutil.which("sbatch")
    if found is None:
        raise InputError("sbatch is not on PATH: give --sbatch PATH, or run the cells with `sweep local`")
    return found


@sweep_app.command("plan")
def plan_command(
    spec: Path = typer.Argument(..., metavar="SPEC", help="the sweep's SPEC.toml (docs/sweeps.md)"),
    out: Path = typer.Option(..., "--out", metavar="DIR", help="the sweep folder (cells, results, logs, merge)"),
    submit: bool = typer.Option(False, "--submit", help="submit the array with sbatch and print its job id"),
    local: Optional[int] = typer.Option(None, "--local", min=1, metavar="N", help="run the cells here in N processes (no Slurm)"),
    sbatch: Optional[str] = SBATCH_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Expand SPEC into one cell per replay and write DIR (again: keeps the finished cells)."""
    from dike_slurm.sim.sweep.plan import SCRIPT_FILE, write_plan
    from dike_slurm.sim.sweep.run import submit as submit_array
    from dike_slurm.sim.sweep.spec import load_spec

    if submit and local is not None:
        raise InputError("give --submit or --local, not both")
    loaded = load_spec(spec)
    plan = write_plan(loaded, out)
    document: dict = {"sweep": plan.name, "folder": str(plan.out), "cells": plan.cells, "resumed": not plan.created,
                      "mem_mb": plan.mem_mb, "time_min": plan.time_min, "script": str(plan.out / SCRIPT_FILE)}
    if submit:
        document["submitted"] = submit_array(plan.out, sbatch=_sbatch(sbatch))
    elif local is not None:
        document["local"] = _run_local(plan.out, local, quiet=as_json)
    if as_json:
        _json(document)
        return
    _print(f"sweep {plan.name}: {plan.cells} cells in {plan.out}"
           + (" (this sweep was already planned here: finished cells are kept)" if not plan.created else ""))
    if submit:
        _print_submitted(document["submitted"], plan.out)
    elif local is not None:
        _print_local(document["local"], plan.out)
    else:
        _print(f"array script {document['script']} ({plan.mem_mb} MB and {plan.time_min} min per task):")
        _print(plan.script)
        _print(f"submit it with `dike-slurm sweep submit {plan.out}` (only the unfinished cells), "
               f"or run it here with `dike-slurm sweep local {plan.out} -j N`")


@sweep_app.command("submit")
def submit_command(
    sweep_dir: Path = typer.Argument(..., metavar="DIR", help="a planned sweep folder"),
    sbatch: Optional[str] = SBATCH_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Submit DIR's unfinished cells (missing or failed) as one Slurm job array."""
    from dike_slurm.sim.sweep.run import submit

    submitted = submit(sweep_dir, sbatch=_sbatch(sbatch))
    if as_json:
        _json(submitted)
        return
    _print_submitted(submitted, sweep_dir.resolve())


def _print_submitted(submitted: dict, out: Path) -> None:
    from dike_slurm.sim.sweep.run import compress_ids

    if submitted["job_id"] is None:
        _print("nothing to submit: every cell has a result (or is still running)")
        return
    _print(f"submitted job array {submitted['job_id']}: {len(submitted['cells'])} cells "
           f"({compress_ids(submitted['cells'])}); progress: dike-slurm sweep status {out}")
    print(submitted["job_id"])


@sweep_app.command("local")
def local_command(
    sweep_dir: Path = typer.Argument(..., metavar="DIR", help="a planned sweep folder"),
    jobs: int = typer.Option(2, "--jobs", "-j", min=1, metavar="N", help="local processes"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Run DIR's unfinished cells here in N processes, as the array's tasks would (no Slurm)."""
    result = _run_local(sweep_dir, jobs, quiet=as_json)
    if as_json:
        _json(result)
        return
    _print_local(result, sweep_dir.resolve())


def _run_local(out: Path, workers: int, *, quiet: bool) -> dict:
    from dike_slurm.sim.sweep.plan import log_file
    from dike_slurm.sim.sweep.run import run_local

    done = {"count": 0}

    def on_done(cell_id: int, code: int, total: int) -> None:
        done["count"] += 1
        if not quiet:
            word = {0: "ok", 1: "FAILED"}.get(code, f"exit {code} (see {log_file(cell_id)})")
            err_console.print(f"[{done['count']}/{total}] cell {cell_id}: {word}", highlight=False, markup=False)

    return run_local(out, workers, on_done=on_done)


def _print_local(result: dict, out: Path) -> None:
    failed = sorted(cell for cell, code in result["exit_codes"].items() if code != 0)
    _print(f"ran {len(result['ran'])} cells in {result['wall_s']:.1f} s with {result['workers']} process(es)"
           + (f"; not ok: {', '.join(map(str, failed))}" if failed else ""))
    _print(f"merge them with `dike-slurm sweep merge {out}`")


@sweep_app.command("run")
def run_command(
    sweep_dir: Path = typer.Argument(..., metavar="DIR", help="a planned sweep folder"),
    task_id: int = typer.Argument(..., metavar="TASK_ID", help="the cell ($SLURM_ARRAY_TASK_ID in the array)"),
) -> None:
    """Run one cell (what each array task calls); a cell with a result of status ok is skipped."""
    from dike_slurm.sim.sweep.cell import run_cell, start_line

    outcome = run_cell(
        sweep_dir, task_id, on_start=lambda where: print(start_line(task_id, where), flush=True))
    if outcome.status == "skipped":
        _print(f"cell {task_id}: already done, skipped")
    elif outcome.status == "ok":
        _print(f"cell {task_id}: ok in {outcome.wall_s:.1f} s")
    else:
        err_console.print(f"cell {task_id} failed: {outcome.error}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1)


@sweep_app.command("status")
def status_command(
    sweep_dir: Path = typer.Argument(..., metavar="DIR", help="a sweep folder"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Progress read from the cells' files (not from Slurm): ok, failed, started, missing."""
    from rich.table import Table

    from dike_slurm.sim.sweep.status import status

    state = status(sweep_dir)
    if as_json:
        _json(state)
        return
    counts = state["counts"]
    _print(f"sweep {state['sweep']}: {counts['ok']}/{state['cells']} ok, {counts['failed']} failed, "
           f"{counts['started']} started (running, or killed: see the log), {counts['missing']} not started"
           f"; {state['cell_wall_s']:.0f} s of replay in the finished cells")
    if state["unfinished"]:
        table = Table(title="cells not done")
        for column in ("cell", "state", "log", "detail"):
            table.add_column(column, overflow="fold")
        for cell in state["unfinished"][:50]:
            detail = cell.get("error") or (f"{cell.get('slurm_job') or ''} on {cell.get('host')}" if cell["state"] == "started" else "")
            table.add_row(str(cell["id"]), cell["state"], cell["log"], detail)
        console.print(table, markup=False, highlight=False)
        if len(state["unfinished"]) > 50:
            _print(f"... and {len(state['unfinished']) - 50} more (--json lists all)")


@sweep_app.command("merge")
def merge_command(
    sweep_dir: Path = typer.Argument(..., metavar="DIR", help="a sweep folder"),
    as_json: bool = JSON_OPTION,
) -> None:
    """Combine the finished cells: merge/merged.json, merge/summary.csv, merge/report.md; best per metric."""
    from rich.table import Table

    from dike_slurm.sim.sweep.merge import format_metric, merge, write_merge
    from dike_slurm.sim.sweep.spec import share_text

    document = merge(sweep_dir)
    files = write_merge(sweep_dir, document)
    if as_json:
        _json(document)
        return
    counts = document["counts"]
    _print(f"sweep {document['sweep']['name']}: {counts['ok']} ok, {counts['failed']} failed, "
           f"{counts['missing']} missing of {document['sweep']['cells']} cells")
    groups: dict[tuple, list[dict]] = {}
    for best in document["best"]:
        groups.setdefault((best["input"], best["comm_penalty"], best["preemptible"]), []).append(best)
    for (name, penalty, share), bests in groups.items():
        table = Table(title=f"best per metric: {name}, penalty {penalty:g}, preemptible {share_text(share)} (seed means)")
        for column in ("metric", "best", "value"):
            table.add_column(column, overflow="fold")
        for best in bests:
            table.add_row(f"{best['metric']} ({best['better']})", ", ".join(best["labels"]),
                          format_metric(best["metric"], best["value"]))
        console.print(table, markup=False, highlight=False)
    for title, cells in (("failed cells", document["failed"]), ("missing cells", document["missing"])):
        if cells:
            table = Table(title=title)
            for column in ("cell", "variant", "error" if title == "failed cells" else "started", "log"):
                table.add_column(column, overflow="fold")
            for cell in cells:
                third = cell["error"] if "error" in cell else ("yes (killed?)" if cell["started"] else "no")
                table.add_row(str(cell["id"]), cell["label"], third, cell["log"])
            console.print(table, markup=False, highlight=False)
    if "tune" in document:
        _print(document["tune"]["answer"])
    _print(f"wrote {files['json']}, {files['csv']} and {files['report']}")
