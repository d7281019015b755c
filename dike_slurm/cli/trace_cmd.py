"""`dike-slurm trace stats|generate`: look at a sacct dump, or write a synthetic one."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from dike_slurm.cli.group import app, console
from dike_slurm.errors import InputError

trace_app = typer.Typer(help="Look at or generate sacct dumps.", no_args_is_help=True)
app.add_typer(trace_app, name="trace")


@trace_app.command("stats")
def trace_stats_command(
    dump: Path = typer.Argument(..., help="sacct --parsable2 or --json dump"),
    as_json: bool = typer.Option(False, "--json", help="print the statistics as JSON"),
    gpus: Optional[int] = typer.Option(None, "--gpus", min=1, help="the cluster's GPUs: adds the offered load"),
) -> None:
    """Jobs, GPU jobs, users, GPU-hours, sizes, run times and skipped rows of a dump."""
    from dike_slurm.sim.eval.stats import trace_stats
    from dike_slurm.slurm.accounting_json import read_sacct_file

    stats = trace_stats(read_sacct_file(dump), total_gpus=gpus)
    if as_json:
        console.print_json(json.dumps(stats))
        return
    _print_stats(stats, f"trace stats: {dump}")


def _print_stats(stats: dict, title: str) -> None:
    table = Table(title=title, show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    for key in ("rows", "records", "jobs", "gpu_jobs", "cpu_only_jobs", "never_started", "requeued_jobs",
                "array_tasks", "users", "accounts", "gpu_hours", "span_days", "submit_span_days",
                "one_gpu_job_share", "multi_node_gpu_hour_share", "offered_load"):
        if stats[key] is not None:
            table.add_row(key.replace("_", " "), str(stats[key]))
    for key in ("skipped_rows", "final_states", "gpus_per_job", "run_time_hours", "gpu_hours_per_job"):
        value = stats[key]
        table.add_row(key.replace("_", " "), ", ".join(f"{k}: {v}" for k, v in value.items()) or "-")
    top = ", ".join(f"{u['user']} {u['gpu_hours']} ({u['share']:.0%})" for u in stats["top_users_by_gpu_hours"])
    table.add_row("top users (GPU-h)", top or "-")
    console.print(table, markup=False, highlight=False)


@trace_app.command("generate")
def trace_generate_command(
    out: Path = typer.Option(..., "--out", help="folder for sacct.txt, slurm.conf and topology.conf"),
    jobs: int = typer.Option(2500, "--jobs", min=1, help="jobs to generate"),
    nodes: int = typer.Option(16, "--nodes", min=1, help="nodes of the cluster"),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", min=1, help="GPUs in each node"),
    cpus_per_node: int = typer.Option(64, "--cpus-per-node", min=1, help="CPUs of each node"),
    mem_per_node: int = typer.Option(512000, "--mem-per-node", min=1, help="RealMemory of each node, MB"),
    gpu_type: str = typer.Option("a100", "--gpu-type", help="GPU type in Gres and typed TRES"),
    nodes_per_leaf: int = typer.Option(4, "--nodes-per-leaf", min=1, help="nodes under each leaf switch"),
    switch_fanout: int = typer.Option(4, "--switch-fanout", min=2, help="children per switch above the leaves"),
    switch_levels: Optional[int] = typer.Option(None, "--switch-levels", min=1,
                                                help="switch levels (default: as many as the fan-out needs)"),
    users: int = typer.Option(30, "--users", min=1, help="users submitting"),
    load: float = typer.Option(1.0, "--load", min=0.01, help="offered GPU load (fraction of the cluster)"),
    start: str = typer.Option("2026-01-05T00:00:00", "--start", help="first possible submit time (naive local time)"),
    seed: int = typer.Option(0, "--seed", help="random seed (same seed, same files)"),
    stats: bool = typer.Option(False, "--stats", help="then print `trace stats` of the written dump"),
) -> None:
    """Write a synthetic deep-learning workload (docs/workload.md) as a sacct dump plus its cluster."""
    from dike_slurm.sim.tracegen.generate import generate_sample
    from dike_slurm.sim.tracegen.synthetic_cluster import ClusterSpec
    from dike_slurm.sim.tracegen.workload_model import WorkloadModel

    try:
        cluster = ClusterSpec(nodes=nodes, gpus_per_node=gpus_per_node, cpus_per_node=cpus_per_node,
                              real_memory_mb=mem_per_node, gpu_type=gpu_type, nodes_per_leaf=nodes_per_leaf,
                              switch_fanout=switch_fanout, switch_levels=switch_levels)
        model = replace(WorkloadModel(), n_users=users, target_load=load)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    try:
        out.mkdir(parents=True, exist_ok=True)
        generate_sample(out, jobs, cluster, model, seed, start=start)
    except ValueError as exc:  # --start that is not a naive ISO time
        raise InputError(f"--start: {exc}") from None
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror}", source=str(out)) from None
    console.print(f"wrote {out / 'sacct.txt'}, {out / 'slurm.conf'}, {out / 'topology.conf'}", highlight=False)
    if stats:
        from dike_slurm.sim.eval.stats import trace_stats
        from dike_slurm.slurm.accounting_json import read_sacct_file

        _print_stats(trace_stats(read_sacct_file(out / "sacct.txt"), total_gpus=cluster.total_gpus),
                     f"trace stats: {out / 'sacct.txt'}")
