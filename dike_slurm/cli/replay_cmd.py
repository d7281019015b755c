"""`dike-slurm replay` and `dike-slurm tune`: the offline side."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from dike_slurm.cli.group import app, console, err_console
from dike_slurm.cli.common import load, safe
from dike_slurm.cli.progress import LazyProgress
from dike_slurm.errors import ConfigError, InputError

if TYPE_CHECKING:  # the simulator (numpy, matplotlib) loads when a replay runs, not with the CLI
    from dike_slurm.config import Config, ConfigSource
    from dike_slurm.sim.kernel.replay import PolicyRun, ReplayInput
    from dike_slurm.sim.kernel.records import SimSettings

HISTORY_HELP = ("an earlier sacct dump of the same cluster: its jobs that ended by DUMP's first submission seed the "
                "service prior and fair-share usage, as the live engine's accounting would (a warm start)")
SWEEP_METRICS = ("avg_jct_s", "worst_user_slowdown", "heavy_consolidated_fraction")


def _config(path: Path | None, overrides: dict) -> tuple[Config, ConfigSource]:
    """The replay's configuration: --config only (offline: $DIKE_CONFIG names the live engine's
    file and is not read), said in one line."""
    config, source = load(path, offline=True, overrides=overrides)
    console.print(safe(source.describe()), highlight=False)
    return config, source


def _workers(requested: int | None) -> int:
    if requested is not None:
        if requested < 1:
            raise InputError("--workers must be at least 1")
        return requested
    return max(1, min(2, os.cpu_count() or 1))


def _out_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the output folder: {exc.strerror}", source=str(path)) from None
    return path


def _parse_floats(text: str, option: str) -> list[float]:
    try:
        values = [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise InputError(f"{option} takes comma-separated numbers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise InputError(f"{option} values must be >= 0, got {text!r}")
    return values


def _print_input(replay_input: ReplayInput) -> None:
    from dike_slurm.sim.kernel.warm import start_sentence

    summary = replay_input.input_summary()
    console.print(
        f"[bold]{replay_input.dump}[/]: {summary['rows']} rows, {summary['jobs_in_dump']} jobs, "
        f"{summary['jobs_replayed']} replayed on {summary['nodes']} nodes / {summary['gpus']} GPUs "
        f"/ {summary['leaf_switches']} leaf switches",
        highlight=False,
    )
    _print_reasons("skipped rows", summary["skipped_rows"])
    _print_reasons("jobs not replayed", summary["jobs_not_replayed"])
    _print_reasons("adjusted", summary["adjustments"])
    unfinished = replay_input.trace.unfinished.sentence()
    if unfinished:
        console.print(f"  {unfinished}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"  {start_sentence(summary['history'])}", highlight=False, markup=False, soft_wrap=True)


def _print_reasons(title: str, reasons: dict[str, int]) -> None:
    if reasons:
        details = ", ".join(f"{reason}: {count}" for reason, count in reasons.items())
        console.print(f"  {title}: {details}", highlight=False, markup=False)


def _comparison_table(runs: list[PolicyRun], title: str) -> Table:
    """The report's comparison table turned sideways (a column per policy) to fit a terminal."""
    from dike_slurm.sim.kernel.metrics import COMPARISON_HEADERS, comparison_rows

    table = Table(title=title)
    rows = comparison_rows((run.name, run.metrics.summary) for run in runs)
    table.add_column("metric")
    for row in rows:
        table.add_column(row[0], justify="right")
    for index, header in enumerate(COMPARISON_HEADERS[1:], start=1):
        table.add_row(header, *(row[index] for row in rows))
    return table


def verdict_lines(runs: list[PolicyRun]) -> list[str]:
    """The report's verdict, one sentence per policy against the report's baseline (multifactor,
    else fifo, else the first policy) naming every metric the report marks worse, then where each
    policy's GPU-hours went."""
    from dike_slurm.sim.eval.report import baseline_of
    from dike_slurm.sim.eval.report_compare import headline

    summaries = {run.name: run.metrics.summary for run in runs}
    baseline = baseline_of(list(summaries))
    lines = [headline(name, summary, summaries[baseline], baseline)[0]
             for name, summary in summaries.items() if name != baseline]
    lines += [
        f"{name}: {s['useful_gpu_h']:,.0f} useful GPU-hours, {s['preemption_lost_gpu_h']:,.0f} lost to preemption "
        f"({s['lost_gpu_fraction']:.1%}), {s['slowed_gpu_h']:,.0f} to slow-down; useful utilisation {s['gpu_utilization']:.1%}"
        for name, s in summaries.items()
    ]
    return lines


