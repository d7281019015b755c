"""The replay report: every value is computed here (comparison, headline, thresholds, settings) and
the plots drawn (sim/eval/report_plots.py) before one self-contained HTML page renders (jinja2)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import jinja2
import numpy as np

from dike_slurm.domain.model import Snapshot
from dike_slurm.policies.base import PolicyParams
from dike_slurm.policies.dike import DikeParams, thresholds_gpu_s
from dike_slurm.policies.tiresias import TiresiasParams
from dike_slurm.sim.kernel.metrics import PolicyMetrics
from dike_slurm.sim.kernel.warm import start_sentence
from dike_slurm.sim.eval.report_compare import comparison, headline
from dike_slurm.sim.eval.report_plots import build_plots, policy_colours, top_users

# Every metric is compared with the first of these that was replayed: Slurm's multifactor is what
# a site runs today, fifo the textbook baseline.
BASELINES = ("multifactor", "fifo")


def baseline_of(names: Sequence[str]) -> str:
    """The policy the others are compared with."""
    return next((name for name in BASELINES if name in names), names[0])


def template_environment() -> jinja2.Environment:
    """The package's templates: HTML autoescaped, undefined names are errors."""
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(
            lambda name: resources.files("dike_slurm.templates").joinpath(name).read_text(encoding="utf-8")
        ),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )


@dataclass(frozen=True)
class Thresholds:
    """The demotion thresholds a levelled policy used: how they were set, and their values."""

    policy: str
    rule: str
    values: list[str]  # one text per threshold: "level i from ..."


def _gpuh(seconds: float) -> str:
    return f"{seconds / 3600:.2f} GPU-h"


def _listed(values: Sequence[float]) -> str:
    return ", ".join(f"{v:g}" for v in values)


def thresholds_at(params: DikeParams, metrics: PolicyMetrics, at: float, history_window_s: float) -> tuple[list[float], str]:
    """Dike's thresholds (GPU-seconds) and their origin at time `at`: its own rule
    (`policies.dike.thresholds_gpu_s`) applied to what the simulator hands it then, the GPU service
    of the jobs that ended within the history window."""
    ends = metrics.finished_end
    low, high = np.searchsorted(ends, at - history_window_s, "left"), np.searchsorted(ends, at, "right")
    history = tuple(np.sort(metrics.finished_service_gpu_s[low:high]).tolist())
    return thresholds_gpu_s(Snapshot(time=at, jobs=(), nodes=(), completed_service_gpu_s=history), params)


def derived_thresholds(params: DikeParams, metrics: PolicyMetrics, history_window_s: float) -> list[tuple[float, list[float], str]]:
    """(time, thresholds, origin) at the end of every time bin that had a policy cycle."""
    series = []
    for index, cycles in enumerate(metrics.cycles_per_bin):
        if cycles:
            at = metrics.origin + (index + 1) * metrics.bin_width_s
            series.append((at, *thresholds_at(params, metrics, at, history_window_s)))
    return series


def thresholds_used(name: str, params: PolicyParams, metrics: PolicyMetrics, history_window_s: float) -> Thresholds | None:
    """The thresholds of a policy with queue levels (Tiresias, Dike); None for the others. The
    metrics are read only for thresholds derived from history."""
    if isinstance(params, TiresiasParams):
        return Thresholds(name, "configured (thresholds_gpu_s)", [_gpuh(v) for v in params.thresholds_gpu_s])
    if not isinstance(params, DikeParams):
        return None
    if params.thresholds_gpuh is not None:
        return Thresholds(name, "configured (thresholds_gpuh)", [_gpuh(h * 3600) for h in params.thresholds_gpuh])
    series = derived_thresholds(params, metrics, history_window_s)
    derived = [values for _, values, origin in series if origin.startswith("derived")]
    fallback_bins = len(series) - len(derived)
    rule = (
        f"derived at every cycle: quantiles {_listed(params.quantiles())} of the GPU service of the jobs finished "
        f"in the last {history_window_s / 86400:g} days; {_listed([v / 3600 for v in params.fallback_gpu_s()])} GPU-h "
        f"while fewer than {params.min_history_jobs} had finished ({fallback_bins} of {len(series)} time bins with cycles)"
    )
    if not derived:
        return Thresholds(name, rule, [f"{_gpuh(v)} (fallback throughout)" for v in params.fallback_gpu_s()])
    columns = np.array(derived)
    return Thresholds(
        name,
        rule,
        [
            f"{_gpuh(columns[-1, i])} at the end ({columns[:, i].min() / 3600:.2f}-{columns[:, i].max() / 3600:.2f} over the replay)"
            for i in range(columns.shape[1])
        ],
    )


def _parameter_text(value: object) -> str:
    if value is None:
        return "unset"
    return value if isinstance(value, str) else json.dumps(value)


