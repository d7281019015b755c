"""`tune`: Dike's queue thresholds proposed from a dump's own GPU service, checked by replay."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dike_slurm.policies.common import quantile
from dike_slurm.sim.kernel.trace import TraceJob

# Candidate quantile sets: threshold i sits at quantile 1 - base^(i+1) of per-job GPU service,
# so base 0.5 gives the median and the 75th percentile for three levels.
CANDIDATE_BASES = (0.5, 0.35, 0.25, 0.1)


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
