"""The replay report: matplotlib plots rendered first, then one self-contained HTML page (jinja2)."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources

import jinja2
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first
import numpy as np  # noqa: E402

from dike_slurm.sim.metrics import COMPARISON_HEADERS, PolicyMetrics, comparison_rows  # noqa: E402

CDF_POINTS = 600  # JCT CDF points drawn per policy (the data is subsampled evenly)
TOP_USERS = 20  # users shown in the per-user slowdown plot (most jobs first)
PLOT_STYLE = {"svg.hashsalt": "dike-slurm", "svg.fonttype": "path", "font.size": 9}


@dataclass(frozen=True)
class Plot:
    title: str
    caption: str
    data_uri: str  # data:image/svg+xml;base64,...


def _figure_uri(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(figure)
    return "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _jct_cdf(runs: Sequence[tuple[str, PolicyMetrics]]) -> Plot:
    figure, axes = plt.subplots(figsize=(7, 3.6))
    for name, metrics in runs:
        values = metrics.jct_sorted / 3600.0
        if not len(values):
            continue
        picks = np.unique(np.linspace(0, len(values) - 1, min(len(values), CDF_POINTS)).astype(int))
        axes.step(values[picks], (picks + 1) / len(values), where="post", label=name)
    axes.set_xscale("log")
    axes.set_xlabel("job completion time (hours, log scale)")
    axes.set_ylabel("fraction of jobs")
    axes.grid(True, alpha=0.3)
    axes.legend()
    return Plot("JCT distribution", "Cumulative fraction of jobs finished within a given JCT; left and high is better.", _figure_uri(figure))


def _wait_by_size(runs: Sequence[tuple[str, PolicyMetrics]]) -> Plot:
    sizes: list[str] = []
    for _, metrics in runs:
        sizes.extend(s for s in metrics.wait_by_size if s not in sizes)
    figure, axes = plt.subplots(figsize=(7, 3.4))
    width = 0.8 / max(len(runs), 1)
    positions = np.arange(len(sizes))
    for index, (name, metrics) in enumerate(runs):
        heights = [metrics.wait_by_size.get(size, 0.0) / 3600.0 for size in sizes]
        axes.bar(positions + index * width, heights, width, label=name)
    axes.set_xticks(positions + width * (len(runs) - 1) / 2, sizes)
    axes.set_xlabel("GPUs per job")
    axes.set_ylabel("mean wait (hours)")
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend()
    return Plot("Wait by job size", "Mean time pending per job, by the number of GPUs it asked for.", _figure_uri(figure))


def _user_slowdown(runs: Sequence[tuple[str, PolicyMetrics]], user_jobs: dict[str, int]) -> Plot:
    users = sorted(user_jobs, key=lambda u: (-user_jobs[u], u))[:TOP_USERS]
    figure, axes = plt.subplots(figsize=(7, 3.8))
    width = 0.8 / max(len(runs), 1)
    positions = np.arange(len(users))
    for index, (name, metrics) in enumerate(runs):
        axes.bar(positions + index * width, [metrics.user_slowdown.get(u, 0.0) for u in users], width, label=name)
    axes.set_xticks(positions + width * (len(runs) - 1) / 2, [f"#{i + 1}" for i in range(len(users))])
    axes.set_yscale("log")
    axes.set_xlabel("users, most jobs first (names in the table below)")
    axes.set_ylabel("mean slowdown (log scale)")
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend()
    return Plot(
        "Per-user slowdown",
        f"Mean slowdown (JCT / run time alone) of the {len(users)} users with the most jobs; "
        "even bars mean fair treatment.",
        _figure_uri(figure),
    )


def _time_axis(metrics: PolicyMetrics, count: int) -> np.ndarray:
    return (np.arange(count) + 0.5) * metrics.bin_width_s / 86400.0


def _utilization(runs: Sequence[tuple[str, PolicyMetrics]]) -> Plot:
    figure, axes = plt.subplots(figsize=(7, 3.2))
    for name, metrics in runs:
        series = np.array(metrics.utilization_series)
        axes.plot(_time_axis(metrics, len(series)), series * 100.0, label=name, linewidth=1)
    axes.set_xlabel("days since the first submission")
    axes.set_ylabel("GPUs allocated (%)")
    axes.set_ylim(0, 105)
    axes.grid(True, alpha=0.3)
    axes.legend()
    return Plot("GPU utilisation over time", "Share of the cluster's GPUs allocated to jobs (restarts and slow-downs included).", _figure_uri(figure))


def _levels(name: str, metrics: PolicyMetrics) -> Plot:
    figure, axes = plt.subplots(figsize=(7, 3.2))
    levels = sorted(metrics.level_series)
    count = len(next(iter(metrics.level_series.values()))) if levels else 0
    series = [np.nan_to_num(np.array(metrics.level_series[level])) for level in levels]
    if levels:
        axes.stackplot(_time_axis(metrics, count), series, labels=[f"level {level}" for level in levels], alpha=0.85)
    axes.set_xlabel("days since the first submission")
    axes.set_ylabel("active jobs")
    axes.grid(True, alpha=0.3)
    axes.legend(loc="upper left")
    return Plot(
        f"Queue levels over time: {name}",
        "Pending and running jobs in each queue level at the policy cycles (mean per time bin).",
        _figure_uri(figure),
    )


def build_plots(runs: Sequence[tuple[str, PolicyMetrics]], user_jobs: dict[str, int]) -> list[Plot]:
    """Every plot of the report, in page order."""
    with plt.rc_context(PLOT_STYLE):
        plots = [_jct_cdf(runs), _wait_by_size(runs), _user_slowdown(runs, user_jobs), _utilization(runs)]
        for name, metrics in runs:
            if len(metrics.level_series) > 1:
                plots.append(_levels(name, metrics))
    return plots


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


def render_report(
    *,
    input_section: dict,
    settings: dict,
    runs: Sequence[tuple[str, PolicyMetrics]],
    user_jobs: dict[str, int],
    penalty_rows: list[list[str]],
    penalty_headers: list[str],
    timings: dict[str, float],
) -> str:
    """The whole report page; every number is computed before the template renders."""
    plots = build_plots(runs, user_jobs)
    top_users = sorted(user_jobs, key=lambda u: (-user_jobs[u], u))[:TOP_USERS]
    user_rows = [
        [f"#{i + 1}", user, str(user_jobs[user])] + [f"{metrics.user_slowdown.get(user, 0.0):.2f}" for _, metrics in runs]
        for i, user in enumerate(top_users)
    ]
    template = template_environment().get_template("report.html.j2")
    return template.render(
        input=input_section,
        settings=settings,
        headers=list(COMPARISON_HEADERS),
        rows=comparison_rows((name, metrics.summary) for name, metrics in runs),
        penalty_headers=penalty_headers,
        penalty_rows=penalty_rows,
        plots=plots,
        user_headers=["", "user", "jobs"] + [name for name, _ in runs],
        user_rows=user_rows,
        timings=timings,
    )
