"""`tune`: Dike's queue thresholds proposed from a dump's own GPU service, checked by replay."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dike_slurm.policies.common import quantile
from dike_slurm.sim.eval.report_compare import SAME_WITHIN, SAME_WITHIN_TEXT
from dike_slurm.sim.kernel.trace import TraceJob

# Candidate quantile sets: threshold i sits at quantile 1 - base^(i+1) of per-job GPU service,
# so base 0.5 gives the median and the 75th percentile for three levels.
CANDIDATE_BASES = (0.5, 0.35, 0.25, 0.1)
CONFIGURED = "dike (configured)"  # the label of the configured Dike's replay, beside the candidates


@dataclass(frozen=True)
class Proposal:
    """One candidate: the quantiles it uses and the thresholds they give, in GPU-hours."""

    quantiles: tuple[float, ...]
    thresholds_gpuh: tuple[float, ...]

    @property
    def label(self) -> str:
        return "dike q=" + ",".join(f"{q:g}" for q in self.quantiles)


def candidate_quantiles(levels: int) -> list[tuple[float, ...]]:
    """The default quantile sets tried for K levels (K-1 thresholds each)."""
    return [tuple(round(1 - base ** (i + 1), 4) for i in range(levels - 1)) for base in CANDIDATE_BASES]


def propose(trace: Sequence[TraceJob], quantiles: Sequence[float]) -> Proposal:
    """Thresholds at these quantiles of per-job GPU service (GPUs x run time), kept ascending."""
    service = sorted(job.gpus * job.duration_s for job in trace)
    thresholds: list[float] = []
    for q in quantiles:
        value = quantile(service, q) / 3600.0
        floor = thresholds[-1] * 1.01 if thresholds else 1.0 / 60.0  # at least a GPU-minute, strictly rising
        rounded = round(max(value, floor), 4)
        if thresholds and rounded <= thresholds[-1]:
            rounded = thresholds[-1] + 0.0001
        thresholds.append(rounded)
    return Proposal(tuple(quantiles), tuple(thresholds))


@dataclass(frozen=True)
class Candidate:
    """A candidate as replayed: its label, thresholds and summary (summary.json's metrics)."""

    label: str
    thresholds_gpuh: tuple[float, ...]
    summary: Mapping


@dataclass(frozen=True)
class TuneAnswer:
    """tune's conclusion: the candidate to use, or None when none is worth a change, and the lines
    that say which and why."""

    best: Candidate | None
    lines: tuple[str, ...]

    def as_dict(self) -> dict:
        """summary.json's and merged.json's `tune`."""
        return {"best": self.best.label if self.best else None,
                "thresholds_gpuh": list(self.best.thresholds_gpuh) if self.best else None,
                "answer": "\n".join(self.lines)}


def _figures(summary: Mapping) -> dict:
    return {key: value for key, value in summary.items() if isinstance(value, (int, float))}


def answer(configured: Mapping, candidates: Sequence[Candidate], *, preemptible_jobs: int | None = None,
           jobs: int | None = None, preemption_on: bool | None = None) -> TuneAnswer:
    """Which candidate to use against the configured Dike's figures, by average JCT; none when every
    Dike run gives the same figures (said, with why) or when none cuts average JCT by SAME_WITHIN
    (the report's "same") or more.

    `preemptible_jobs` of `jobs` and `preemption_on` ([policies.dike] preemption), when known, name
    the cause of identical figures."""
    if all(_figures(c.summary) == _figures(configured) for c in candidates):
        each = ("the candidate and the configured Dike give" if len(candidates) == 1
                else f"the {len(candidates)} candidates and the configured Dike all give")
        why = _why_identical(configured, preemptible_jobs, jobs, preemption_on)
        return TuneAnswer(None, (f"no candidate changes anything: {each} identical figures. {why}",))
    best = min(candidates, key=lambda c: float(c.summary["avg_jct_s"]))  # the first of equals
    best_jct, configured_jct = float(best.summary["avg_jct_s"]), float(configured["avg_jct_s"])
    if best_jct * SAME_WITHIN > configured_jct:
        same = " (the same figures)" if _figures(best.summary) == _figures(configured) else ""
        measured = f"the best, {best.label}, gives {best_jct / 3600:.3f} h against {configured_jct / 3600:.3f} h{same}"
        no_gain = (f"no candidate cuts average JCT by {SAME_WITHIN_TEXT} or more against the configured Dike "
                   f"({measured}): keep the configured thresholds.")
        return TuneAnswer(None, (no_gain,))
    gain = configured_jct / best_jct if best_jct else 1.0
    return TuneAnswer(best, (f"best average JCT: {best.label} ({gain:.2f}x the configured Dike); to use it:",
                             "[policies.dike]", f"thresholds_gpuh = [{', '.join(f'{t:g}' for t in best.thresholds_gpuh)}]"))


def _why_identical(configured: Mapping, preemptible_jobs: int | None, jobs: int | None, preemption_on: bool | None) -> str:
    """Why thresholds changed nothing: without a preemption a waiting job has attained no service."""
    if float(configured.get("preemptions", 0)) > 0:
        return "The thresholds changed no decision on this trace. Nothing to recommend."
    if preemptible_jobs == 0:
        cause = f"No job was preemptible (0 of {jobs:,} jobs)" if jobs is not None else "No job was preemptible"
        advice = ("replay with --preemptible all, or the share of jobs that would opt in, to see what the thresholds "
                  "do once jobs may be preempted")
    elif preemption_on is False:
        cause, advice = "[policies.dike] preemption is off", "compare them with [policies.dike] preemption = true"
    else:
        cause, advice = "No Dike run preempted a job", "a trace where Dike preempts would tell them apart"
    return (f"{cause}, so no job is requeued and every waiting job has attained no service: all wait at level 0 "
            "whatever the thresholds, which then only order running jobs that nothing preempts. Nothing to recommend: "
            f"{advice}.")
