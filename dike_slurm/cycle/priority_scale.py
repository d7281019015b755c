"""A policy's scores as the integer values the engine writes to Slurm (SiteFactor, Priority or Nice):
the ceiling scores are mapped against, the mapping, and the top values kept for protected jobs."""

from __future__ import annotations

import math
from collections.abc import Collection

from dike_slurm.domain.decisions import Decisions, SetPriority


def score_ceiling(decisions: Decisions, declared: float | None) -> float:
    """What scores are mapped against: the policy's own bound, else a power of two above them all.

    Scores are mapped onto [1, span] against this ceiling. A fixed bound (Dike: the number of
    levels) keeps every job's value still while other jobs come and go; for unbounded scores a
    power of two changes only when the largest score crosses one.
    """
    if declared is not None and declared > 0:
        return float(declared)
    top = max((p.score for p in decisions.priorities), default=1.0)
    return float(2 ** max(0, math.ceil(math.log2(max(top, 1.0)))))


def priority_value(score: float, ceiling: float, span: int, reserve: int = 0) -> int:
    """A policy score as an integer in [1, span - reserve]; higher runs first. The top `reserve`
    values are kept for protected jobs (`wanted_value`)."""
    clamped = min(max(score, 0.0), ceiling)
    top = span - reserve if span - reserve > 1 else 1
    return 1 + round((top - 1) * clamped / ceiling)


def wanted_value(decision: SetPriority, protected: Collection[int], ceiling: float, span: int, reserve: int) -> int:
    """The value the engine writes for a decision: `span` for a job a preemption freed nodes for
    (Decisions.protected: above every other job of its tier, slurm_priority.protection_reserve),
    else its score mapped onto [1, span - reserve]."""
    if decision.job_id in protected:
        return span
    return priority_value(decision.score, ceiling, span, reserve)
