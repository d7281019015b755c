"""The read-only views of the live engine: queue, status, explain, audit.

They read Slurm and, read-only, the state store, and write nothing anywhere; a user without
root can run them (docs/deployment.md, "Who can read what"): where the state file is not
readable, they say so and go on with what Slurm and accounting show.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from dike_slurm.cli.group import app, console, err_console
from dike_slurm.cli.common import (
    CONFIG_OPTION,
    JSON_OPTION,
    emit_json,
    load,
    safe,
    say_source,
    state_file_text,
    table,
)
from dike_slurm.errors import DikeError, InputError

if TYPE_CHECKING:
    from rich.text import Text

    from dike_slurm.slurm.backends.base import ClusterState
    from dike_slurm.cli.visibility import Viewer
    from dike_slurm.config import Config
    from dike_slurm.cycle.engine import Engine

STATE_OPTION = typer.Option([], "--state", "-t", metavar="STATE", help="PENDING, RUNNING or SUSPENDED (repeat, or a,b)")
USER_OPTION = typer.Option([], "--user", "-u", metavar="USER", help="only this user's jobs (repeat, or a,b)")
ACCOUNT_OPTION = typer.Option([], "--account", "-A", metavar="ACCOUNT", help="only this account's jobs (repeat, or a,b)")
PARTITION_OPTION = typer.Option([], "--partition", "-p", metavar="PARTITION", help="only jobs of this partition (repeat, or a,b)")


def _reader(config: Config) -> tuple[Engine, str | None]:
    """An engine on a read-only store; a state file this user cannot read becomes an empty store
    and a note (levels then come from accounting and the queue alone)."""
    from dike_slurm.ops.service import open_engine
    from dike_slurm.store.state import StateError, StateStore

    try:
        store = StateStore(config.engine.state_db, read_only=True)
        store.jobs()  # a file this user may not read fails here, not in the middle of the plan
    except (StateError, OSError) as exc:
        return open_engine(config, StateStore(None)), f"state file not read ({exc}); levels from accounting only"
    return open_engine(config, store), None


def _viewer(config: Config) -> Viewer:
    from dike_slurm.cli.visibility import read_viewer, slurm_runner

    return read_viewer(config, slurm_runner(config))


def _published(config: Config) -> tuple[Engine, ClusterState]:
    """For a viewer Slurm restricts: an engine that never opens the state store, and what Slurm
    shows this user (a read of the queue, nodes and topology; no accounting)."""
    from dike_slurm.ops.service import open_engine
    from dike_slurm.store.state import StateStore

    engine = open_engine(config, StateStore(None))
    return engine, engine.backend.read_cluster()


def _published_rows(config: Config, engine: Engine, cluster: ClusterState) -> list[dict]:
    from dike_slurm.cli.views import published_rows
    from dike_slurm.cycle.engine import in_scope

    return published_rows(cluster, engine.strategy_field, lambda job: in_scope(job, config))


def _split(values: list[str]) -> list[str]:
    """`--user a,b` and `--user a --user b` alike, as squeue takes them."""
    return [v for value in values for v in value.split(",") if v]


def _check_states(states: list[str]) -> list[str]:
    from dike_slurm.cli.views import STATES

    unknown = [s for s in states if s.upper() not in STATES]
    if unknown:
        raise InputError(f"--state {unknown[0]!r}: one of {', '.join(STATES)} (any case)")
    return states


def _job_table(title: str, rows: list[dict], columns: list[tuple[str, str]], out=None) -> None:
    """The jobs, a line each. Piped, every column; on a terminal, the columns that fit its width,
    kept in the order of JOB_COLUMN_RANK (free text cut with an ellipsis, never folded), and a line
    naming those left out."""
    from rich.table import Table

    out = out or console
    cells = [[safe("-" if row[key] is None else row[key]) for _, key in columns] for row in rows]  # untrusted: Text
    whole = table_width(column_widths(columns, cells, cut=False)) <= out.width  # piped output always is
    shown = list(range(len(columns))) if whole else fit_columns(columns, column_widths(columns, cells, True), out.width)
    result = Table(title=title)
    for index in shown:
        header, key = columns[index]
        result.add_column(header, no_wrap=True, overflow="ellipsis",
                          max_width=max(TEXT_WIDTH, len(header)) if key in FREE_TEXT and not whole else None)
    for line in cells:
        result.add_row(*(line[index] for index in shown))
    out.print(result)
    left_out = [header for index, (header, _) in enumerate(columns) if index not in shown]
    if left_out:
        out.print(safe(f"not shown: {', '.join(left_out)} (--json has every field)"), highlight=False)


# Which columns a narrow terminal keeps first: who and what, then the engine's view, then the rest.
JOB_COLUMN_RANK = ("job", "user", "state", "gpus", "level", "expected_start", "expected_gpu_hours", "priority_now",
                   "priority_planned", "slurm_reason", "partition", "name", "attained_gpu_hours",
                   "counted_gpu_hours", "account", "reason", "placement_now", "placement_planned", "note")
FREE_TEXT = frozenset({"name", "reason", "note", "slurm_reason", "placement_now", "placement_planned"})
TEXT_WIDTH = 24  # a free-text column's width on a terminal: its start says enough; --json has it whole
_BORDER = 3  # rich's table: a space either side of a cell and one rule between columns


def column_widths(columns: list[tuple[str, str]], cells: list[list[Text]], cut: bool) -> list[int]:
    """Each column's width: its longest cell or header (free text cut to TEXT_WIDTH when `cut`)."""
    widths = []
    for index, (header, key) in enumerate(columns):
        longest = max([len(header), *(line[index].cell_len for line in cells)])
        widths.append(min(longest, max(TEXT_WIDTH, len(header))) if cut and key in FREE_TEXT else longest)
    return widths