def parameter_table(params: Mapping[str, PolicyParams]) -> tuple[list[str], list[list[str]]]:
    """Every policy parameter as (headers, rows): a row per parameter, a column per policy that has
    parameters ("-": not one of its)."""
    dumps = {name: dump for name, p in params.items() if (dump := p.model_dump(mode="json"))}
    keys = list(dict.fromkeys(key for dump in dumps.values() for key in dump))
    rows = [[key] + [_parameter_text(dump[key]) if key in dump else "-" for dump in dumps.values()] for key in keys]
    return ["parameter", *dumps], rows


def preemption_text(choice: float | str, preemptible_jobs: int, jobs: int) -> str:
    """The preemption setting in words, for the title: "no job preemptible", "every job
    preemptible", "a share of 0.5 preemptible (1,107 of 2,229 jobs)", "preemptible by the engine's
    opt-in rule (0 of 2,229 jobs)"."""
    if choice == "live":
        return f"preemptible by the engine's opt-in rule ({preemptible_jobs:,} of {jobs:,} jobs)"
    if choice == 0:
        return "no job preemptible"
    if choice == 1:
        return "every job preemptible"
    return f"a share of {choice:g} preemptible ({preemptible_jobs:,} of {jobs:,} jobs)"


def report_title(case: str, dump: str, preemption: str) -> str:
    """The page's title: the case, its file and the preemption setting."""
    return f"Replay of {case} ({dump}): {preemption}"


def describe_source(source: Mapping) -> str:
    """summary.json's `config` in words: the file and who named it, or the defaults, then the variables."""
    where = {"file": "(--config)", "env": "($DIKE_CONFIG)"}
    base = f"{source['path']} {where[source['kind']]}" if source["path"] else "built-in defaults (no file)"
    return base + "".join(f" + {variable}" for variable in source["variables"])


def render_report(
    *,
    case: str,
    input_section: dict,
    unfinished: str,
    settings: dict,
    runs: Sequence[tuple[str, PolicyMetrics]],
    user_jobs: dict[str, int],
    penalty_rows: list[list[str]],
    penalty_headers: list[str],
    timings: dict[str, float],
    params: Mapping[str, PolicyParams] | None = None,
    config_source: Mapping | None = None,
) -> str:
    """The whole report page; every number is computed before the template renders.

    `case` names the dump (ReplayInput.case); `settings` holds `preemptible` (the choice) and
    `preemptible_jobs`, which the title states with the case. `unfinished`: what the replay did with
    the jobs that had not ended when the dump was taken ("" when all had). `params` (a policy's or a
    tune candidate's, by name) gives the parameters and thresholds, `config_source` where it came from
    (summary.json's `config`: kind, path, variables); without them the settings say they were not
    passed.
    """
    names = [name for name, _ in runs]
    baseline = baseline_of(names)
    summaries = {name: metrics.summary for name, metrics in runs}
    sentences = [headline(name, summaries[name], summaries[baseline], baseline) for name in names if name != baseline]
    plots = build_plots(runs, user_jobs, baseline)
    users = top_users(user_jobs)
    user_rows = [
        [user, str(user_jobs[user])] + [f"{metrics.user_slowdown.get(user, 0.0):.2f}" for _, metrics in runs]
        for user in users
    ]
    parameter_headers, parameter_rows = parameter_table(params) if params is not None else ([], [])
    thresholds = [
        row
        for name, metrics in runs
        if params is not None
        and (row := thresholds_used(name, params[name], metrics, float(settings["history_window_days"]) * 86400.0))
    ]
    config_path = config_source["path"] if config_source is not None else None
    template = template_environment().get_template("report.html.j2")
    preemption = preemption_text(settings["preemptible"], settings["preemptible_jobs"], input_section["jobs_replayed"])
    return template.render(
        title=report_title(case, input_section["dump"], preemption),
        input=input_section,
        unfinished=unfinished,
        start=start_sentence(input_section["history"]),
        settings=settings,
        baseline=baseline,
        colours=policy_colours(names),
        names=names,
        headlines=sentences,
        comparison=comparison(summaries, baseline),
        penalty_headers=penalty_headers,
        penalty_rows=penalty_rows,
        plots=plots,
        user_headers=["user", "jobs"] + names,
        user_rows=user_rows,
        params_passed=params is not None,
        parameter_headers=parameter_headers,
        parameter_rows=parameter_rows,
        without_parameters=[name for name in params or () if not params[name].model_dump()],
        thresholds=thresholds,
        threshold_count=max((len(t.values) for t in thresholds), default=0),
        config_line=describe_source(config_source) if config_source is not None else "",
        config_text=Path(config_path).read_text(encoding="utf-8") if config_path else "",
        timings={name: f"{seconds:.1f}" for name, seconds in timings.items()},
    )
