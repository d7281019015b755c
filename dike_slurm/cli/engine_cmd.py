"""The live engine's commands: run, status, explain, revert, render."""

from __future__ import annotations

import json
import logging
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.table import Table
from rich.text import Text

from dike_slurm.cli import app, console, err_console
from dike_slurm.errors import InputError
from dike_slurm.render import RENDER_KINDS

if TYPE_CHECKING:  # imported in the commands: `--help` and `breaker status` need none of them
    from dike_slurm.apply import CycleReport
    from dike_slurm.config import Config
    from dike_slurm.engine import Engine
    from dike_slurm.reconcile import CyclePlan
    from dike_slurm.state import StateStore

CONFIG_OPTION = typer.Option(None, "--config", "-c", help="TOML configuration (default: $DIKE_CONFIG)")
_CONTROL = {c: " " for c in range(32)} | {127: " "}


def _safe(value: object) -> Text:
    """Untrusted text (job names, comments) as plain text: no markup, no control characters."""
    return Text(str(value).translate(_CONTROL))


class _JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({
            "time": round(record.created, 3), "level": record.levelname.lower(),
            "logger": record.name, "message": record.getMessage(),
        })


def _setup_logging(config: Config, verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.engine.log_format == "json":
        handler.setFormatter(_JsonLines())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("dike_slurm")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if verbose else logging.WARNING)


def _config(path: Optional[Path]) -> Config:
    from dike_slurm.config import load_config

    return load_config(path)


def _store(config: Config, *, writing: bool) -> StateStore:
    from dike_slurm.state import StateStore

    return StateStore(config.engine.state_db, read_only=not writing)


def _open(config: Config, *, writing: bool) -> Engine:
    from dike_slurm.service import open_engine

    return open_engine(config, _store(config, writing=writing))


def _lock(config: Config):
    from dike_slurm.state import exclusive_lock

    return exclusive_lock(config.engine.lock_file or Path(f"{config.engine.state_db}.lock"))


def _gpuh(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def _plan_table(plan: CyclePlan, report: CycleReport | None = None) -> Table:
    from dike_slurm.reconcile import describe_value

    outcome = {id(w): o for w, o in report.outcomes} if report else {}
    table = Table(title=f"{'changes written' if report and report.applied else 'plan (dry run)'}: "
                        f"policy {plan.policy}, strategy {plan.strategy}")
    for column in ("job", "user", "state", "level", "change", "reason"):
        table.add_column(column)
    if report and report.applied:
        table.add_column("result")
    jobs = {p.job.job_id: p for p in plan.jobs}
    for write in plan.writes:
        job_plan = jobs[write.job_id]
        change = "\n".join(f"{k.value}={describe_value(v)}" for k, v in write.update.values) or "(release)"
        row = [_safe(job_plan.job.display_id), _safe(job_plan.job.user), job_plan.job.state.value,
               str(job_plan.level), _safe(change), _safe(write.reason)]
        if report and report.applied:
            result = outcome.get(id(write))
            row.append(_safe("not run" if result is None else "ok" if result.ok else result.message))
        table.add_row(*row)
    return table


def _print_cycle(report: CycleReport) -> None:
    """One cycle for a person: the table of changes and the summary line (the service logs instead)."""
    from dike_slurm.service import summary_line

    plan = report.plan
    if plan.writes:
        console.print(_plan_table(plan, report))
    console.print(summary_line(report), highlight=False)
    for note in plan.notes + report.notes:
        err_console.print(_safe(f"note: {note}"))
    for reason, count in plan.accounting_skipped.items():
        err_console.print(_safe(f"note: sacct rows skipped: {count} x {reason}"))


@app.command("run")
def run_command(
    once: bool = typer.Option(False, "--once", help="one cycle, then exit (for cron and timers)"),
    apply: bool = typer.Option(False, "--apply/--dry-run", help="write to Slurm (default: dry run, print the plan)"),
    config_path: Optional[Path] = CONFIG_OPTION,
    verbose: bool = typer.Option(False, "--verbose", "-v", help="log every write"),
) -> None:
    """Run the engine: read, decide, diff, write (with --apply), every engine.interval_s seconds.

    A failed cycle (Slurm down, a command timed out) is logged in one line and retried with
    exponential backoff (5 s doubling up to interval_s). SIGTERM/SIGINT: the current cycle
    finishes (each write is atomic with its audit row) and the loop stops. SIGHUP: the
    configuration is read again before the next cycle (a bad file keeps the old one).
    """
    from dike_slurm.service import Service, Signals, run_cycle

    config = _config(config_path)
    _setup_logging(config, verbose or not once)
    signals = Signals()
    signals.install(service=not once)
    with _lock(config) if apply else nullcontext():
        if once:
            engine = _open(config, writing=apply)
            report = run_cycle(engine, apply=apply)
            _print_cycle(report)
            if report.errors or (apply and engine.store.breaker() is not None):
                raise typer.Exit(1)
            return
        service = Service(config, _store(config, writing=apply), lambda: _config(config_path), apply=apply,
                          signals=signals)
        finished = service.run()
    if finished:
        _print_simulation_summary(service.engine)


def _print_simulation_summary(engine: Engine) -> None:
    """A simulated cluster ran to the end of its trace: the replay metrics of the outcome."""
    from dike_slurm.sim.backend import SimulatedBackend

    if not isinstance(engine.backend, SimulatedBackend):
        return
    summary = engine.backend.summary()
    table = Table(title="simulated cluster: the trace ran to its end")
    table.add_column("metric")
    table.add_column("value")
    for key, value in summary.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else _safe(value))
    console.print(table)


