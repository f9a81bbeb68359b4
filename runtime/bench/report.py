"""Summaries and the end-of-run table for ``kvagent bench``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.bench.arms import ArmResult
from scheduler.sizes import format_bytes

REFERENCE_ARM = "terminal-scratch"


def summarize(arm: ArmResult, reference_sha: str | None, window: int = 3) -> dict[str, Any]:
    if arm.refused:
        return {"refused": arm.refused}
    steps = arm.steps
    prefill = [s["prefill_tokens"] for s in steps]
    summary: dict[str, Any] = {
        "steps": len(steps),
        "prefill_tokens_first": prefill[0],
        "prefill_tokens_last": prefill[-1],
        "prefill_tokens_total": sum(prefill),
        "reused_tokens_total": sum(s["reused_tokens"] for s in steps),
        "new_content_tokens_total": sum(s["new_content_tokens"] for s in steps),
        "context_tokens_last": steps[-1]["context_tokens"],
        "prefill_s_total": sum(s["prefill_s"] for s in steps),
        "encode_s_total": sum(s["encode_s"] for s in steps),
        "decode_s_total": sum(s["decode_s"] for s in steps),
        "critical_path_s_mean": sum(s["critical_path_s"] for s in steps) / len(steps),
        "critical_path_s_last": steps[-1]["critical_path_s"],
        "kv_bytes_peak": max(s["kv_bytes"] for s in steps),
        "checkpoint_bytes_peak": max(s["checkpoint_bytes"] for s in steps),
        "ledger_peak_bytes": arm.ledger_peak_bytes,
        "rss_bytes_peak": max(s["rss_bytes"] for s in steps),
        "wall_s": arm.wall_s,
        "identical_to_reference": (None if reference_sha is None
                                   else arm.output_sha256 == reference_sha),
    }
    full = steps[window:] or steps  # once the screenshot window is full
    ratios = [s["critical_path_prefill_tokens"] / s["new_content_tokens"] for s in full]
    summary["critical_over_new_content_max"] = max(ratios)
    summary["critical_over_new_content_mean"] = sum(ratios) / len(ratios)
    summary["critical_path_prefill_tokens_mean"] = (
        sum(s["critical_path_prefill_tokens"] for s in full) / len(full))
    drifts = [s["drift_kl"] for s in steps if s["drift_kl"] is not None]
    if drifts:
        agree = [s["drift_top1_agree"] for s in steps if s["drift_top1_agree"] is not None]
        summary["drift_kl_mean"] = sum(drifts) / len(drifts)
        summary["drift_kl_max"] = max(drifts)
        summary["drift_top1_agreement"] = sum(agree) / len(agree)
    return summary


def _mib(n: int) -> str:
    return format_bytes(n)


def table(arms: Sequence[dict[str, Any]]) -> str:
    """One line per arm: prefill first/last step, reused, peak bytes, wall, exactness."""
    head = ("arm", "prefill first", "prefill last", "critical/new", "reused", "ledger peak",
            "kv peak", "crit s mean", "wall s", "identical")
    rows = [head]
    for a in arms:
        s = a["summary"]
        if "refused" in s:
            rows.append((a["arm"], "refused", "", "", "", "", "", "", "", s["refused"][:60]))
            continue
        same = s["identical_to_reference"]
        rows.append((a["arm"], str(s["prefill_tokens_first"]), str(s["prefill_tokens_last"]),
                     f"{s['critical_over_new_content_max']:.2f}",
                     str(s["reused_tokens_total"]), _mib(s["ledger_peak_bytes"]),
                     _mib(s["kv_bytes_peak"]), f"{s['critical_path_s_mean']:.2f}",
                     f"{s['wall_s']:.2f}",
                     "n/a" if same is None else ("yes" if same else "no")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