def _check_policies(given: list[str]) -> list[str]:
    """The policy names of repeated options, each of which may list several (`-p fifo,dike`)."""
    names = [name.strip() for text in given for name in text.split(",") if name.strip()]
    if not names:
        raise InputError("give at least one --policy (see `dike-slurm policies`)")
    from dike_slurm.registry import default_registry

    registry = default_registry()
    for name in names:
        registry.get(name)  # unknown names raise a RegistryError with the known ones
    return list(dict.fromkeys(names))


def parse_preemptible(text: str) -> float | str:
    """`live` -> "live" (the engine's opt-in rule), `all` -> 1, `none` -> 0, `0.25` -> 0.25 (a share)."""
    word = text.strip().lower()
    if word == "live":
        return "live"
    if word == "all":
        return 1.0
    if word == "none":
        return 0.0
    try:
        share = float(word)
    except ValueError:
        share = -1.0
    if not 0.0 <= share <= 1.0:
        raise typer.BadParameter(f"{text!r}: expected live, all, none or a share between 0 and 1", param_hint="--preemptible")
    return share


def _settings_section(settings: SimSettings) -> dict:
    return {
        "interval_s": settings.interval_s,
        "comm_penalty": settings.comm_penalty,
        "restart_cost_s": settings.restart_cost_s,
        "checkpoint_interval_s": settings.checkpoint_interval_s,
        "preemptible": settings.preemptible_choice,
        "max_requeues_per_cycle": settings.max_requeues_per_cycle,
        "seed": settings.seed,
        "usage_half_life_h": settings.usage_half_life_s / 3600.0,
        "history_window_days": settings.history_window_s / 86400.0,
        "max_switch_wait_s": settings.max_switch_wait_s,
        "bf_max_job_test": settings.bf_max_job_test,
        "bf_window_s": settings.bf_window_s,
        "bf_interval_s": settings.bf_interval_s,
        "backfill_reservations": settings.backfill_reservations,
        "job_requeue": settings.requeueable,
        "comm_gpus": settings.comm_gpus,
    }


