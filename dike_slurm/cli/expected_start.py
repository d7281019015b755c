"""The expected starts `queue` and `explain` show: the forward simulation (sim/forward.py) of the
engine's plan, and the fields and cells that show it.

It runs only for these commands, never in an engine cycle. Slurm's scheduler settings are the
replay's (`sim_settings`) from the site's slurm.conf when the configuration names one
(`slurm.slurm_conf`), else Slurm's defaults with the scheduler depth the engine read; each job's
expected run time is the policy's service prior (its expected GPU service over its GPUs) where the
policy has one for it. The clock is the plan's: the time of its read of Slurm.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from dike_slurm.domain.model import JobState

if TYPE_CHECKING:
    from dike_slurm.config import Config
    from dike_slurm.cycle.engine import Engine
    from dike_slurm.cycle.plan import CyclePlan
    from dike_slurm.sim.forward import Forecast
    from dike_slurm.sim.kernel.records import SimSettings

# A user Slurm restricts sees only their own jobs: the jobs ahead of theirs cannot be simulated.
PUBLISHED_NO_START = ("not computed: Slurm shows you only your own jobs (PrivateData=jobs), so the jobs ahead of "
                      "yours cannot be simulated; an admin's `dike-slurm queue` or `explain` shows it")


def forecast(engine: Engine, plan: CyclePlan) -> Forecast:
    """Every pending job's expected start, from the plan's read of Slurm and its service prior."""
    from dike_slurm.sim.forward import ForwardInputs, expected_starts
    from dike_slurm.domain.model import Topology

    jobs = [p.job for p in plan.jobs] + list(plan.outside)
    by_id = {job.job_id: job for job in jobs}
    runs = {job_id: prediction.gpu_s / by_id[job_id].gpus for job_id, prediction in plan.expected.items()
            if job_id in by_id and by_id[job_id].gpus > 0}
    model = engine.site_priority
    tiers = {name: entry.tier for name, entry in model.partitions.items()} if model is not None else {}
    return expected_starts(ForwardInputs(
        at=plan.time, jobs=jobs, nodes=plan.nodes, topology=plan.topology or Topology(), expected_run_s=runs,
        settings=scheduler_settings(engine.config, model.scheduler_depth if model is not None else None),
        tiers=tiers,
    ))


def scheduler_settings(config: Config, depth: int | None) -> SimSettings:
    """The replay's settings of the site's slurm.conf (its SchedulerParameters), else Slurm's defaults."""
    from dike_slurm.errors import DikeError
    from dike_slurm.parsing.slurm_options import DEFAULT_BF_MAX_JOB_TEST
    from dike_slurm.sim.kernel.records import SimSettings
    from dike_slurm.sim.kernel.replay import DEFAULT_BATCH_SCHED_DELAY_S, sim_settings
    from dike_slurm.slurm.slurm_conf import load_cluster

    path = config.slurm.slurm_conf
    if path is not None:
        try:
            conf, _ = load_cluster(path, config.slurm.topology_conf)
            return sim_settings(config, conf, source=str(path))
        except (DikeError, OSError):
            pass  # Slurm's defaults below: the expected start is still worth having
    return SimSettings(bf_max_job_test=depth or DEFAULT_BF_MAX_JOB_TEST, batch_sched_delay_s=DEFAULT_BATCH_SCHED_DELAY_S,
                       backfill_reservations=config.replay.backfill_reservations,
                       run_overhead_s=config.replay.run_overhead_s)


def forecast_row(forecast: Forecast | None) -> dict[str, Any] | None:
    """What the simulation took (`expected_starts` in `queue --json` and `explain --json`)."""
    if forecast is None:
        return None
    return {"method": forecast.method(), "at": forecast.at, "horizon_s": forecast.horizon_s,
            "simulated_pending": forecast.simulated, "seated_running": forecast.seated, "basis": dict(forecast.basis)}


def start_fields(forecast: Forecast | None, job_id: int, state: str, unavailable: str = "") -> dict[str, Any]:
    """A job's `expected_start` (epoch s, whole), `expected_start_time` (UTC ISO) and
    `expected_start_note` (why there is none; null when there is one). `state`: as squeue prints it."""
    if state != JobState.PENDING.value:
        return _fields(None, f"{state.lower()}: only a pending job has an expected start")
    if forecast is None:
        return _fields(None, unavailable or "not computed")
    expected = forecast.starts.get(job_id)
    if expected is None:
        return _fields(None, "not in the simulation's read of the queue")
    return _fields(expected.at, expected.why or None)


def with_starts(rows: list[dict[str, Any]], forecast: Forecast | None, unavailable: str = "") -> list[dict[str, Any]]:
    """The rows, each with its start fields."""
    return [row | start_fields(forecast, row["job_id"], row["state"], unavailable) for row in rows]


def safe_forecast(engine: Engine, plan: CyclePlan) -> tuple[Forecast | None, str]:
    """The forecast, or None and why: a failure of the simulation costs the column, not the command."""
    from dike_slurm.errors import DikeError

    try:
        return forecast(engine, plan), ""
    except (DikeError, RuntimeError) as exc:
        return None, f"not computed: the simulation failed ({exc})"


def _fields(at: float | None, note: str | None) -> dict[str, Any]:
    from dike_slurm.cli.views import utc

    whole = round(at) if at is not None else None  # Slurm's times are whole seconds
    return {"expected_start": whole, "expected_start_time": utc(whole) if whole is not None else None,
            "expected_start_note": note}


def start_cell(row: dict[str, Any], now: float) -> str:
    """The table's cell: `in 12m (14:05Z)`, or a word for why there is none."""
    at = row.get("expected_start")
    if at is not None:
        clock = time.strftime("%H:%M" if at - now < 86400 else "%m-%d %H:%M", time.gmtime(at))
        return f"{ahead(at - now)} ({clock}Z)"
    note = row.get("expected_start_note") or ""
    for word, label in _LABELS:
        if note.startswith(word):
            return label
    return "-"


_LABELS = (("held", "held"), ("waits on a dependency", "dependency"), ("Slurm keeps it waiting", "not modelled"),
           ("further down", "beyond the cap"), ("fits no set", "fits no nodes"), ("not within", "beyond horizon"),
           ("not computed", "not computed"))


def ahead(seconds: float) -> str:
    """`now`, `in 45s`, `in 12m`, `in 3h05m`, `in 2d04h`."""
    seconds = max(0, round(seconds))
    if seconds < 1:
        return "now"
    if seconds < 60:
        return f"in {seconds}s"
    if seconds < 3600:
        return f"in {seconds // 60}m"
    if seconds < 86400:
        return f"in {seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"in {seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def start_lines(job: dict[str, Any], forecast: dict[str, Any] | None) -> list[str]:
    """explain's lines for a pending job: its expected start or why none, and how it was found."""
    if job.get("expected_start") is None:
        return [f"  expected start: none: {job.get('expected_start_note') or 'not computed'}"]
    lines = [f"  expected start: {job['expected_start_time'].replace('T', ' ').rstrip('Z')} UTC"
             + (f", {ahead(job['expected_start'] - forecast['at'])}" if forecast is not None else "")]
    if forecast is not None:
        lines.append(f"    ({forecast['method']}; its measured error: docs/engine.md, \"Expected start\")")
    return lines
