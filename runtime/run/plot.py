"""PNGs of per-step measurements (matplotlib, Agg; no pyplot global state).

``plot_steps`` draws a ``kvagent run``: top panel, prefill tokens per step for each episode —
on the critical path (solid) and in total, critical plus prefetch (dashed); bottom panel,
critical-path seconds per step.  The rows are ``metrics.jsonl`` lines
(``runtime.metrics.StepMetrics.as_dict``).  The helpers below (``series``, ``figure``,
``finish_axis``, ``save_png``) are the one house style, shared with the bench's plot
(``runtime.bench.plot``).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vmenv.trajectory_writer import write_durably

PLOT_FILE = "kvagent_steps.png"


def series(rows: Sequence[Mapping[str, Any]], key: str, *,
           scale: float = 1.0) -> tuple[list[int], list[float]]:
    """(1-based step numbers, ``row[key] * scale``) of the rows where the value is a number."""
    xs, ys = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            xs.append(int(row.get("step", len(xs))) + 1)
            ys.append(float(value) * scale)
    return xs, ys


def figure(panels: int, *, width: float = 9.0, panel_height: float = 3.25) -> tuple[Any, list[Any]]:
    """A figure of ``panels`` stacked axes sharing the step axis (no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, panel_height * panels), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(panels, 1, sharex=True, squeeze=False)[:, 0]
    return fig, list(axes)


def finish_axis(ax: Any, ylabel: str, *, xlabel: str | None = None, ncols: int = 2) -> None:
    """The house style: zero-based y, light grid, small legend, integer steps."""
    ax.set_ylabel(ylabel)
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", ncols=ncols)
    ax.xaxis.get_major_locator().set_params(integer=True)


def save_png(fig: Any, out: str | Path) -> Path:
    """Write ``fig`` to ``out`` atomically (a reader never sees half a PNG)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    write_durably(path, buf.getvalue())
    return path


def plot_steps(episodes: Mapping[str, Sequence[Mapping[str, Any]]], out: str | Path, *,
               title: str = "") -> Path:
    """Draw ``{episode label: metrics rows}`` into ``out`` (a PNG); returns the path.

    Blocking (rendering and file I/O): call it off the event loop."""
    fig, (tokens, latency) = figure(2)
    for i, (label, rows) in enumerate(episodes.items()):
        color = f"C{i % 10}"
        xs, ys = series(rows, "critical_path_prefill_tokens")
        tokens.plot(xs, ys, "o-", color=color, label=f"{label} critical path")
        xs, ys = series(rows, "prefill_tokens")
        tokens.plot(xs, ys, "s--", color=color, alpha=0.6, label=f"{label} total")
        xs, ys = series(rows, "critical_path_s")
        latency.plot(xs, ys, "o-", color=color, label=label)
    tokens.set_title(title or "prefill per step: critical path (solid) vs total (dashed)")
    finish_axis(tokens, "prefill tokens per step")
    finish_axis(latency, "critical-path latency (s)", xlabel="step")
    return save_png(fig, out)