def table_width(widths: list[int]) -> int:
    return 1 + sum(width + _BORDER for width in widths)


def fit_columns(columns: list[tuple[str, str]], widths: list[int], width: int) -> list[int]:
    """The indexes of the columns to show, in table order: the highest ranked first while the
    table, a line per row, still fits `width`."""
    rank = {key: place for place, key in enumerate(JOB_COLUMN_RANK)}
    chosen: list[int] = []
    for index in sorted(range(len(columns)), key=lambda i: rank.get(columns[i][1], len(rank))):
        if table_width([widths[i] for i in (*chosen, index)]) <= width:
            chosen.append(index)
    return sorted(chosen)


QUEUE_COLUMNS = [("job", "job"), ("name", "name"), ("user", "user"), ("account", "account"),
                 ("partition", "partition"), ("state", "state"), ("GPUs", "gpus"), ("level", "level"),
                 ("GPU-h", "attained_gpu_hours"), ("expected GPU-h", "expected_gpu_hours"), ("priority", "priority_now"),
                 ("expected start", "expected_start"), ("placement", "placement_now"),
                 ("Slurm's reason", "slurm_reason"), ("why (the policy now)", "reason"), ("note", "note")]
STATUS_COLUMNS = [("job", "job"), ("name", "name"), ("user", "user"), ("account", "account"),
                  ("partition", "partition"), ("state", "state"), ("GPUs", "gpus"), ("level", "level"),
                  ("GPU-h", "counted_gpu_hours"), ("now", "priority_now"), ("planned", "priority_planned"),
                  ("constraint", "placement_now"), ("planned constraint", "placement_planned"),
                  ("Slurm's reason", "slurm_reason"), ("note", "note")]


