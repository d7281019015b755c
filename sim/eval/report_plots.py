"""The replay report's plots: one fixed colour per policy, shared axes where plots compare, time in
units that suit the span. matplotlib is imported when the plots are drawn, not with this module."""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dike_slurm.sim.kernel.metrics import PolicyMetrics

CDF_POINTS = 600  # JCT CDF points drawn per policy (the data is subsampled evenly)
TOP_USERS = 20  # users shown in the per-user slowdown plot (most jobs first)
USER_LABEL_CHARS = 24  # longer user names are cut with an ellipsis in the plot (whole in the table)
FIGURE_WIDTH_IN = 13.5  # about the 1,400 px page at the browser's 96 px per inch
PLOT_STYLE = {
    "svg.hashsalt": "dike-slurm",
    "svg.fonttype": "path",
    "font.size": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
}

# One colour (and line style) per policy, in every plot and table: Okabe-Ito, safe for colour blindness.
POLICY_COLOURS = {
    "fifo": "#4d4d4d",
    "multifactor": "#e69f00",
    "tiresias": "#009e73",
    "srtf_oracle": "#cc79a7",
    "dike": "#0072b2",
}
# Policies without a fixed colour (third-party ones) take these, in the order they appear.
SPARE_COLOURS = ("#d55e00", "#8c6d31", "#b8b800", "#17becf", "#e41a1c", "#000000")
BASELINE_LINESTYLE = (0, (5, 2))  # the baseline is dashed, so that it reads where lines overlap
# Queue levels: shades of purple, darkest = level 0 (served first); no policy colour is a purple.
LEVEL_RAMP = ("#3f007d", "#54278f", "#6a51a3", "#807dba", "#9e9ac8", "#b3b0d6", "#cbc9e2", "#dadaeb")


@dataclass(frozen=True)
class Plot:
    title: str
    caption: str
    data_uri: str  # data:image/svg+xml;base64,...


