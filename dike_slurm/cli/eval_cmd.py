"""`dike-slurm eval`: replay a corpus of cases under every policy (sim/eval/evaluate.py runs, sim/eval/eval_report.py tabulates)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer

from dike_slurm.cli.group import app, console, err_console
from dike_slurm.cli.progress import LazyProgress


@app.command("eval")
def eval_command(
    corpus: Optional[List[Path]] = typer.Argument(
        None, metavar="CORPUS",
        help="corpus folders (one case per sub-folder) or case folders (sacct.txt, slurm.conf, topology.conf)",
    ),
    out: Path = typer.Option(Path("out/eval"), "--out", metavar="DIR", help="folder for eval.json, results.md, report.html (replaced)"),
    workers: int = typer.Option(2, "--workers", min=1, metavar="N", help="replays run in parallel"),
    quick: bool = typer.Option(False, "--quick", help="penalty 1, all preemptible, only fifo, srtf_preemptive and dike"),
    variant: Optional[List[str]] = typer.Option(None, "--variant", metavar="NAME", help="run only these policies (repeat; fifo always runs)"),
    twins: bool = typer.Option(True, "--twins/--no-twins", help="also replay each one-type case with users and job names shuffled across its jobs"),
    config_path: Optional[Path] = typer.Option(None, "--config", metavar="FILE", help="a config file (default: built-in defaults only)"),
    targets: Optional[Path] = typer.Option(None, "--targets", metavar="FILE", help="the acceptance targets (default: the corpus's targets.toml, beside its cases)"),
    results: Optional[Path] = typer.Option(None, "--results", metavar="FILE", help="also replace the generated section of this file (docs/results.md)"),
    html: bool = typer.Option(True, "--html/--no-html", help="write report.html with a plot"),
    as_json: bool = typer.Option(False, "--json", help="print eval.json instead of tables"),
) -> None:
    """Replay every case under every policy (penalty 0; penalty 1 with none, half and every job
    preemptible): tables against fifo and multifactor, targets, JSON and a report."""
    from dike_slurm.sim.eval import eval_report, evaluate

    folders = corpus or [Path("examples/corpus"), Path("examples/sample")]
    plan = evaluate.make_plan(folders, quick=quick, only=variant or (), twins=twins, targets=targets)
    config = evaluate.load_config(config_path)
    if results is not None:
        eval_report.check_results_file(results)
    for reason in plan.skipped:
        err_console.print(f"skipped {reason}", highlight=False, markup=False)
    err_console.print(f"{len(plan.cases)} cases, {plan.runs()} replays, {workers} workers", highlight=False)
    command = shlex.join(["dike-slurm", *sys.argv[1:]])
    progress = _EvalProgress()
    try:
        result = evaluate.evaluate(plan, config, workers=workers, command=command,
                                   log=lambda line: err_console.print(line, highlight=False, markup=False),
                                   on_progress=progress)
    finally:
        progress.close()
    try:
        table_list = eval_report.write_outputs(result, out, results_md=results, html=html)
    except Exception:
        saved = out.with_name(out.name + ".unrendered.json")  # hours of replays are not thrown away
        saved.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
        err_console.print(f"rendering failed; the replays' numbers are in {saved}", highlight=False, markup=False)
        raise
    if "html_error" in result:
        err_console.print(f"report.html not written: {result['html_error']}", highlight=False, markup=False)
    if as_json:
        console.print_json(json.dumps(result, default=str))
        return
    _print_tables(table_list)
    console.print(eval_report.LEGEND, markup=False, highlight=False)
    console.print(f"wrote {out}/eval.json, results.md{', report.html' if html and 'html_error' not in result else ''}"
                  f"{f' and {results}' if results else ''} ({result['wall_s'] / 60:.1f} min)", highlight=False)


class _EvalProgress:
    """One bar over every replay of the plan, in jobs (its total is known once the cases are read)."""

    def __init__(self) -> None:
        self.bar: LazyProgress | None = None

    def __call__(self, replayed: int, total: int) -> None:
        if self.bar is None:
            self.bar = LazyProgress(["replays"], total, err_console)
        self.bar(0, replayed)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _print_tables(table_list) -> None:  # noqa: ANN001 - eval_report.Table
    from rich.table import Table

    for table in table_list:
        view = Table(title=table.title, title_justify="left")
        for index, header in enumerate(table.headers):
            view.add_column(header, justify="left" if index < 2 else "right", overflow="fold")
        for row in table.rows:
            view.add_row(*(_colour(cell) for cell in row))
        console.print(view)
        for note in table.notes:
            console.print(note, markup=False, highlight=False)


def _colour(cell: str) -> str:
    from rich.markup import escape

    text = escape(cell)
    if cell.startswith("PASS"):
        return f"[green]{text}[/]"
    if cell.startswith("FAIL"):
        return f"[bold red]{text}[/]"
    return text
