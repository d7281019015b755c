"""The live engine's writing commands: run, revert, breaker, pause, resume."""

from __future__ import annotations

import getpass
import json
import logging
import sys
import time
from contextlib import closing, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.table import Table

from dike_slurm.cli.group import app, console, err_console
from dike_slurm.cli.common import (
    CONFIG_OPTION,
    JSON_OPTION,
    STOP_THE_SERVICE,
    emit_json,
    load,
    lock,
    open_engine,
    require_writable_state,
    safe as _safe,
    say_source,
    state_file_text,
    store,
    table,
)
from dike_slurm.errors import DikeError, InputError

if TYPE_CHECKING:  # imported in the commands: `--help` and `breaker status` need none of them
    from dike_slurm.cycle.apply import CycleReport
    from dike_slurm.config import Config, ConfigSource
    from dike_slurm.cycle.engine import Engine
    from dike_slurm.cycle.plan import CyclePlan

_LOG_RECORD_KEYS = ("job", "action", "changes", "ok")


class _JsonLines(logging.Formatter):
    """One JSON object per line; a write's record also carries its job and each field's old and new value."""

    def format(self, record: logging.LogRecord) -> str:
        document = {
            "time": round(record.created, 3), "level": record.levelname.lower(),
            "logger": record.name, "message": record.getMessage(),
        }
        extra = getattr(record, "dike", None)
        if isinstance(extra, dict):
            document |= {k: extra[k] for k in _LOG_RECORD_KEYS if k in extra}
        return json.dumps(document)


def _setup_logging(config: Config, verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.engine.log_format == "json":
        handler.setFormatter(_JsonLines())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("dike_slurm")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if verbose else logging.WARNING)


def _refuse_defaults(source: ConfigSource, apply: bool, defaults: bool) -> None:
    """A writing command with no configuration file is a forgotten --config, unless --defaults says otherwise."""
    if apply and source.kind == "defaults" and not defaults:
        raise InputError("--apply with no configuration file (neither --config nor $DIKE_CONFIG): "
                         "give one, or --defaults to write with the built-in defaults")


def _plan_table(plan: CyclePlan, report: CycleReport | None = None) -> Table:
    """The cycle's writes: each field's new value and what Slurm holds now, the reason, the result."""
    from dike_slurm.cli.views import write_row

    applied = report is not None and report.applied
    outcome = {id(w): o for w, o in report.outcomes} if report is not None else {}
    written = applied and bool(report.outcomes)
    title = ("changes written" if written else "plan (nothing written)" if applied else "plan (dry run)") + \
        f": policy {plan.policy}, strategy {plan.strategy}"
    columns = ["job", "user", "state", "level", "change", "reason"] + (["result"] if applied else [])
    changes = table(title, columns, no_wrap=("job", "state"))
    jobs = {p.job.job_id: p for p in plan.jobs}
    for write in plan.writes:
        done = outcome.get(id(write))
        row = write_row(write, jobs.get(write.job_id), "not run" if done is None else "ok" if done.ok else done.message)
        change = "\n".join(f"{c['field']}={c['new']} (now {c['old']})" for c in row["changes"]) or "(release)"
        cells = [row["job"], row["user"], row["state"], row["level"], change, row["reason"]]
        changes.add_row(*(_safe("" if c is None else c) for c in cells + ([row["result"]] if applied else [])))
    return changes


def _print_cycle(report: CycleReport) -> None:
    """One cycle for a person: the table of changes and the summary line (the service logs instead)."""
    from dike_slurm.ops.service import summary_line

    plan = report.plan
    if plan.writes:
        console.print(_plan_table(plan, report))
    console.print(summary_line(report), highlight=False)
    for note in plan.notes + report.notes:
        if note != report.denied:  # said once, as the error the command stops with
            err_console.print(_safe(f"note: {note}"))
    for reason, count in plan.accounting_skipped.items():
        err_console.print(_safe(f"note: sacct rows skipped: {count} x {reason}"))


