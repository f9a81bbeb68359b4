"""Issue 13's targets, each read off one bench run's report: measured, target, met or not.

The targets are stated for the default scenario (the forged qwen35 M with vision, 512-token
screenshots, window 3, 20 steps, 1.5 s of VM time); ``scenario_differences`` says where a
run differs from it, since a ratio measured elsewhere answers another question.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

OVERLAP_ARM, SLOT_ARM, NOEVICT_ARM = "terminal-slot+overlap", "terminal-slot", "noevict"

#: (name, what is measured, arm or None for the concurrency block, summary field, op, target)
TARGETS: tuple[tuple[str, str, str | None, str, str, float], ...] = (
    ("overlap_critical_over_new_content",
     "terminal-slot+overlap critical-path prefill / new content (max once the window is full)",
     OVERLAP_ARM, "critical_over_new_content_max", "<=", 1.15),
    ("overlap_latency_last_over_evict",
     "critical-path latency at the last step, terminal-slot+overlap / evict",
     OVERLAP_ARM, "critical_path_s_over_evict_last", "<=", 0.30),
    ("overlap_wall_over_bound", "episode wall, terminal-slot+overlap / the wall-time bound",
     OVERLAP_ARM, "wall_over_bound", "<=", 1.05),
    ("slot_ledger_last_over_step5", "terminal-slot ledger peak at the last step / at step 5",
     SLOT_ARM, "ledger_last_over_step5", "<=", 1.05),
    ("noevict_ledger_grows", "noevict ledger peak at the last step / at step 5 (grows)",
     NOEVICT_ARM, "ledger_last_over_step5", ">", 1.0),
    ("concurrent_over_sequential",
     "--episodes 4 concurrent / sequential throughput, overlap on",
     None, "ratio", ">=", 1.8),
)

SCENARIO = {"steps": 20, "window": 3, "image_tokens_target": 512, "vm_seconds": 1.5}

_OPS = {"<=": operator.le, ">=": operator.ge, ">": operator.gt}


def scenario_differences(config: Mapping[str, Any], default_model: bool) -> list[str]:
    """Where this run's configuration is not the targets' scenario."""
    out = [f"{k} {config.get(k)} (target scenario: {v})" for k, v in SCENARIO.items()
           if config.get(k) != v]
    if not default_model:
        out.append("not the forged qwen35 M model")
    return out


def _measured(report: Mapping[str, Any], arm: str | None, field: str) -> tuple[Any, str]:
    """(value or None, why it is missing)."""
    if arm is None:
        if "throughput" not in report:
            return None, "needs --episodes 4 --overlap"
        config = report["config"]
        if not config.get("overlap"):
            return None, "the concurrent run had overlap off (needs --overlap)"
        note = "" if config.get("episodes") == 4 else f"{config.get('episodes')} episodes"
        return report["throughput"][field], note
    arms = {a["arm"]: a for a in report["arms"]}
    if arm not in arms:
        return None, f"needs the {arm} arm"
    if arms[arm]["refused"]:
        return None, f"{arm} refused"
    value = arms[arm]["summary"].get(field)
    return value, "" if value is not None else "not measurable in this run"


def targets(report: Mapping[str, Any], *, default_model: bool) -> dict[str, Any]:
    """``{"scenario_differences": [...], "items": [{name, description, measured, op,
    target, met, note}]}``; ``met`` is None where the run did not measure it."""
    items = []
    for name, description, arm, field, op, target in TARGETS:
        value, note = _measured(report, arm, field)
        items.append({"name": name, "description": description, "measured": value, "op": op,
                      "target": target,
                      "met": None if value is None else bool(_OPS[op](value, target)),
                      "note": note})
    return {"scenario_differences": scenario_differences(report["config"], default_model),
            "items": items}


def targets_text(block: Mapping[str, Any]) -> str:
    """The printed section: one line per target."""
    lines = ["targets (issue 13):"]
    for t in block["items"]:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[t["met"]]
        value = "n/a" if t["measured"] is None else f"{t['measured']:.2f}"
        note = f" ({t['note']})" if t["note"] else ""
        if t["met"] is False:
            verdict += f" by {abs(t['measured'] - t['target']):.2f}"
        lines.append(f"  {t['description']}: {value} {t['op']} {t['target']:g}: "
                     f"{verdict}{note}")
    if block["scenario_differences"]:
        lines.append("  this run is not the targets' scenario: "
                     + "; ".join(block["scenario_differences"]))
    return "\n".join(lines)
