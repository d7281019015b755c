"""The report's comparison: every metric against a baseline policy (fifo when replayed), the best
value per metric, and the headline sentence that names the tails a policy makes worse."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

SAME_WITHIN = 1.005  # factors closer to 1 than this read "same"
TAIL_WORSE_FROM = 1.05  # a tail at least this factor worse than the baseline is called out


def _hours(value: float) -> str:
    return f"{value / 3600:.2f}"


def _percent(value: float) -> str:
    return f"{value:.1%}"


def _fixed(digits: int) -> Callable[[float], str]:
    return lambda value: f"{value:.{digits}f}"


def _count(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class Metric:
    """A row of the comparison: a summary.json key, how it reads, and which way is better."""

    key: str
    label: str
    better: str  # "lower", "higher" or "" (a count that is neither)
    format: Callable[[float], str]
    tail: bool = False  # a tail or fairness figure the headline checks
    bounded: bool = False  # a share in [0, 1]: the headline says "from a to b" rather than a factor


METRICS = (
    Metric("jobs", "jobs", "", _count),
    Metric("avg_jct_s", "average JCT (h)", "lower", _hours),
    Metric("p50_jct_s", "p50 JCT (h)", "lower", _hours),
    Metric("p95_jct_s", "p95 JCT (h)", "lower", _hours, tail=True),
    Metric("p99_jct_s", "p99 JCT (h)", "lower", _hours, tail=True),
    Metric("avg_wait_s", "average wait (h)", "lower", _hours),
    Metric("max_wait_s", "longest wait (h)", "lower", _hours, tail=True),
    Metric("makespan_s", "makespan (h)", "lower", _hours),
    Metric("gpu_utilization", "useful GPU utilisation", "higher", _percent, bounded=True),
    Metric("avg_slowdown", "average slowdown", "lower", _fixed(2)),
    Metric("p95_slowdown", "p95 slowdown", "lower", _fixed(2), tail=True),
    Metric("user_jain_index", "user Jain index", "higher", _fixed(3), tail=True, bounded=True),
    Metric("worst_user_slowdown", "worst user slowdown", "lower", _fixed(2), tail=True),
    Metric("preemptions", "preemptions", "lower", _count),
    Metric("max_preemptions_per_job", "most preemptions of one job", "lower", _count),
    Metric("p99_preemptions_per_job", "p99 preemptions per job", "lower", _count),
    Metric("useful_gpu_h", "useful GPU-hours (each job's work once)", "", _fixed(1)),
    Metric("preemption_lost_gpu_h", "GPU-hours lost to preemption", "lower", _fixed(1)),
    Metric("slowed_gpu_h", "GPU-hours lost to slow-down (spread jobs)", "lower", _fixed(1)),
    Metric("lost_gpu_fraction", "share of GPU-hours lost", "lower", _percent),
    Metric("heavy_consolidated_fraction", "heavy jobs consolidated", "higher", _percent, bounded=True),
    Metric("heavy_jobs", "communication-heavy jobs", "", _count),
    Metric("avg_jct_heavy_s", "average JCT, heavy jobs (h)", "lower", _hours),
    Metric("avg_jct_light_s", "average JCT, light jobs (h)", "lower", _hours),
)
LEAD = METRICS[1]  # the headline leads with average JCT


@dataclass(frozen=True)
class Change:
    """One value against the baseline's: "better", "worse" or "same", and by what factor (>= 1)."""

    verdict: str
    factor: float | None  # None when the baseline or the value is 0 (no factor)

    @property
    def text(self) -> str:
        if self.verdict == "same":
            return "same"
        return f"{self.factor:.2f}x {self.verdict}" if self.factor is not None else self.verdict


def factor_text(factor: float) -> str:
    """A factor for a sentence, without trailing zeros: "1.06x" (two decimals below 2), "2.9x", "22.1x"."""
    return f"{factor:.{2 if factor < 2 else 1}f}".rstrip("0").rstrip(".") + "x"


def _close(a: float, b: float) -> bool:
    """Equal, or within SAME_WITHIN of each other."""
    return a == b or (a > 0 and b > 0 and max(a, b) / min(a, b) < SAME_WITHIN)


