"""What the arms of one bench run say together: each arm against the bound, against the
study's optimum and against evict's latency (``runtime.bench.bound`` has the definitions).

``analyze`` adds to every run arm's ``summary`` (``bound_s``, ``wall_over_bound``,
``wall_over_optimum``, ``critical_path_s_over_evict_last`` / ``_mean``) and its ``bound``
(per-step bounds), and returns the run-level blocks ``bound``, ``optimum`` and
``decode_fit_all_arms`` for the report (the run's ``bound.critical_path_steps_s`` is, per
step, the lowest critical-path bound of any arm: the line the plot and the latency table
draw).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.bench.bound import encode_floor, lowest, optimum, prefill_rate, step_bounds
from runtime.bench.fit import decode_fit

EVICT, NOEVICT = "evict", "noevict"


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def analyze(arms: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Fill in the cross-arm fields of ``arms`` (the report's arm objects, in place) and
    return ``{"bound", "optimum", "decode_fit_all_arms"}``."""
    ran = {a["arm"]: a for a in arms if not a["refused"] and a["steps"]}
    steps = {name: a["steps"] for name, a in ran.items()}
    rate = prefill_rate(steps)
    encode = encode_floor(steps)
    best = None
    if EVICT in ran and NOEVICT in ran:
        best = optimum(steps[EVICT], ran[EVICT]["summary"]["wall_s"], steps[NOEVICT])
    evict = steps.get(EVICT)
    evict_last = evict[-1]["critical_path_s"] if evict else None
    evict_mean = sum(s["critical_path_s"] for s in evict) / len(evict) if evict else None
    for name, arm in ran.items():
        s = arm["summary"]
        arm["bound"] = step_bounds(steps[name], rate[0], encode) if rate else None
        s["bound_s"] = arm["bound"]["episode_s"] if arm["bound"] else None
        s["wall_over_bound"] = _ratio(s["wall_s"], s["bound_s"])
        s["wall_over_optimum"] = _ratio(s["wall_s"], best["optimum_s"] if best else None)
        s["critical_path_s_over_evict_last"] = _ratio(s["critical_path_s_last"], evict_last)
        s["critical_path_s_over_evict_mean"] = _ratio(s["critical_path_s_mean"], evict_mean)
    return {
        "bound": None if rate is None else {
            "prefill_s_per_token": rate[0], "prefill_rate_arm": rate[1],
            "encode_s_steps": encode,
            "critical_path_steps_s": lowest([a["bound"]["critical_path_steps_s"]
                                              for a in ran.values()]),
            "how": "per step: the arm's vm_s + the fastest encode_s of that step in any arm + "
                   "new_content_tokens x prefill_s_per_token (the fastest whole-episode "
                   "prefill_s / prefill_tokens of any arm) + the arm's decode_s"},
        "optimum": best,
        "decode_fit_all_arms": decode_fit([x for arm in steps.values() for x in arm]),
    }
