"""Task success as a rate with its uncertainty: the Wilson score interval (and, for two arms on
the same instances, the paired difference), and the rule that says when an episode ends.

An episode succeeds when the env's checker passed at its end (simdesk's reward 1.0).  Where
that end is, is the *success rule*, named beside every success figure: ``osworld`` (the
default: the agent's done() / fail() or max_steps end it, as in OSWorld's own loop) or
``stop-on-success`` (simdesk also ends it the moment its checker passes: an oracle OSWorld
does not have, so an agent that never says done() and would undo its work still scores).  With a
few dozen episodes the normal approximation is useless near 0 % and 100 % (exactly where a
random model and a trained one sit); the Wilson interval stays inside [0, 1] and is not
degenerate there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from vmenv.actions import Done, format_action

#: done() in the action language, as a step's metrics record it
DONE_TEXT = format_action(Done())
#: the success rules (see the module docstring)
OSWORLD_RULE, STOP_ON_SUCCESS_RULE = "osworld", "stop-on-success"
SUCCESS_RULES = (OSWORLD_RULE, STOP_ON_SUCCESS_RULE)
_RULE_LABELS = {OSWORLD_RULE: "OSWorld's rule: ends on done()/fail() or max steps",
                STOP_ON_SUCCESS_RULE: "stop-on-success: also ends when the checker passes"}


def success_rule(stop_on_success: bool) -> str:
    """The rule's name: ``stop-on-success`` or ``osworld``."""
    return STOP_ON_SUCCESS_RULE if stop_on_success else OSWORLD_RULE


def rule_label(rule: str) -> str:
    """How a printed success figure names its rule, e.g. "OSWorld's rule: ends on ..."."""
    return _RULE_LABELS[rule]


def ended_by_done(actions: Sequence[str | None]) -> bool:
    """Whether an episode's last action (in the action language) was the agent's done()."""
    return bool(actions) and actions[-1] == DONE_TEXT


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


@attrs.frozen
class PairedDifference:
    """Success of an arm minus success of its reference on the SAME instances (paired
    outcomes), with the 95 % interval of Newcombe's method 10 (Wilson intervals of both
    rates, corrected for their correlation: Newcombe 1998, Stat. Med. 17:2635; Altman et al.,
    "Statistics with confidence", 2000) — it stays in [-1, 1] and is not degenerate when no
    pair differs, where the Wald interval collapses to a point."""

    both: int  # pairs where both succeeded
    arm_only: int  # the arm succeeded, the reference did not
    reference_only: int
    neither: int

    @classmethod
    def of(cls, pairs: Sequence[tuple[bool, bool]]) -> PairedDifference:
        """From (arm succeeded, reference succeeded) per instance."""
        return cls(sum(a and r for a, r in pairs), sum(a and not r for a, r in pairs),
                   sum(r and not a for a, r in pairs), sum(not (a or r) for a, r in pairs))

    @property
    def n(self) -> int:
        return self.both + self.arm_only + self.reference_only + self.neither

    @property
    def delta(self) -> float | None:
        return (self.arm_only - self.reference_only) / self.n if self.n else None

    @property
    def interval(self) -> tuple[float, float]:
        n = self.n
        if not n:
            return -1.0, 1.0
        a, b, c, d = self.both, self.arm_only, self.reference_only, self.neither
        p1, p2 = (a + b) / n, (a + c) / n
        l1, u1 = wilson_interval(a + b, n)
        l2, u2 = wilson_interval(a + c, n)
        # the correlation of the pair's outcomes, its numerator shrunk by n/2 when positive
        # (Newcombe's continuity adjustment of phi)
        denom = (a + b) * (c + d) * (a + c) * (b + d)
        cross = a * d - b * c
        cross = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
        phi = cross / math.sqrt(denom) if denom else 0.0
        delta = p1 - p2
        low = delta - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2)
                                    + (u2 - p2) ** 2))
        high = delta + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2)
                                     + (p2 - l2) ** 2))
        return max(-1.0, low), min(1.0, high)

    def as_dict(self) -> dict[str, float | int | None]:
        low, high = self.interval
        return {"delta": self.delta, "ci95_low": low, "ci95_high": high, "n": self.n,
                "both": self.both, "arm_only": self.arm_only,
                "reference_only": self.reference_only, "neither": self.neither}

    def __str__(self) -> str:
        if not self.n:
            return "n/a"
        low, high = self.interval
        assert self.delta is not None
        return (f"{100 * self.delta:+.0f} pts (95% CI {100 * low:+.0f} to {100 * high:+.0f}; "
                f"{self.arm_only} won / {self.reference_only} lost)")


def succeeded(reward: float, status: str) -> bool:
    """An episode's outcome as success: it ended without error and its checker passed."""
    return status != "error" and reward >= 1.0