def compare(metric: Metric, value: float, baseline: float) -> Change:
    """How `value` fares against `baseline` for this metric (a neutral metric is always "same")."""
    if not metric.better or value == baseline:
        return Change("same", 1.0)
    if value <= 0 or baseline <= 0:
        lower_wins = value < baseline
        return Change("better" if lower_wins == (metric.better == "lower") else "worse", None)
    factor = max(value, baseline) / min(value, baseline)
    if factor < SAME_WITHIN:
        return Change("same", factor)
    lower_wins = value < baseline
    return Change("better" if lower_wins == (metric.better == "lower") else "worse", factor)


@dataclass(frozen=True)
class Cell:
    text: str
    change: str  # "x.xx better|worse" / "same" / "" for the baseline's own column
    verdict: str  # "better", "worse", "same", or "" (baseline)
    best: bool  # the best value of its row (ties all marked)


@dataclass(frozen=True)
class Row:
    label: str
    better: str  # "lower is better" / "higher is better" / ""
    cells: list[Cell]


def _best(metric: Metric, values: Sequence[float]) -> list[bool]:
    """Which values are the best of the row: the best one and those within SAME_WITHIN of it; none
    when the whole row is within SAME_WITHIN (nothing to choose) or the metric is neutral."""
    if not metric.better or len(values) < 2 or _close(min(values), max(values)):
        return [False] * len(values)
    best = min(values) if metric.better == "lower" else max(values)
    return [_close(value, best) for value in values]


def comparison(summaries: Mapping[str, Mapping], baseline: str) -> list[Row]:
    """The comparison table: a row per metric, a cell per policy, each against the baseline."""
    rows = []
    for metric in METRICS:
        values = [float(summary[metric.key]) for summary in summaries.values()]
        base = float(summaries[baseline][metric.key])
        cells = []
        for name, value, best in zip(summaries, values, _best(metric, values)):
            change = compare(metric, value, base)
            text = metric.format(value)
            if metric.key == "worst_user_slowdown" and summaries[name]["worst_user"]:
                text += f" ({summaries[name]['worst_user']})"
            own = name == baseline
            cells.append(Cell(text, "" if own else change.text, "" if own else change.verdict, best))
        rows.append(Row(metric.label, f"{metric.better} is better" if metric.better else "", cells))
    return rows


def _join(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _tail_phrase(metric: Metric, value: float, base: float, change: Change) -> str:
    if metric.bounded or change.factor is None:
        verb = "falls" if value < base else "rises"
        return f"{metric.label.removesuffix(' (h)')} {verb} from {metric.format(base)} to {metric.format(value)}"
    return f"{metric.label.removesuffix(' (h)')} is {factor_text(change.factor)} worse"


def headline(name: str, summary: Mapping, base_summary: Mapping, baseline: str) -> tuple[str, bool]:
    """One sentence: what the policy does to average JCT against the baseline, then every tail or
    fairness figure it makes worse (by TAIL_WORSE_FROM or more). The flag: whether any tail is worse."""
    lead = compare(LEAD, float(summary[LEAD.key]), float(base_summary[LEAD.key]))
    if lead.verdict == "same":
        opening = f"{name} leaves average JCT as {baseline} has it ({_hours(float(summary[LEAD.key]))} h)"
    else:
        verb = "cuts" if lead.verdict == "better" else "raises"
        factor = f" {factor_text(lead.factor)}" if lead.factor is not None else ""
        opening = f"{name} {verb} average JCT{factor} against {baseline}"
    worse = []
    for metric in METRICS:
        if not metric.tail:
            continue
        value, base = float(summary[metric.key]), float(base_summary[metric.key])
        change = compare(metric, value, base)
        if change.verdict == "worse" and (change.factor is None or change.factor >= TAIL_WORSE_FROM):
            worse.append(_tail_phrase(metric, value, base, change))
    if not worse:
        checked = _join([m.label.removesuffix(" (h)") for m in METRICS if m.tail])
        return f"{opening}, and no tail is worse ({checked}).", False
    return f"{opening}, {'but' if lead.verdict == 'better' else 'and'} {_join(worse)}.", True