@app.command("queue")
def queue_command(
    users: list[str] = USER_OPTION,
    accounts: list[str] = ACCOUNT_OPTION,
    partitions: list[str] = PARTITION_OPTION,
    states: list[str] = STATE_OPTION,
    start: bool = typer.Option(True, "--start/--no-start",
                               help="each pending job's expected start (a forward simulation, at most a few "
                                    "seconds on a large queue: docs/engine.md, \"Expected start\")"),
    config_path: Optional[Path] = CONFIG_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Pending and running jobs as the engine sees them: level, GPU-hours, priority, expected start, placement, why.

    Like squeue, for every user: it reads Slurm and, read-only, the state store. A user sees why
    a job waits: its level, the service that put it there and the policy's reason.
    """
    from dike_slurm.cli.expected_start import PUBLISHED_NO_START, forecast_row, safe_forecast, start_cell, with_starts
    from dike_slurm.cli.views import matching, queue_rows

    states = _check_states(_split(states))
    config, source = load(config_path)
    say_source(source, as_json)
    viewer = _viewer(config)
    filters = {"users": _split(users), "accounts": _split(accounts), "partitions": _split(partitions), "states": states}
    if viewer.restricted:
        engine, cluster = _published(config)
        policy, note, view, now = engine.policy.name, viewer.why, "published", cluster.time
        rows = with_starts(matching(_published_rows(config, engine, cluster), **filters), None, PUBLISHED_NO_START)
        forecast = None
    else:
        engine, note = _reader(config)
        plan = engine.plan()
        policy, view, now = plan.policy, "engine", plan.time
        forecast, why_none = safe_forecast(engine, plan) if start else (None, "not computed (--no-start)")
        rows = with_starts(queue_rows(plan, engine.strategy_field.value, engine.store.jobs(), **filters), forecast,
                           why_none)
    field = engine.strategy_field.value
    if as_json:
        emit_json("queue", source, {"state_file": str(config.engine.state_db), "policy": policy, "view": view,
                                    "priority_field": field, "note": note, "jobs": rows,
                                    "expected_starts": forecast_row(forecast)})
        return
    shown = [row | {"expected_start": start_cell(row, now)} for row in rows]
    _job_table(f"dike-slurm queue: policy {policy}; priority: {field}", shown, QUEUE_COLUMNS)
    if forecast is not None and any(row["state"] == "PENDING" for row in rows):
        console.print(safe(f"expected start: {forecast.method()} (docs/engine.md, \"Expected start\")"),
                      highlight=False)
    if note:
        err_console.print(safe(f"note: {note}"))


@app.command("status")
def status_command(
    users: list[str] = USER_OPTION,
    accounts: list[str] = ACCOUNT_OPTION,
    partitions: list[str] = PARTITION_OPTION,
    states: list[str] = STATE_OPTION,
    config_path: Optional[Path] = CONFIG_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """The managed queue (level, counted GPU-hours, priority now and planned, constraint) and the
    last cycle; with Slurm down, the last cycle from the state store (exit 1)."""
    from dike_slurm.cli.views import cycle_row, prior_row, queue_rows

    states = _check_states(_split(states))
    config, source = load(config_path)
    say_source(source, as_json)
    viewer = _viewer(config)
    if viewer.restricted:
        _published_status(config, viewer, source, as_json, _split(users), _split(accounts), _split(partitions), states)
        return
    engine, note = _reader(config)
    cycles = engine.store.cycles(1)
    last = cycle_row(cycles[-1] if cycles else None)
    paused, tripped = engine.store.paused(), engine.store.breaker()
    try:
        plan = engine.plan()
    except DikeError as exc:  # Slurm down: what the store says about the last cycle is still worth seeing
        plan, slurm_error = None, str(exc)
    else:
        slurm_error = None
    field = engine.strategy_field.value
    rows = [] if plan is None else queue_rows(
        plan, field, engine.store.jobs(), users=_split(users), accounts=_split(accounts),
        partitions=_split(partitions), states=states, include_outside=False,
    )
    if as_json:
        emit_json("status", source, {
            "state_file": str(config.engine.state_db), "policy": engine.policy.name, "priority_field": field,
            "view": "engine", "paused": paused, "breaker": tripped, "slurm_error": slurm_error, "note": note,
            "jobs": rows, "last_cycle": last, "service_prior": prior_row(plan.prior if plan is not None else None),
        })
    else:
        console.print(safe(state_file_text(config)), highlight=False)
        if plan is not None:
            _job_table(f"dike-slurm status: policy {plan.policy}; now/planned: {field}", rows, STATUS_COLUMNS)
            if plan.prior is not None:
                console.print(safe(plan.prior.describe()), highlight=False)
        _print_last_cycle(last)
        for flag, text in ((paused, "PAUSED: nothing is written until `dike-slurm resume`"),
                           (tripped, "circuit breaker TRIPPED: nothing is written until `dike-slurm breaker reset`")):
            if flag is not None:
                console.print(safe(f"{text} ({flag})"))
        if note:
            err_console.print(safe(f"note: {note}"))
    if slurm_error is not None:
        raise DikeError(f"Slurm not readable, the queue is not shown: {slurm_error}")


def _published_status(config: Config, viewer: Viewer, source: str, as_json: bool, users: list[str],
                      accounts: list[str], partitions: list[str], states: list[str]) -> None:
    """`status` for a viewer Slurm restricts: their jobs as published; the store (the last cycle,
    pause and breaker) is not read for them (cli/visibility.py)."""
    from dike_slurm.cli.views import matching

    engine, cluster = _published(config)
    rows = [r for r in matching(_published_rows(config, engine, cluster), users=users, accounts=accounts,
                                partitions=partitions, states=states) if r["managed"]]
    field = engine.strategy_field.value
    if as_json:
        emit_json("status", source, {
            "state_file": str(config.engine.state_db), "policy": engine.policy.name, "priority_field": field,
            "view": "published", "paused": None, "breaker": None, "slurm_error": None, "note": viewer.why,
            "jobs": rows, "last_cycle": None,
        })
        return
    _job_table(f"dike-slurm status: policy {engine.policy.name}; now: {field}", rows, STATUS_COLUMNS)
    err_console.print(safe(f"note: {viewer.why}; the engine's last cycle is for the site's admins "
                           "(its state store is private)"))


def _print_last_cycle(last: dict | None) -> None:
    if last is None:
        console.print("no cycle has been applied yet (the state store is empty)")
        return
    console.print(safe(
        f"last cycle: {last['time'].replace('T', ' ').rstrip('Z')} UTC, {'applied' if last['applied'] else 'dry run'}, "
        f"{last['writes']} write(s), {last['errors']} error(s), {last['seconds']:.2f} s"
    ))


def _parse_job(text: str) -> tuple[int, int | None]:
    """`123` -> (123, None); `123_4` -> (123, 4) (an array task); anything else is refused."""
    head, sep, task = text.partition("_")
    if not head.isdigit() or (sep and not task.isdigit()):
        raise InputError(f"not a job id: {text!r} (123, or 123_4 for an array task)")
    return int(head), int(task) if sep else None


@app.command("explain")
def explain_command(
    job: str = typer.Argument(..., help="job id (123, or 123_4 for an array task)"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="also every parameter of the policy"),
    config_path: Optional[Path] = CONFIG_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Why this job has its level, priority and constraint, and what the engine changed on it.

    Exit 1 for a job the engine knows nothing of (not active, nothing in the state store).
    """
    from dike_slurm.cli.explain import explain, explain_published

    wanted = _parse_job(job)
    config, source = load(config_path)
    say_source(source, as_json)
    viewer = _viewer(config)
    if viewer.restricted:
        engine, cluster = _published(config)
        document = explain_published(engine, cluster, _published_rows(config, engine, cluster), wanted, job)
        document["note"] = viewer.why
    else:
        engine, note = _reader(config)
        document = explain(engine, wanted, job)
        document["note"] = note
    if as_json:
        emit_json("explain", source, document)
    else:
        from dike_slurm.cli.explain import explain_lines

        for line in explain_lines(document, verbose):
            console.print(safe(line), highlight=False)
    if document["status"] == "unknown":
        raise typer.Exit(1)


@app.command("audit")
def audit_command(
    since: Optional[str] = typer.Option(None, "--since", help="from this UTC time (2026-05-01 or 2026-05-01T12:00) or age (30m, 6h, 2d)"),
    job: Optional[int] = typer.Option(None, "--job", "-j", help="only this job id"),
    limit: int = typer.Option(200, "--limit", "-n", min=1, help="at most this many (the newest)"),
    export: Optional[Path] = typer.Option(
        None, "--export", metavar="FILE", help="write every entry (of --job, --since; no --limit) to FILE as JSON lines"
    ),
    config_path: Optional[Path] = CONFIG_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """The audit: every write, requeue, revert, skip, pause and breaker reset, with its undo command.

    A user PrivateData=jobs restricts sees the rows of their own jobs only, where they can read
    the state store at all (it is private to the service unless the site opens it)."""
    from dike_slurm.cli.views import audit_row
    from dike_slurm.store.audit_export import export_audit
    from dike_slurm.store.state import StateStore

    start = parse_since(since, time.time()) if since is not None else None
    config, source = load(config_path)
    say_source(source, as_json)
    viewer = _viewer(config)
    only = viewer.name if viewer.restricted else None
    store = StateStore(config.engine.state_db, read_only=True)
    if export is not None:  # the file is replaced whole once every entry is on disk
        count = export_audit(store.iter_audit(job, start, only), export)
        if as_json:
            emit_json("audit", source, {"state_file": str(config.engine.state_db), "export": str(export), "rows": count})
        else:
            console.print(safe(f"{count} audit row(s) written to {export}"), highlight=False)
        return
    rows = [audit_row(e) for e in store.audit_log(job, limit, start, only)]
    if as_json:
        emit_json("audit", source, {"state_file": str(config.engine.state_db), "entries": rows})
        return
    console.print(safe(state_file_text(config)), highlight=False)
    result = table("dike-slurm audit (newest last)", ["time (UTC)", "cycle", "job", "user", "action", "change",
                                                       "result", "reason", "command", "undo"],
                   no_wrap=("time (UTC)",))
    for row in rows:
        outcome = "ok" if row["ok"] else f"FAILED: {row['message']}" if row["action"] != "skipped" else row["message"]
        job = row["job_id"] or "-"  # job 0: the engine's own rows (pause, breaker, a stopped cycle)
        result.add_row(*(safe(v) for v in (row["time"], row["cycle"], job, row["user"], row["action"], row["change"],
                                            outcome, row["reason"], row["command"], row["undo"])))
    console.print(result)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float) -> float:
    """`6h`, `30m`, `2d` ago, or a UTC date / date-time, as seconds since the epoch."""
    from datetime import datetime, timezone

    word = text.strip()
    if word[:-1].isdigit() and word[-1:] in _UNITS:
        return now - int(word[:-1]) * _UNITS[word[-1]]
    try:
        moment = datetime.fromisoformat(word)
    except ValueError:
        raise InputError(f"--since {text!r}: a UTC time (2026-05-01, 2026-05-01T12:00) or an age (30m, 6h, 2d)") from None
    return moment.replace(tzinfo=moment.tzinfo or timezone.utc).timestamp()
