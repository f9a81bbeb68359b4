"""The bench's PNG: per step and per arm, the critical path's prefill tokens, its latency
and the ledger's peak bytes, with the bound drawn as a black dashed line (new-content tokens
in the first panel, the critical-path bound in the second; ``runtime.bench.bound``).

Drawn in the house style of ``runtime.run.plot`` (its helpers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from runtime.bench.bound import lowest
from runtime.run.plot import figure, finish_axis, save_png, series

MIB = 1 / (1 << 20)
BOUND_STYLE = {"color": "black", "linestyle": "--", "linewidth": 1.6}


def plot_bench(arms: Sequence[Mapping[str, Any]], bound: Mapping[str, Any] | None,
               out: str | Path, *, title: str = "") -> Path:
    """Draw the arms that ran (the report's arm objects) into ``out`` (a PNG); returns the
    path.  Blocking: rendering and file I/O."""
    ran = [a for a in arms if not a["refused"] and a["steps"]]
    fig, (tokens, latency, ledger) = figure(3, width=10.0, panel_height=3.4)
    for i, arm in enumerate(ran):
        style = {"color": f"C{i % 10}", "marker": "o", "markersize": 3.5, "label": arm["arm"]}
        tokens.plot(*series(arm["steps"], "critical_path_prefill_tokens"), **style)
        latency.plot(*series(arm["steps"], "critical_path_s"), **style)
        ledger.plot(*series(arm["steps"], "ledger_peak_bytes", scale=MIB), **style)
    new = lowest([[s["new_content_tokens"] for s in a["steps"]] for a in ran])
    tokens.plot(range(1, len(new) + 1), new, **BOUND_STYLE, label="new content (bound)")
    if bound is not None:
        line = bound["critical_path_steps_s"]
        latency.plot(range(1, len(line) + 1), line, **BOUND_STYLE, label="bound")
    tokens.set_title(title or "kvagent bench")
    finish_axis(tokens, "critical-path prefill tokens", ncols=3)
    finish_axis(latency, "critical-path latency (s)", ncols=3)
    finish_axis(ledger, "ledger peak (MiB)", xlabel="step", ncols=3)
    return save_png(fig, out)
