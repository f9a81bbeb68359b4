"""Decode cost against context: seconds per decoded token = a + b × context tokens.

The attention layers make a decoded token's cost grow with the context it attends to; the
study kvagent starts from fitted 31.3 ms + 4.6e-6 s × ctx on its 35B model.  ``fit_line`` is
ordinary least squares on (x, y) points; ``decode_fit`` fits it to a run's step records, one
point per step that decoded something.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs


@attrs.frozen
class LineFit:
    """``y ≈ a + b·x`` by least squares over ``points`` points with x in [x_min, x_max].

    ``b`` is None when every x is the same (the slope is not determined: ``a`` is then the
    mean y); ``r2`` (1 − residual / total sum of squares) is None when every y is the same."""

    a: float
    b: float | None
    r2: float | None
    points: int
    x_min: float
    x_max: float


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> LineFit | None:
    """Least-squares line through the points; None without any point."""
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"{n} x values but {len(ys)} y values")
    if n == 0:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0:  # one context length: no slope to fit
        return LineFit(my, None, None, n, min(xs), max(xs))
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    residual = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    return LineFit(a, b, None if syy == 0 else 1.0 - residual / syy, n, min(xs), max(xs))


def decode_points(steps: Iterable[Mapping[str, Any]]) -> tuple[list[float], list[float]]:
    """(context tokens, decode seconds per decoded token) of every step that decoded."""
    xs, ys = [], []
    for s in steps:
        if s.get("decode_tokens"):
            xs.append(float(s["context_tokens"]))
            ys.append(s["decode_s"] / s["decode_tokens"])
    return xs, ys


def decode_fit(steps: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The fit as JSON: ``a_s``, ``b_s_per_token``, ``r2``, ``points``, ``context_min`` /
    ``context_max`` (None when no step decoded)."""
    fit = fit_line(*decode_points(steps))
    if fit is None:
        return None
    return {"a_s": fit.a, "b_s_per_token": fit.b, "r2": fit.r2, "points": fit.points,
            "context_min": int(fit.x_min), "context_max": int(fit.x_max)}
