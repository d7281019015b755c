"""The report's comparison: every metric against a baseline policy (multifactor, else fifo, when
replayed), the best value per metric, and the verdict sentence that names every metric a policy
makes worse. The table's marks and the verdict read one list (`compared`), so they cannot disagree."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

SAME_WITHIN = 1.005  # factors closer to 1 than this read "same", in the table and in the verdict
SAME_WITHIN_TEXT = f"{SAME_WITHIN - 1:.1%}"  # "0.5%": the threshold as the verdict states it


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
    bounded: bool = False  # a share in [0, 1]: the verdict says "from a to b" rather than a factor

    @property
    def name(self) -> str:
        """The label in a sentence: "p95 JCT", not "p95 JCT (h)"."""
        return self.label.removesuffix(" (h)")

    def text(self, value: float) -> str:
        """A value in a sentence, with its unit: "76.05 h", "23.6%", "208.60"."""
        return self.format(value) + (" h" if self.label.endswith(" (h)") else "")


METRICS = (
    Metric("jobs", "jobs", "", _count),
    Metric("avg_jct_s", "average JCT (h)", "lower", _hours),
    Metric("p50_jct_s", "p50 JCT (h)", "lower", _hours),
    Metric("p95_jct_s", "p95 JCT (h)", "lower", _hours),
    Metric("p99_jct_s", "p99 JCT (h)", "lower", _hours),
    Metric("avg_wait_s", "average wait (h)", "lower", _hours),
    Metric("max_wait_s", "longest wait (h)", "lower", _hours),
    Metric("makespan_s", "makespan (h)", "lower", _hours),
    Metric("gpu_utilization", "useful GPU utilisation", "higher", _percent, bounded=True),
    Metric("avg_slowdown", "average slowdown", "lower", _fixed(2)),
    Metric("p95_slowdown", "p95 slowdown", "lower", _fixed(2)),
    Metric("user_jain_index", "user Jain index", "higher", _fixed(3), bounded=True),
    Metric("worst_user_slowdown", "worst user slowdown", "lower", _fixed(2)),
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
LEAD = METRICS[1]  # the verdict leads with average JCT


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
    """A factor for a sentence, without trailing zeros: "1.006x" (three decimals below 1.01, so that a
    change the verdict names never reads "1x"), "1.06x" (two below 2), "2.9x", "22.1x"."""
    digits = 3 if factor < 1.01 else 2 if factor < 2 else 1
    return f"{factor:.{digits}f}".rstrip("0").rstrip(".") + "x"


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


@dataclass(frozen=True)
class Compared:
    """One metric of one policy against the baseline's value."""

    metric: Metric
    value: float
    base: float
    change: Change


def compared(summary: Mapping, base_summary: Mapping) -> list[Compared]:
    """Every metric of METRICS, in order, against the baseline's: the one list the table's marks
    and the verdict both read."""
    out = []
    for metric in METRICS:
        value, base = float(summary[metric.key]), float(base_summary[metric.key])
        out.append(Compared(metric, value, base, compare(metric, value, base)))
    return out


def comparison(summaries: Mapping[str, Mapping], baseline: str) -> list[Row]:
    """The comparison table: a row per metric, a cell per policy, each against the baseline."""
    columns = {name: compared(summary, summaries[baseline]) for name, summary in summaries.items()}
    rows = []
    for index, metric in enumerate(METRICS):
        values = [column[index].value for column in columns.values()]
        cells = []
        for (name, column), best in zip(columns.items(), _best(metric, values)):
            item = column[index]
            text = metric.format(item.value)
            if metric.key == "worst_user_slowdown" and summaries[name]["worst_user"]:
                text += f" ({summaries[name]['worst_user']})"
            own = name == baseline
            cells.append(Cell(text, "" if own else item.change.text, "" if own else item.change.verdict, best))
        rows.append(Row(metric.label, f"{metric.better} is better" if metric.better else "", cells))
    return rows


def worse_phrase(item: Compared) -> str:
    """A worse metric in the verdict: its value against the baseline's, with the factor unless the
    metric is a share or either value is 0: "p95 JCT 76.05 h against 73.67 h (1.03x)"."""
    metric, factor = item.metric, item.change.factor
    shown = "" if metric.bounded or factor is None else f" ({factor_text(factor)})"
    return f"{metric.name} {metric.text(item.value)} against {metric.text(item.base)}{shown}"


def _listed(parts: Sequence[str]) -> str:
    """Phrases that may hold commas themselves: "a", "a and b", "a; b; and c"."""
    if len(parts) < 3:
        return " and ".join(parts)
    return "; ".join(parts[:-1]) + "; and " + parts[-1]


def headline(name: str, summary: Mapping, base_summary: Mapping, baseline: str) -> tuple[str, bool]:
    """The verdict, one sentence: what the policy does to average JCT against the baseline, then
    every other metric the comparison table marks worse (a change of SAME_WITHIN or more, which the
    sentence states). The flag: whether any metric is worse."""
    items = compared(summary, base_summary)
    lead = next(item for item in items if item.metric is LEAD)
    if lead.change.verdict == "same":
        opening = f"{name} leaves average JCT as {baseline} has it ({_hours(lead.value)} h)"
    else:
        verb = "cuts" if lead.change.verdict == "better" else "raises"
        factor = f" {factor_text(lead.change.factor)}" if lead.change.factor is not None else ""
        opening = f"{name} {verb} average JCT{factor} against {baseline}"
    worse = [worse_phrase(item) for item in items if item.change.verdict == "worse" and item.metric is not LEAD]
    lead_worse = lead.change.verdict == "worse"
    other = "other " if lead_worse else ""
    by = f"worse by {SAME_WITHIN_TEXT} or more"
    if not worse:
        return f"{opening}, and no {other}metric is {by}.", lead_worse
    counted = f"1 {other}metric is" if len(worse) == 1 else f"{len(worse)} {other}metrics are"
    return f"{opening}, {'but' if lead.change.verdict == 'better' else 'and'} {counted} {by}: {_listed(worse)}.", True
