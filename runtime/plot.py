"""A PNG of a run's per-step measurements (matplotlib, Agg; no pyplot global state).

Top panel: prefill tokens per step for each episode — on the critical path (solid) and in
total, critical plus prefetch (dashed).  Bottom panel: critical-path seconds per step.  The
rows are ``metrics.jsonl`` lines (``runtime.metrics.StepMetrics.as_dict``).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vmenv.trajectory_writer import write_durably

PLOT_FILE = "kvagent_steps.png"


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            xs.append(int(row.get("step", len(xs))) + 1)
            ys.append(float(value))
    return xs, ys


def plot_steps(episodes: Mapping[str, Sequence[Mapping[str, Any]]], out: str | Path, *,
               title: str = "") -> Path:
    """Draw ``{episode label: metrics rows}`` into ``out`` (a PNG); returns the path.

    Blocking (rendering and file I/O): call it off the event loop."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 6.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    tokens, latency = fig.subplots(2, 1, sharex=True)
    for i, (label, rows) in enumerate(episodes.items()):
        color = f"C{i % 10}"
        xs, ys = _series(rows, "critical_path_prefill_tokens")
        tokens.plot(xs, ys, "o-", color=color, label=f"{label} critical path")
        xs, ys = _series(rows, "prefill_tokens")
        tokens.plot(xs, ys, "s--", color=color, alpha=0.6, label=f"{label} total")
        xs, ys = _series(rows, "critical_path_s")
        latency.plot(xs, ys, "o-", color=color, label=label)
    tokens.set_ylabel("prefill tokens per step")
    tokens.set_title(title or "prefill per step: critical path (solid) vs total (dashed)")
    tokens.set_ylim(bottom=0)
    tokens.grid(alpha=0.3)
    tokens.legend(fontsize="small", ncols=2)
    latency.set_ylabel("critical-path latency (s)")
    latency.set_xlabel("step")
    latency.set_ylim(bottom=0)
    latency.grid(alpha=0.3)
    latency.legend(fontsize="small", ncols=2)
    latency.xaxis.get_major_locator().set_params(integer=True)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    write_durably(path, buf.getvalue())  # a reader never sees half a PNG
    return path