@app.command("status")
def status_command(config_path: Optional[Path] = CONFIG_OPTION) -> None:
    """The managed queue: level, attained GPU-hours, priority now and as planned, constraint."""
    config = _config(config_path)
    engine = _open(config, writing=False)
    plan = engine.plan()
    table = Table(title=f"dike-slurm status: policy {plan.policy}; now/planned: {engine.strategy_field.value}")
    for column in ("job", "user", "state", "GPUs", "level", "GPU-h", "now", "planned", "constraint", "note"):
        table.add_column(column, no_wrap=column in ("job", "state", "now", "planned"))
    order = {w.job_id: w.rank for w in plan.writes}
    for job_plan in sorted(plan.jobs, key=lambda p: (p.level if p.level is not None else 99, -(p.value_wanted or 0),
                                                      order.get(p.job.job_id, 0), p.job.job_id)):
        job = job_plan.job
        constraint = _placement_text(job.placement)
        table.add_row(
            _safe(job.display_id), _safe(job.user), job.state.value, str(job.gpus),
            "-" if job_plan.level is None else str(job_plan.level), _gpuh(job.counted_gpu_s),
            "-" if job_plan.value_now is None else str(job_plan.value_now),
            "-" if job_plan.value_wanted is None else str(job_plan.value_wanted),
            _safe(constraint), _safe(job_plan.note or ("" if job_plan.managed else "not managed")),
        )
    console.print(table)
    cycles = engine.store.cycles(1)
    if cycles:
        last = cycles[-1]
        console.print(_safe(
            f"last cycle: {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(last.started))} UTC, "
            f"{'applied' if last.applied else 'dry run'}, {last.writes} write(s), {last.errors} error(s), "
            f"{last.seconds:.2f} s"
        ))
    else:
        console.print("no cycle has been applied yet (the state store is empty)")


def _placement_text(placement) -> str:
    parts = []
    if placement.max_switches:
        wait = f"@{placement.switches_wait_s}s" if placement.switches_wait_s is not None else ""
        parts.append(f"Switches={placement.max_switches}{wait}")
    if placement.features:
        parts.append(f"Features={placement.features}")
    if placement.exclude_nodes:
        parts.append("ExcNodeList=" + ",".join(placement.exclude_nodes))
    if placement.require_nodes:
        parts.append("ReqNodeList=" + ",".join(placement.require_nodes))
    return " ".join(parts) or "-"