def policy_colours(names: Sequence[str]) -> dict[str, str]:
    """name -> colour: the fixed one of a known policy, else the next spare one."""
    colours: dict[str, str] = {}
    spares = iter(SPARE_COLOURS * (1 + len(names) // len(SPARE_COLOURS)))
    for name in names:
        colours[name] = POLICY_COLOURS.get(name) or next(spares)
    return colours


def level_colours(count: int) -> list[str]:
    """Colours of levels 0..count-1, spread over the ramp so that neighbours differ."""
    picks = np.linspace(0, len(LEVEL_RAMP) - 1, count).round().astype(int) if count > 1 else [0]
    return [LEVEL_RAMP[i] for i in picks]


def time_unit(span_s: float) -> tuple[float, str]:
    """(seconds per unit, unit name) for an axis spanning span_s: minutes, hours or days."""
    if span_s <= 3 * 3600:
        return 60.0, "minutes"
    if span_s <= 3 * 86400:
        return 3600.0, "hours"
    return 86400.0, "days"


def _linestyle(name: str, baseline: str) -> object:
    return BASELINE_LINESTYLE if name == baseline else "solid"


def _scale_x(axes, values: Sequence[float]) -> str:
    """A log x axis labelled in plain numbers when the values span a decade or more, else a
    linear one (a log axis over 1.0-1.3 reads "1.05x10^0"); returns the label's suffix."""
    from matplotlib.ticker import FuncFormatter

    positive = [v for v in values if v > 0]
    if not positive or max(positive) < 10 * min(positive):
        return ""
    axes.set_xscale("log")
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    return ", log scale"


def _figure_uri(figure) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(figure)
    return "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _jct_cdf(plt, runs: Sequence[tuple[str, PolicyMetrics]], colours: dict[str, str], baseline: str) -> Plot:
    figure, axes = plt.subplots(figsize=(FIGURE_WIDTH_IN, 4.2))
    drawn: list[float] = []
    for name, metrics in runs:
        values = metrics.jct_sorted / 3600.0
        if not len(values):
            continue
        picks = np.unique(np.linspace(0, len(values) - 1, min(len(values), CDF_POINTS)).astype(int))
        axes.step(
            values[picks], (picks + 1) / len(values), where="post", label=name, color=colours[name],
            linestyle=_linestyle(name, baseline), linewidth=1.6,
            zorder=3 if name == baseline else 2,  # the dashed baseline on top: the others show through its gaps
        )
        drawn += [float(values[0]), float(values[-1])]
    axes.set_xlabel(f"job completion time (hours{_scale_x(axes, drawn)})")
    axes.set_ylabel("fraction of jobs")
    axes.set_ylim(0, 1.02)
    axes.grid(True, alpha=0.3)
    axes.legend(loc="lower right")
    return Plot("JCT distribution", "Cumulative fraction of jobs finished within a given JCT; left and high is better.", _figure_uri(figure))


def _wait_by_size(plt, runs: Sequence[tuple[str, PolicyMetrics]], colours: dict[str, str]) -> Plot:
    sizes: list[str] = []
    for _, metrics in runs:
        sizes.extend(s for s in metrics.wait_by_size if s not in sizes)
    figure, axes = plt.subplots(figsize=(FIGURE_WIDTH_IN, 3.6))
    width = 0.8 / max(len(runs), 1)
    positions = np.arange(len(sizes))
    for index, (name, metrics) in enumerate(runs):
        heights = [metrics.wait_by_size.get(size, 0.0) / 3600.0 for size in sizes]
        axes.bar(positions + index * width, heights, width, label=name, color=colours[name])
    axes.set_xticks(positions + width * (len(runs) - 1) / 2, sizes)
    axes.set_xlabel("GPUs per job")
    axes.set_ylabel("mean wait (hours)")
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend()
    return Plot("Wait by job size", "Mean time pending per job, by the number of GPUs it asked for.", _figure_uri(figure))


def top_users(user_jobs: dict[str, int]) -> list[str]:
    """The users with the most jobs (ties by name), at most TOP_USERS."""
    return sorted(user_jobs, key=lambda u: (-user_jobs[u], u))[:TOP_USERS]


def user_label(user: str, jobs: int) -> str:
    """A user's axis label, "name (jobs)": the name cut to USER_LABEL_CHARS, `$` escaped (matplotlib
    would draw a user named "$x$" as mathtext, an italic x)."""
    cut = user if len(user) <= USER_LABEL_CHARS else user[: USER_LABEL_CHARS - 1] + "\u2026"
    return cut.replace("$", r"\$") + f" ({jobs})"


def _user_slowdown(
    plt, runs: Sequence[tuple[str, PolicyMetrics]], user_jobs: dict[str, int], colours: dict[str, str]
) -> Plot:
    """A dot plot: a row per user (names readable on the y axis), a coloured marker per policy."""
    users = top_users(user_jobs)
    figure, axes = plt.subplots(figsize=(FIGURE_WIDTH_IN, 1.0 + 0.32 * max(len(users), 1)))
    rows = np.arange(len(users))[::-1]  # most jobs at the top
    markers = "osD^v<>p"
    for row, user in zip(rows, users):
        values = [metrics.user_slowdown[user] for _, metrics in runs if user in metrics.user_slowdown]
        if values:
            axes.hlines(row, min(values), max(values), color="#bbbbbb", linewidth=1, zorder=1)
    for index, (name, metrics) in enumerate(runs):
        present = [(row, metrics.user_slowdown[user]) for row, user in zip(rows, users) if user in metrics.user_slowdown]
        axes.scatter(  # hollow markers of different shapes: coinciding values stay visible
            [value for _, value in present], [row for row, _ in present], label=name, facecolors="none",
            edgecolors=colours[name], linewidths=1.6, marker=markers[index % len(markers)], s=44, zorder=2,
        )
    axes.set_yticks(rows, [user_label(user, user_jobs[user]) for user in users])
    axes.set_ylim(-0.7, len(users) - 0.3)
    shown = [metrics.user_slowdown[user] for _, metrics in runs for user in users if user in metrics.user_slowdown]
    axes.set_xlabel(f"mean slowdown (JCT / run time alone{_scale_x(axes, shown)})")
    axes.grid(True, axis="x", alpha=0.3)
    axes.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=len(runs), frameon=False)
    return Plot(
        "Per-user slowdown",
        f"Mean slowdown of the {len(users)} users with the most jobs (jobs in brackets, most at the top); "
        "a grey bar spans the policies' values for one user. Markers near 1 and close together are fair.",
        _figure_uri(figure),
    )


def _time_axis(metrics: PolicyMetrics, count: int, unit_s: float) -> np.ndarray:
    return (np.arange(count) + 0.5) * metrics.bin_width_s / unit_s


def _span_s(runs: Sequence[tuple[str, PolicyMetrics]]) -> float:
    return max((len(m.utilization_series) * m.bin_width_s for _, m in runs), default=0.0)


def _utilization(
    plt, runs: Sequence[tuple[str, PolicyMetrics]], colours: dict[str, str], baseline: str
) -> Plot:
    """Small multiples: a panel per policy on shared axes, the baseline drawn faintly in each other panel."""
    unit_s, unit = time_unit(_span_s(runs))
    figure, panels = plt.subplots(
        len(runs), 1, figsize=(FIGURE_WIDTH_IN, 0.6 + 1.6 * len(runs)), sharex=True, sharey=True, squeeze=False,
        gridspec_kw={"hspace": 0.35},
    )
    reference = dict(runs).get(baseline)
    for axes, (name, metrics) in zip(panels[:, 0], runs):
        series = np.array(metrics.utilization_series) * 100.0
        if reference is not None and name != baseline:
            base = np.array(reference.utilization_series) * 100.0
            axes.plot(
                _time_axis(reference, len(base), unit_s), base, color=colours[baseline], linestyle=BASELINE_LINESTYLE,
                linewidth=0.9, alpha=0.7, label=baseline,
            )
        axes.plot(_time_axis(metrics, len(series), unit_s), series, color=colours[name], linewidth=1.3, label=name)
        axes.set_ylim(0, 105)
        axes.set_ylabel("%")
        axes.grid(True, alpha=0.3)
        axes.set_title(f"{name}: {metrics.summary['gpu_utilization']:.1%} over the makespan", loc="left", fontsize=10, color=colours[name])
        axes.legend(loc="lower right", fontsize=8)
    panels[-1, 0].set_xlabel(f"{unit} since the first submission")
    return Plot(
        "GPU utilisation over time",
        f"Share of the cluster's GPUs allocated to jobs (restarts and slow-downs included), a panel per policy on "
        f"the same axes; the dashed line in each panel is {baseline}.",
        _figure_uri(figure),
    )


def filled_levels(series: list[float]) -> np.ndarray:
    """A level series whose bins without a policy cycle between two with one hold the last sampled
    value (a postponed cycle: nothing could start), and 0 before the first and after the last."""
    values = np.array(series, dtype=np.float64)
    sampled = np.flatnonzero(~np.isnan(values))
    if not len(sampled):
        return np.zeros_like(values)
    last = np.where(~np.isnan(values), np.arange(len(values)), 0)
    np.maximum.accumulate(last, out=last)
    filled = values[last]
    filled[: sampled[0]] = 0.0
    filled[sampled[-1] + 1 :] = 0.0
    return filled


def _levels(plt, runs: Sequence[tuple[str, PolicyMetrics]], colours: dict[str, str]) -> Plot:
    """Every multi-level policy's jobs per queue level, a panel each on shared axes."""
    unit_s, unit = time_unit(_span_s(runs))
    top = max(max(m.level_series) for _, m in runs) + 1
    shades = level_colours(top)
    figure, panels = plt.subplots(
        len(runs), 1, figsize=(FIGURE_WIDTH_IN, 0.8 + 2.0 * len(runs)), sharex=True, sharey=True, squeeze=False,
        gridspec_kw={"hspace": 0.3},
    )
    for axes, (name, metrics) in zip(panels[:, 0], runs):
        levels = sorted(metrics.level_series)
        count = len(metrics.level_series[levels[0]])
        stacks = axes.stackplot(
            _time_axis(metrics, count, unit_s), [filled_levels(metrics.level_series[level]) for level in levels],
            labels=[f"level {level}" for level in levels], colors=[shades[level] for level in levels],
            linewidth=0.5,
        )
        for stack in stacks:  # edges in the fill colour: no hairline gaps between the layers
            stack.set_edgecolor(stack.get_facecolor())
        axes.set_ylabel("active jobs")
        axes.grid(True, alpha=0.3)
        axes.set_title(name, loc="left", fontsize=10, color=colours[name])
        axes.legend(loc="upper left", fontsize=8, ncols=len(levels))
    panels[-1, 0].set_xlabel(f"{unit} since the first submission")
    return Plot(
        "Queue levels over time",
        "Pending and running jobs in each queue level at the policy cycles (mean per time bin; a bin without a "
        "cycle between two with one keeps the last value), level 0 darkest and served first; the panels share their axes.",
        _figure_uri(figure),
    )


def build_plots(runs: Sequence[tuple[str, PolicyMetrics]], user_jobs: dict[str, int], baseline: str) -> list[Plot]:
    """Every plot of the report, in page order; `baseline` is drawn dashed and behind the others."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = policy_colours([name for name, _ in runs])
    with plt.rc_context(PLOT_STYLE):
        plots = [
            _jct_cdf(plt, runs, colours, baseline),
            _wait_by_size(plt, runs, colours),
            _user_slowdown(plt, runs, user_jobs, colours),
            _utilization(plt, runs, colours, baseline),
        ]
        levelled = [(name, metrics) for name, metrics in runs if len(metrics.level_series) > 1]
        if levelled:
            plots.append(_levels(plt, levelled, colours))
    return plots