@app.command("run")
def run_command(
    once: bool = typer.Option(False, "--once", help="one cycle, then exit (for cron and timers)"),
    apply: bool = typer.Option(False, "--apply/--dry-run", help="write to Slurm (default: dry run, print the plan)"),
    config_path: Optional[Path] = CONFIG_OPTION,
    defaults: bool = typer.Option(False, "--defaults", help="allow --apply with the built-in defaults (no file)"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="log every write"),
    as_json: bool = typer.Option(False, "--json", help="with --once: the cycle as JSON (schema: docs/engine.md)"),
) -> None:
    """Run the engine: read, decide, diff, write (with --apply), every engine.interval_s seconds.

    A failed cycle (Slurm down, a command timed out) is logged in one line and retried with
    exponential backoff (5 s doubling up to interval_s). SIGTERM/SIGINT: the current cycle
    finishes (each write is atomic with its audit row) and the loop stops. SIGHUP: the
    configuration is read again before the next cycle (a bad file keeps the old one).
    """
    from dike_slurm.ops.service import Service, Signals, run_cycle

    if as_json and not once:
        raise InputError("--json needs --once (the service logs JSON with engine.log_format = \"json\")")
    config, source = load(config_path)
    _refuse_defaults(source, apply, defaults)
    _setup_logging(config, verbose or not once)
    say_source(source, as_json)
    signals = Signals()
    signals.install(service=not once)
    with lock(config) if apply else nullcontext():
        if once:
            engine = open_engine(config, writing=apply)
            with closing(engine.store):  # closed, the store folds its WAL back: readers then create nothing
                report = run_cycle(engine, apply=apply)
                tripped = engine.store.breaker()
            if as_json:
                from dike_slurm.cli.views import cycle_document

                emit_json("run", source, cycle_document(report))
            else:
                _print_cycle(report)
            if report.denied:
                raise DikeError(report.denied)
            if report.errors or (apply and tripped is not None):
                raise typer.Exit(1)
            return
        service = Service(config, store(config, writing=apply), lambda: load(config_path)[0], apply=apply,
                          signals=signals)
        with closing(service.engine.store):
            finished = service.run()
    if finished:
        _print_simulation_summary(service.engine)


def _print_simulation_summary(engine: Engine) -> None:
    """A simulated cluster ran to the end of its trace: the replay metrics of the outcome."""
    from dike_slurm.sim.backend import SimulatedBackend

    if not isinstance(engine.backend, SimulatedBackend):
        return
    summary = engine.backend.summary()
    result = table("simulated cluster: the trace ran to its end", ["metric", "value"])
    for key, value in summary.items():
        result.add_row(key, f"{value:.4g}" if isinstance(value, float) else _safe(value))
    console.print(result)