@app.command("replay")
def replay_command(
    dump: Path = typer.Argument(..., help="sacct --parsable2 or --json dump (see docs/replay.md)"),
    slurm_conf: Path = typer.Option(..., "--slurm-conf", help="the site's slurm.conf (NodeName lines with Gres)"),
    topology: Path | None = typer.Option(None, "--topology", help="topology.conf (default: beside slurm.conf)"),
    policy: list[str] = typer.Option([], "--policy", "-p", metavar="NAME", help="policy to replay (repeat, or a,b)"),
    config_path: Path | None = typer.Option(None, "--config", help="TOML configuration: its replay section and the policies.NAME tables (never $DIKE_CONFIG)"),
    comm_penalty: float | None = typer.Option(None, "--comm-penalty", min=0, help="slow-down per extra leaf switch of a heavy job"),
    penalty_sweep: str = typer.Option("", "--penalty-sweep", help="also replay at these penalties, e.g. 0,0.5,2 (report table)"),
    seed: int | None = typer.Option(None, "--seed", help="seed of the random generator handed to the policies"),
    interval: float | None = typer.Option(None, "--interval", min=1, help="policy cycle in simulated seconds"),
    workers: int | None = typer.Option(None, "--workers", help="replays run in parallel (default: 2 or the CPU count)"),
    preemptible: str | None = typer.Option(
        None, "--preemptible",
        help="which jobs may be preempted: live (the engine's opt-in rule, the default of [replay] preemptible), "
        "all, none, or a share such as 0.5 drawn per job",
    ),
    out: Path = typer.Option(..., "--out", help="folder for summary.json, jobs-NAME.csv and report.html"),
    history: Path | None = typer.Option(None, "--history", help=HISTORY_HELP),
) -> None:
    """Replay DUMP through each policy on the simulated cluster and compare the outcomes."""
    from dike_slurm.sim.kernel.replay import ReplayTask, load_input, preemptible_jobs, run_tasks, sim_settings

    names = _check_policies(policy)
    preemptible_share = parse_preemptible(preemptible) if preemptible is not None else None
    overrides: dict = {"replay": {}}
    if interval is not None:
        overrides["replay"]["interval_s"] = interval
    config, source = _config(config_path, overrides)
    sweep = _parse_floats(penalty_sweep, "--penalty-sweep") if penalty_sweep else []
    replay_input = load_input(dump, slurm_conf, topology, history)
    settings = sim_settings(
        config, replay_input.conf, comm_penalty=comm_penalty, seed=seed, preemptible=preemptible_share,
        source=str(slurm_conf),
    )
    out_dir = _out_dir(out)
    _print_input(replay_input)
    preemptible_count, preemptible_line = preemptible_jobs(replay_input, settings)
    console.print(preemptible_line, highlight=False, markup=False)
    sweep = [v for v in dict.fromkeys(sweep) if v != settings.comm_penalty]
    tasks = [ReplayTask(name, name, settings.comm_penalty, out_dir / f"jobs-{name}.csv") for name in names]
    tasks += [ReplayTask(f"{name}@{value:g}", name, value) for value in sweep for name in names]
    worker_count = _workers(workers)
    progress = LazyProgress([t.label for t in tasks], len(replay_input.trace.jobs), err_console)
    try:
        runs = run_tasks(tasks, replay_input, config, settings, workers=worker_count, on_progress=progress)
    finally:
        progress.close()
    main_runs, sweep_runs = runs[: len(names)], runs[len(names) :]
    penalty_table = _penalty_table(settings.comm_penalty, names, main_runs, sweep, sweep_runs)
    swept = penalty_table if sweep else None
    extra = {"settings": {**_settings_section(settings), "preemptible_jobs": preemptible_count}, "config": source.as_dict(),
             "unfinished_at_dump_end": replay_input.trace.unfinished.as_dict()}
    if swept:
        extra["comm_penalty_sweep"] = {
            f"{penalty:g}": {name: {key: run.metrics.summary[key] for key in SWEEP_METRICS} for name, run in by_policy.items()}
            for penalty, by_policy in swept.items()
        }
    _write_outputs(out_dir, replay_input, runs, main_runs, extra, {name: config.policy_params(name) for name in names},
                   swept)
    console.print(_comparison_table(main_runs, f"replay at comm penalty {settings.comm_penalty:g}"))
    for line in verdict_lines(main_runs):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if caveat := replay_input.trace.unfinished.caveat():
        console.print(caveat, highlight=False, markup=False, soft_wrap=True)
    if swept:
        console.print(_sweep_table(swept, names))
    timing = ", ".join(f"{run.name} {run.wall_s:.1f}s" for run in runs)
    console.print(f"replay time: {timing} ({worker_count} worker(s))", highlight=False)
    console.print(f"report: {out_dir / 'report.html'}", highlight=False)


def _write_outputs(out_dir: Path, replay_input: ReplayInput, runs: list[PolicyRun], main_runs: list[PolicyRun],
                   extra: dict, params: dict, swept: dict[float, dict[str, PolicyRun]] | None = None) -> None:
    """summary.json and report.html of `main_runs` (`runs`: every replay, for the timings; `params`:
    each run's policy parameters; `swept`: the penalty sweep's runs by penalty, None without one)."""
    from dike_slurm.sim.eval.report import render_report
    from dike_slurm.sim.kernel.replay import write_summary

    input_section = replay_input.input_summary()
    write_summary(out_dir / "summary.json", input_section, main_runs, extra)
    penalties = sorted(swept or ())
    names = [run.name for run in main_runs]
    html = render_report(
        case=replay_input.case,
        input_section=input_section,
        unfinished=replay_input.trace.unfinished.sentence(),
        settings=extra["settings"],
        runs=[(run.name, run.metrics) for run in main_runs],
        user_jobs=_user_jobs(replay_input),
        penalty_headers=["policy"] + [f"penalty {p:g}" for p in penalties] if swept else [],
        penalty_rows=[[name] + [_avg_jct_h(swept[p][name]) for p in penalties] for name in names] if swept else [],
        timings={run.name: run.wall_s for run in runs},
        params=params,
        config_source=extra["config"],
    )
    (out_dir / "report.html").write_text(html, encoding="utf-8")


def _user_jobs(replay_input: ReplayInput) -> dict[str, int]:
    """Jobs replayed per user."""
    counts: dict[str, int] = {}
    for job in replay_input.trace.jobs:
        counts[job.user] = counts.get(job.user, 0) + 1
    return counts


def _sweep_table(swept: dict[float, dict[str, PolicyRun]], names: list[str]) -> Table:
    """Average JCT per policy (rows) and communication penalty (columns)."""
    penalties = sorted(swept)
    table = Table(title="average JCT (h) by communication penalty")
    table.add_column("policy")
    for penalty in penalties:
        table.add_column(f"{penalty:g}", justify="right")
    for name in names:
        table.add_row(name, *(_avg_jct_h(swept[p][name]) for p in penalties))
    return table


