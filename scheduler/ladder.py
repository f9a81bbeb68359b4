"""Rung 3 of the fallback ladder: smaller plans for the same step, most faithful first.

terminal-slot → terminal-scratch with the same window → terminal-scratch with a smaller
window, down to one screenshot.  Every one of them is exact for what it shows; a smaller
window shows less, so a step that runs on one is recorded as degraded with the reason.
A policy whose prompt is not its own to change (``manifest.may_degrade`` False: faithful
serves the client's prompt as sent) has no smaller plans.
"""

from __future__ import annotations

from cachepolicy.base import CachePolicy
from cachepolicy.layouts import PromptKit
from cachepolicy.policies import make_policy

FALLBACK_POLICY = "terminal-scratch"


def downgrades(policy: CachePolicy, kit: PromptKit) -> list[tuple[CachePolicy, str]]:
    out: list[tuple[CachePolicy, str]] = []
    if not policy.manifest.may_degrade:
        return out
    k = policy.window
    if policy.name != FALLBACK_POLICY:
        out.append((make_policy(FALLBACK_POLICY, policy.model, kit, window=k,
                                decode_tokens=policy.decode_tokens),
                    f"downgraded {policy.name} to {FALLBACK_POLICY} (window {k})"))
    for smaller in range(k - 1, 0, -1):
        out.append((make_policy(FALLBACK_POLICY, policy.model, kit, window=smaller,
                                decode_tokens=policy.decode_tokens),
                    f"downgraded {policy.name} to {FALLBACK_POLICY} with window {smaller} "
                    f"(of {k})"))
    return out
