"""Task success as a rate with its uncertainty: the Wilson score interval.

An episode succeeds when the env's checker passed at its end (simdesk's reward 1.0).  With a
few dozen episodes the normal approximation is useless near 0 % and 100 % (exactly where a
random model and a trained one sit); the Wilson interval stays inside [0, 1] and is not
degenerate there.
"""

from __future__ import annotations

import math

import attrs

#: z for a two-sided 95 % interval
Z95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` out of ``n`` (``(0, 1)`` when n = 0)."""
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes out of {n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


@attrs.frozen
class SuccessRate:
    """``successes`` of ``n`` episodes, with the 95 % Wilson interval."""

    successes: int
    n: int

    @property
    def rate(self) -> float | None:
        return self.successes / self.n if self.n else None

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.successes, self.n)

    def as_dict(self) -> dict[str, float | int | None]:
        low, high = self.interval
        return {"successes": self.successes, "n": self.n, "rate": self.rate,
                "ci95_low": low, "ci95_high": high}

    def __str__(self) -> str:
        if not self.n:
            return "0/0"
        low, high = self.interval
        return (f"{self.successes}/{self.n} ({100 * self.successes / self.n:.0f}%, 95% CI "
                f"{100 * low:.0f}-{100 * high:.0f}%)")


def succeeded(reward: float, status: str) -> bool:
    """An episode's outcome as success: it ended without error and its checker passed."""
    return status != "error" and reward >= 1.0