def _avg_jct_h(run: PolicyRun) -> str:
    return f"{run.metrics.summary['avg_jct_s'] / 3600:.2f}"


def _penalty_table(
    main_penalty: float, names: list[str], main_runs: list[PolicyRun], sweep: list[float], sweep_runs: list[PolicyRun]
) -> dict[float, dict[str, PolicyRun]]:
    """penalty -> policy -> run, the main runs included."""
    table: dict[float, dict[str, PolicyRun]] = {main_penalty: dict(zip(names, main_runs))}
    for index, run in enumerate(sweep_runs):
        table.setdefault(sweep[index // len(names)], {})[names[index % len(names)]] = run
    return table


@app.command("tune")
def tune_command(
    dump: Path = typer.Argument(..., help="sacct --parsable2 or --json dump"),
    slurm_conf: Path = typer.Option(..., "--slurm-conf", help="the site's slurm.conf"),
    topology: Path | None = typer.Option(None, "--topology", help="topology.conf (default: beside slurm.conf)"),
    config_path: Path | None = typer.Option(None, "--config", help="TOML configuration (never $DIKE_CONFIG)"),
    quantiles: list[str] = typer.Option([], "--quantiles", metavar="Q,Q", help="a candidate, e.g. 0.5,0.75 (repeat; default: four sets)"),
    baseline: list[str] = typer.Option(["fifo"], "--baseline", metavar="NAME", help="policies replayed for comparison (repeat, or a,b)"),
    comm_penalty: float | None = typer.Option(None, "--comm-penalty", min=0, help="slow-down per extra leaf switch of a heavy job"),
    preemptible: str | None = typer.Option(
        None, "--preemptible",
        help="which jobs may be preempted: live (the engine's opt-in rule, the default of [replay] preemptible), "
        "all, none, or a share such as 0.5 drawn per job; the thresholds matter only where Dike preempts",
    ),
    workers: int | None = typer.Option(None, "--workers", help="replays run in parallel"),
    out: Path | None = typer.Option(
        None, "--out", metavar="DIR", help="also write summary.json (every replay, the candidates, the answer) and report.html",
    ),
    sweep_out: Path | None = typer.Option(
        None, "--sweep-out", metavar="DIR",
        help="write the replays as a sweep folder instead (run it with `sweep local DIR` or `sweep submit DIR`, then `sweep merge DIR`)",
    ),
    history: Path | None = typer.Option(None, "--history", help=HISTORY_HELP),
) -> None:
    """Propose Dike's queue thresholds from DUMP's per-job GPU service and compare them by replay."""
    from dike_slurm.sim.kernel.replay import ReplayTask, load_input, policy_params, preemptible_jobs, run_tasks, sim_settings
    from dike_slurm.sim.eval.tune import CONFIGURED, Candidate, answer, candidate_quantiles, propose

    if out is not None and sweep_out is not None:
        raise InputError("give --out (run the replays now and write their results) or --sweep-out (write them to run later), not both")
    preemptible_share = parse_preemptible(preemptible) if preemptible is not None else None
    config, source = _config(config_path, {})
    dike = config.policy_params("dike")
    levels = dike.levels  # type: ignore[attr-defined]
    candidates = _tune_candidates(quantiles, levels) or candidate_quantiles(levels)
    replay_input = load_input(dump, slurm_conf, topology, history)
    _print_input(replay_input)
    settings = sim_settings(config, replay_input.conf, comm_penalty=comm_penalty, preemptible=preemptible_share,
                            source=str(slurm_conf))
    preemptible_count, preemptible_line = preemptible_jobs(replay_input, settings)
    console.print(preemptible_line, highlight=False, markup=False)
    proposals = [propose(replay_input.trace.jobs, candidate) for candidate in candidates]
    baselines = _check_policies(baseline) if baseline else []
    tasks = [ReplayTask(name, name, settings.comm_penalty) for name in baselines]
    tasks.append(ReplayTask(CONFIGURED, "dike", settings.comm_penalty))
    tasks += [
        ReplayTask(p.label, "dike", settings.comm_penalty, params_override={"thresholds_gpuh": list(p.thresholds_gpuh)})
        for p in proposals
    ]
    if sweep_out is not None:
        known = {"preemptible_jobs": preemptible_count, "jobs": len(replay_input.trace.jobs),
                 "preemption": dike.preemption}  # type: ignore[attr-defined]
        _tune_sweep(sweep_out, tasks, proposals, known, config, settings, replay_input, slurm_conf, topology)
        return
    out_dir = _out_dir(out) if out is not None else None
    progress = LazyProgress([t.label for t in tasks], len(replay_input.trace.jobs), err_console)
    try:
        runs = run_tasks(tasks, replay_input, config, settings, workers=_workers(workers), on_progress=progress)
    finally:
        progress.close()
    console.print(_comparison_table(runs, "Dike thresholds by replay"))
    console.print(_threshold_table(proposals))
    configured = runs[len(baselines)]
    result = answer(
        configured.metrics.summary,
        [Candidate(p.label, p.thresholds_gpuh, run.metrics.summary) for p, run in zip(proposals, runs[len(baselines) + 1 :])],
        preemptible_jobs=preemptible_count, jobs=len(replay_input.trace.jobs),
        preemption_on=dike.preemption,  # type: ignore[attr-defined]
    )
    for line in result.lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if out_dir is not None:
        tune = {"candidates": [{"label": p.label, "quantiles": list(p.quantiles), "thresholds_gpuh": list(p.thresholds_gpuh)}
                               for p in proposals], **result.as_dict()}
        extra = {"settings": {**_settings_section(settings), "preemptible_jobs": preemptible_count},
                 "config": source.as_dict(), "unfinished_at_dump_end": replay_input.trace.unfinished.as_dict(), "tune": tune}
        params = {task.label: policy_params(config, task.policy, task.params_override) for task in tasks}
        _write_outputs(out_dir, replay_input, runs, runs, extra, params)
        console.print(f"wrote {out_dir / 'summary.json'} and {out_dir / 'report.html'}", highlight=False)


def _tune_candidates(quantiles: list[str], levels: int) -> list[tuple[float, ...]]:
    """The --quantiles candidates, each checked against the number of levels."""
    candidates = [tuple(_parse_floats(text, "--quantiles")) for text in quantiles]
    for candidate in candidates:
        if len(candidate) != levels - 1 or any(not 0 < q < 1 for q in candidate) or list(candidate) != sorted(set(candidate)):
            raise ConfigError(f"--quantiles {candidate}: need {levels - 1} ascending values in (0, 1) for {levels} levels")
    return candidates


def _threshold_table(proposals: list) -> Table:
    table = Table(title="proposed thresholds (GPU-hours)")
    table.add_column("candidate")
    table.add_column("thresholds_gpuh", justify="right")
    for proposal in proposals:
        table.add_row(proposal.label, ", ".join(f"{t:g}" for t in proposal.thresholds_gpuh))
    return table


def _tune_sweep(out: Path, tasks: list, proposals: list, known: dict, config: Config, settings: SimSettings,
                replay_input: ReplayInput, slurm_conf: Path, topology: Path | None) -> None:
    """tune as a preset sweep: the same replays, one cell each, for `sweep local` or `sweep submit`;
    `known` (preemptible_jobs, jobs, preemption) lets the merge say why candidates do not differ."""
    from dike_slurm.sim.sweep.plan import write_plan
    from dike_slurm.sim.sweep.spec import Spec, SweepInput, SweepVariant

    dump = replay_input.dump.resolve()
    spec = Spec(
        name="tune",
        inputs=(SweepInput(replay_input.case, str(dump), str(slurm_conf.resolve()),
                           str(topology.resolve()) if topology else None,
                           str(replay_input.history.dump.resolve()) if replay_input.history else None),),
        variants=tuple(SweepVariant(t.label, t.policy, dict(t.params_override or {})) for t in tasks),
        penalties=(settings.comm_penalty,),
        seeds=(settings.seed,),
        preemptible=(settings.preemptible_choice,),
        config=config.model_dump(mode="json"),
        source=f"dike-slurm tune {dump}",
        preset={"kind": "tune", "candidates": [{"label": p.label, "thresholds_gpuh": list(p.thresholds_gpuh)}
                                               for p in proposals], **known},
    )
    plan = write_plan(spec, out)
    console.print(
        f"wrote sweep {plan.name}: {plan.cells} cells in {plan.out}; run them with `dike-slurm sweep local {plan.out} -j N` "
        f"or `dike-slurm sweep submit {plan.out}`, then `dike-slurm sweep merge {plan.out}` prints tune's answer",
        highlight=False, markup=False, soft_wrap=True,
    )