@app.command("explain")
def explain_command(
    job: str = typer.Argument(..., help="job id (123, or 123_4 for an array task)"),
    config_path: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Why this job has its level, priority and constraint, and what the engine changed on it."""
    from dike_slurm.reconcile import describe_value

    config = _config(config_path)
    engine = _open(config, writing=False)
    plan = engine.plan()
    found = next((p for p in plan.jobs if job in (str(p.job.job_id), p.job.display_id)), None)
    if found is None:
        if not job.replace("_", "").isdigit():
            raise InputError(f"not a job id: {job!r}")
        console.print(_safe(f"job {job} is not an active job in the engine's scope"))
        job_id = int(job.split("_")[0])
    else:
        job_id = found.job.job_id
        _explain_job(found, engine.strategy_field.value)
    owned = engine.store.owned().get(job_id, {})
    for key, mine in owned.items():
        console.print(_safe(f"  engine owns {key.value}: wrote {describe_value(mine.written)}, "
                            f"original {describe_value(mine.original)}"))
    entries = engine.store.audit_log(job_id, limit=20)
    if entries:
        console.print("audit (newest last):")
        for entry in entries:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(entry.at))
            status = "ok" if entry.ok else f"FAILED: {entry.message}"
            console.print(_safe(f"  {when} {entry.action}: {entry.change} [{status}]"))
            console.print(_safe(f"      command: {entry.command}"))
            console.print(_safe(f"      undo:    {entry.undo}"))


def _explain_job(job_plan, priority_field: str) -> None:
    from dike_slurm.reconcile import describe_value

    job = job_plan.job
    lines = [
        f"job {job.display_id}: user {job.user}, account {job.account}, partition {job.partition}, "
        f"{job.state.value}, {job.gpus} GPU(s) on {job.num_nodes} node(s)",
        f"  attained service: {_gpuh(job.attained_gpu_s)} GPU-hours over {job.run_count} run(s)"
        + (f", {_gpuh(job.attained_at_promotion_gpu_s)} forgiven by a promotion" if job.attained_at_promotion_gpu_s else ""),
    ]
    if not job_plan.managed:
        lines.append(f"  not managed: {job_plan.note}")
    lines.append(f"  level {job_plan.level}: {job_plan.reason}")
    lines.append(f"  {priority_field}: now {job_plan.value_now}, wanted {job_plan.value_wanted}")
    lines.append(f"  constraint now: {_placement_text(job.placement)}; wanted: "
                 f"{_placement_text(job_plan.placement_wanted) if job_plan.placement_wanted else 'none'}")
    if job_plan.hands_off:
        lines.append(f"  left to the user: {job_plan.hands_off_reason}")
    for write in job_plan.writes:
        change = ", ".join(f"{k.value}={describe_value(v)}" for k, v in write.update.values)
        lines.append(f"  next cycle writes: {change or '(release)'} ({write.reason})")
    if job_plan.managed and not job_plan.writes:
        lines.append("  next cycle writes nothing: Slurm already holds what the policy wants")
    for line in lines:
        console.print(_safe(line))


@app.command("revert")
def revert_command(
    apply: bool = typer.Option(False, "--apply/--dry-run", help="write (default: print what would be restored)"),
    config_path: Optional[Path] = CONFIG_OPTION,
) -> None:
    """Undo every change the engine made to active jobs (SiteFactor, Priority, Nice, comment, constraints)."""
    from dike_slurm.reconcile import describe_value

    config = _config(config_path)
    with _lock(config) if apply else nullcontext():
        engine = _open(config, writing=apply)
        plan = engine.revert_plan()
        outcomes = dict((id(w), o) for w, o in engine.revert(plan)) if apply else {}
    table = Table(title="revert" + ("" if apply else " (dry run)"))
    table.add_column("job")
    table.add_column("restore")
    table.add_column("command")
    if apply:
        table.add_column("result")
    for write in plan.writes:
        row = [str(write.job_id), _safe(", ".join(f"{k.value}={describe_value(v)}" for k, v in write.update.values)),
               _safe(engine.backend.describe(write.update))]
        if apply:
            outcome = outcomes[id(write)]
            row.append(_safe("ok" if outcome.ok else outcome.message))
        table.add_row(*row)
    console.print(table)
    console.print(f"{len(plan.writes)} job(s) to restore, {len(plan.released)} field(s) released without a write")
    if apply and any(not o.ok and not o.job_gone for o in outcomes.values()):
        raise typer.Exit(1)


@app.command("breaker")
def breaker_command(
    action: str = typer.Argument("status", help="status | reset"),
    config_path: Optional[Path] = CONFIG_OPTION,
) -> None:
    """The circuit breaker: why it tripped, or `reset` to let the engine write again (audited)."""
    if action not in ("status", "reset"):
        raise InputError(f"breaker: unknown action {action!r} (status or reset)")
    from dike_slurm.state import AuditEntry, StateStore

    config = _config(config_path)
    if action == "status":
        store = StateStore(config.engine.state_db, read_only=True)
        reason = store.breaker()
        console.print(_safe("circuit breaker: " + ("closed (the engine writes)" if reason is None
                                                   else f"TRIPPED: {reason}")))
        if reason is not None:
            raise typer.Exit(1)
        return
    with _lock(config):
        store = StateStore(config.engine.state_db)
        reason = store.breaker()
        if reason is None:
            console.print("circuit breaker: closed, nothing to reset")
            return
        with store.transaction():
            store.reset_breaker()
            store.audit(AuditEntry(time.time(), store.next_cycle(), 0, "breaker-reset", f"cleared: {reason}",
                                   "dike-slurm breaker reset", "none", True, "", "operator"))
    console.print(_safe(f"circuit breaker reset (it had tripped: {reason})"))


@app.command("render")
def render_command(
    kind: str = typer.Argument(..., help="|".join(RENDER_KINDS)),
    config_path: Path = typer.Option(..., "--config", "-c", help="the configuration the deployed engine uses"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="write here instead of stdout"),
    user: str = typer.Option("dike-slurm", "--user", help="the dedicated account the service runs as"),
    oneshot: bool = typer.Option(False, "--oneshot", help="systemd: the one-cycle service a timer starts"),
) -> None:
    """Deployment files from templates: systemd service, timer, cron line, slurm.conf lines."""
    from dike_slurm.render import render

    config = _config(config_path)
    text = render(kind, config, config_path.resolve(), user=user, oneshot=oneshot)
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror}", source=str(out)) from None
    console.print(_safe(f"wrote {out}"))
