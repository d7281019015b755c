"""Log-log plots of cost against size, with the fitted exponent of each line."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def fitted_exponent(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of log(y) against log(x); None with fewer than two usable points."""
    points = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y is not None and y > 0]
    if len(points) < 2:
        return None
    mx = sum(p[0] for p in points) / len(points)
    my = sum(p[1] for p in points) / len(points)
    spread = sum((p[0] - mx) ** 2 for p in points)
    if spread == 0:
        return None
    return sum((p[0] - mx) * (p[1] - my) for p in points) / spread


def loglog(
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    reference: tuple[Sequence[float], Sequence[float]] | None = None,
    reference_label: str = "floor",
) -> dict[str, float | None]:
    """One PNG with a line per series (label gets the fitted exponent); returns the exponents."""
    exponents: dict[str, float | None] = {}
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    for label, (xs, ys) in series.items():
        pairs = [(x, y) for x, y in zip(xs, ys) if y is not None and y > 0]
        if not pairs:
            continue
        exponent = fitted_exponent([p[0] for p in pairs], [p[1] for p in pairs])
        exponents[label] = exponent
        suffix = f" (n^{exponent:.2f})" if exponent is not None else ""
        axes.plot([p[0] for p in pairs], [p[1] for p in pairs], marker="o", label=f"{label}{suffix}")
    if reference is not None:
        xs, ys = reference
        pairs = [(x, y) for x, y in zip(xs, ys) if y is not None and y > 0]
        if pairs:
            exponent = fitted_exponent([p[0] for p in pairs], [p[1] for p in pairs])
            exponents[reference_label] = exponent
            suffix = f" (n^{exponent:.2f})" if exponent is not None else ""
            axes.plot([p[0] for p in pairs], [p[1] for p in pairs], linestyle="--", color="grey", marker="x",
                      label=f"{reference_label}{suffix}")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return exponents
