"""Summaries and the end-of-run table for ``kvagent bench``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.bench.arms import ArmResult
from runtime.bench.fit import decode_fit
from runtime.bench.text_grid import grid
from scheduler.sizes import format_bytes

REFERENCE_ARM = "terminal-scratch"
#: the step (1-based) long-episode memory is compared against: the window is full by then
LEDGER_BASE_STEP = 5


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
        "ledger_peak_bytes_last": steps[-1]["ledger_peak_bytes"],
        "ledger_peak_bytes_step5": (steps[LEDGER_BASE_STEP - 1]["ledger_peak_bytes"]
                                    if len(steps) >= LEDGER_BASE_STEP else None),
        "checkpoint_bytes_peak": max(s["checkpoint_bytes"] for s in steps),
        "ledger_peak_bytes": arm.ledger_peak_bytes,
        "rss_bytes_peak": max(s["rss_bytes"] for s in steps),
        "wall_s": arm.wall_s,
        "identical_to_reference": (None if reference_sha is None
                                   else arm.output_sha256 == reference_sha),
        # tail replay: steps decoded from an approximate state, rows replayed
        "approximate_steps": sum(bool(s["approximate"]) for s in steps),
        "replay_tokens_total": sum(s["replay_tokens"] for s in steps),
    }
    full = steps[window:] or steps  # once the screenshot window is full
    ratios = [s["critical_path_prefill_tokens"] / s["new_content_tokens"] for s in full]
    summary["critical_over_new_content_max"] = max(ratios)
    summary["critical_over_new_content_mean"] = sum(ratios) / len(ratios)
    summary["critical_path_prefill_tokens_mean"] = (
        sum(s["critical_path_prefill_tokens"] for s in full) / len(full))
    base = summary["ledger_peak_bytes_step5"]
    summary["ledger_last_over_step5"] = summary["ledger_peak_bytes_last"] / base if base else None
    summary["decode_fit"] = decode_fit(steps)
    drifts = [s["drift_kl"] for s in steps if s["drift_kl"] is not None]
    if drifts:
        agree = [s["drift_top1_agree"] for s in steps if s["drift_top1_agree"] is not None]
        summary["drift_kl_mean"] = sum(drifts) / len(drifts)
        summary["drift_kl_max"] = max(drifts)
        summary["drift_top1_agreement"] = sum(agree) / len(agree)
    return summary


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "n/a" if x is None else format(x, fmt)


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
                     str(s["reused_tokens_total"]), format_bytes(s["ledger_peak_bytes"]),
                     format_bytes(s["kv_bytes_peak"]), f"{s['critical_path_s_mean']:.2f}",
                     f"{s['wall_s']:.2f}",
                     "n/a" if same is None else ("yes" if same else "no")))
    return grid(rows)


def _fit_text(fit: dict[str, Any] | None) -> tuple[str, str]:
    """("a ms + b s x ctx", "R²") of a decode fit."""
    if fit is None:
        return "n/a", "n/a"
    slope = fit["b_s_per_token"]
    b = "" if slope is None else f" {'-' if slope < 0 else '+'} {abs(slope):.2e} x ctx"
    return f"{fit['a_s'] * 1e3:.2f} ms{b}", _num(fit["r2"])


def time_table(arms: Sequence[dict[str, Any]]) -> str:
    """One line per arm that ran: wall against the bound and the optimum, the last step's
    latency against evict's, the decode fit, the ledger's growth after step 5."""
    head = ("arm", "wall s", "bound s", "wall/bound", "wall/optimum", "crit last s",
            "crit last/evict", "decode s/token", "R2", "ledger step 5", "ledger last",
            "last/step 5")
    rows = [head]
    for a in arms:
        s = a["summary"]
        if "refused" in s:
            continue
        fit, r2 = _fit_text(s["decode_fit"])
        base = s["ledger_peak_bytes_step5"]
        rows.append((a["arm"], f"{s['wall_s']:.2f}", _num(s["bound_s"]),
                     _num(s["wall_over_bound"]), _num(s["wall_over_optimum"]),
                     f"{s['critical_path_s_last']:.2f}",
                     _num(s["critical_path_s_over_evict_last"]), fit, r2,
                     "n/a" if base is None else format_bytes(base),
                     format_bytes(s["ledger_peak_bytes_last"]),
                     _num(s["ledger_last_over_step5"])))
    return grid(rows)


def latency_table(arms: Sequence[dict[str, Any]], bound: dict[str, Any] | None) -> str:
    """Critical-path seconds per step (rows) for every arm that ran (columns), and the
    bound's (the lowest critical-path bound of any arm at that step)."""
    ran = [a for a in arms if "refused" not in a["summary"]]
    line = bound["critical_path_steps_s"] if bound else []
    rows = [("step", *(a["arm"] for a in ran), "bound")]
    for i in range(max((len(a["steps"]) for a in ran), default=0)):
        rows.append((str(i + 1),
                     *(f"{a['steps'][i]['critical_path_s']:.2f}" if i < len(a["steps"])
                       else "" for a in ran),
                     f"{line[i]:.2f}" if i < len(line) else "n/a"))
    return "critical-path latency per step (s)\n" + grid(rows)


def bound_text(blocks: dict[str, Any]) -> str:
    """How the bound was measured, and the study's optimum with its arithmetic."""
    b, best, fit = blocks["bound"], blocks["optimum"], blocks["decode_fit_all_arms"]
    lines = []
    if b is not None:
        lines.append(f"bound per step = the arm's VM time + the step's fastest encode in any "
                     f"arm + new-content tokens x {b['prefill_s_per_token'] * 1e3:.3f} ms "
                     f"(the fastest prefill rate of any arm: {b['prefill_rate_arm']}) + the "
                     f"arm's decode")
    lines.append("optimum of the study (computed from evict and noevict, not run): "
                 + (best["text"] if best else "needs the evict and noevict arms"))
    if fit is not None:
        text, r2 = _fit_text(fit)
        lines.append(f"decode fit over all arms' steps: {text} per token, R2 {r2} "
                     f"(context {fit['context_min']}..{fit['context_max']})")
    return "\n".join(lines)
