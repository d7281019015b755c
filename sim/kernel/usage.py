"""Per-user GPU usage with exponential decay, kept exactly between events."""

from __future__ import annotations

import math


class DecayedUsage:
    """Each user's GPU-seconds, every past second weighted by 2^(-age / half-life).

    Between events a user's running GPUs are constant, so the integral has a closed form:
    U(t) = U(t0) e^(-k dt) + rate (1 - e^(-k dt)) / k with k = ln 2 / half-life.
    """

    def __init__(self, half_life_s: float) -> None:
        self.decay = math.log(2.0) / half_life_s
        self.value: dict[str, float] = {}
        self.rate: dict[str, float] = {}  # GPUs running now
        self.since: dict[str, float] = {}

    def _at(self, user: str, time: float) -> float:
        value = self.value.get(user, 0.0)
        elapsed = time - self.since.get(user, time)
        if elapsed <= 0:
            return value
        factor = math.exp(-self.decay * elapsed)
        return value * factor + self.rate.get(user, 0.0) * (1.0 - factor) / self.decay

    def change_rate(self, user: str, time: float, delta_gpus: int) -> None:
        """A run of `delta_gpus` GPUs starts (positive) or stops (negative) at `time`."""
        self.value[user] = self._at(user, time)
        self.since[user] = time
        self.rate[user] = self.rate.get(user, 0.0) + delta_gpus

    def snapshot(self, time: float) -> dict[str, float]:
        """Every user's decayed usage at `time` (users in first-seen order)."""
        return {user: self._at(user, time) for user in self.value}