@app.command("revert")
def revert_command(
    job: Optional[int] = typer.Argument(None, metavar="JOBID", help="only this job (its own id; default: every job)"),
    apply: bool = typer.Option(False, "--apply/--dry-run", help="write (default: print what would be restored)"),
    config_path: Optional[Path] = CONFIG_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Undo the engine's changes to active jobs (SiteFactor, Priority, Nice, comment, constraints): all, or JOBID."""
    from dike_slurm.cli.views import write_row

    config, source = load(config_path)
    say_source(source, as_json)
    if apply:
        require_writable_state(config, source, "revert --apply")
    with lock(config, fix=REVERT_FIX) if apply else nullcontext():
        engine = open_engine(config, writing=apply)
        with closing(engine.store):
            plan = engine.revert_plan(None if job is None else [job])
            outcomes = dict((id(w), o) for w, o in engine.revert(plan)) if apply else {}
    rows = []
    for write in plan.writes:
        outcome = outcomes.get(id(write))
        row = write_row(write, None, None if not apply else "ok" if outcome.ok else outcome.message)
        rows.append(row | {"command": engine.backend.describe(write.update)})
    released = [{"job_id": j, "field": f.value, "why": why} for j, f, why in plan.released]
    kept = [{"job_id": j, "field": f.value, "why": why} for j, f, why in plan.kept]
    if as_json:
        emit_json("revert", source, {"applied": apply, "writes": rows, "released": released, "kept": kept})
    else:
        result = table("revert" + ("" if apply else " (dry run)"),
                       ["job", "restore", "command"] + (["result"] if apply else []), no_wrap=("job",))
        for row in rows:
            restore = ", ".join(f"{c['field']} {c['old']} -> {c['new']}" for c in row["changes"])
            result.add_row(*(_safe(c) for c in [row["job"], restore, row["command"]] + ([row["result"]] if apply else [])))
        console.print(result)
        console.print(f"{len(plan.writes)} job(s) to restore, {len(plan.released)} field(s) released without a write, "
                      f"{len(plan.kept)} left as they are", highlight=False)
        for entry in released + kept:
            console.print(_safe(f"job {entry['job_id']}: {entry['field']}: {entry['why']}"), highlight=False)
    if apply and any(not o.ok and not o.job_gone for o in outcomes.values()):
        raise typer.Exit(1)


# revert --apply while an engine runs: the service holds the lock for as long as it runs, paused or not
REVERT_FIX = (f"revert --apply changes the jobs that engine manages: {STOP_THE_SERVICE}, then revert --apply. "
              "To keep its changes and only stop its writes: dike-slurm pause (the service keeps running and holding "
              "the lock; dike-slurm resume lets it write again)")


def _latch_document(config: Config, what: str, reason: str | None, **more: object) -> dict:
    return {"state_file": str(config.engine.state_db), what: reason is not None, "reason": reason} | more


@app.command("breaker")
def breaker_command(
    action: str = typer.Argument("status", help="status | reset"),
    config_path: Optional[Path] = CONFIG_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """The circuit breaker: why it tripped, or `reset` to let the engine write again (audited)."""
    if action not in ("status", "reset"):
        raise InputError(f"breaker: unknown action {action!r} (status or reset)")
    from dike_slurm.store.state import AuditEntry, StateStore

    config, source = load(config_path)
    say_source(source, as_json)
    if action == "status":
        reason = StateStore(config.engine.state_db, read_only=True).breaker()
        if as_json:
            emit_json("breaker", source, _latch_document(config, "tripped", reason, reset=False))
        else:
            console.print(_safe("circuit breaker: " + ("closed (the engine writes)" if reason is None
                                                      else f"TRIPPED: {reason}")))
        if reason is not None:
            raise typer.Exit(1)
        return
    require_writable_state(config, source, "breaker reset")
    with lock(config, fix=f"breaker reset needs it: {STOP_THE_SERVICE}, reset, then start it again"):
        with closing(StateStore(config.engine.state_db, group=config.engine.state_group)) as store:
            reason = store.breaker()
            if reason is not None:
                with store.transaction():
                    store.reset_breaker()
                    store.audit(AuditEntry(time.time(), store.next_cycle(), 0, "breaker-reset", f"cleared: {reason}",
                                           "dike-slurm breaker reset", "none", True, "", "operator",
                                           user=getpass.getuser()))
    if as_json:
        emit_json("breaker", source, _latch_document(config, "tripped", None, reset=reason is not None,
                                                     was=reason))
    elif reason is None:
        console.print("circuit breaker: closed, nothing to reset")
    else:
        console.print(_safe(f"circuit breaker reset (it had tripped: {reason})"))


def _set_pause(config_path: Optional[Path], reason: str | None, as_json: bool) -> None:
    """Pause (reason given) or resume (None): the flag and its audit row in one transaction. No
    engine lock: a running service holds it, and reads the flag before each cycle's writes."""
    from dike_slurm.store.state import AuditEntry, StateStore

    config, source = load(config_path)
    say_source(source, as_json)
    command = "resume" if reason is None else "pause"
    require_writable_state(config, source, command)
    with closing(StateStore(config.engine.state_db, group=config.engine.state_group)) as store:
        with store.transaction():
            before = store.paused()
            if (reason is None) != (before is None):
                if reason is None:
                    store.resume()
                    change = f"resumed (was paused: {before})"
                else:
                    store.pause(reason)
                    change = f"paused: {reason}"
                undo = "dike-slurm " + ("pause" if reason is None else "resume")
                store.audit(AuditEntry(time.time(), store.next_cycle(), 0, command, change, f"dike-slurm {command}",
                                       undo, True, "", "operator", user=getpass.getuser()))
        now = store.paused()
    if as_json:
        emit_json(command, source, _latch_document(config, "paused", now, changed=now != before))
        return
    if reason is None:
        console.print(_safe("resumed: the engine writes again" if before is not None else "not paused: nothing to resume"))
    else:
        console.print(_safe(f"paused: the engine plans but writes nothing until `dike-slurm resume` ({now})"
                           if before is None else f"already paused ({before})"))
    console.print(_safe(state_file_text(config)), highlight=False)


@app.command("pause")
def pause_command(
    reason: str = typer.Option("paused by an operator", "--reason", help="why (kept in the state store and the audit)"),
    config_path: Optional[Path] = CONFIG_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Stop the engine's writes without stopping the service (latched and audited; `resume` ends it)."""
    _set_pause(config_path, reason, as_json)


@app.command("resume")
def resume_command(config_path: Optional[Path] = CONFIG_OPTION, as_json: bool = JSON_OPTION) -> None:
    """Let a paused engine write again (audited)."""
    _set_pause(config_path, None, as_json)
