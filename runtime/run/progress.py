"""Live progress of ``kvagent run`` on stderr, and the end-of-run summary table.

``ProgressDisplay`` is an ``on_event`` callback for ``runtime.run.agents``: one line per
episode (id, task, step k/max, last action, cache hit of the last step, last critical-path
seconds) plus the scheduler's summary line.  On a terminal the block is redrawn in place
with ANSI cursor movement; otherwise (CI, pipes, files) each event prints one plain line.
These renderers are the CLI's output, so they write to their stream directly.
"""

from __future__ import annotations

import shutil
import sys
from typing import TextIO

from runtime.run.agents import EpisodeEvent, RunResult
from runtime.run.success import SuccessRate, ended_by_done, rule_label, succeeded


_UP = "\x1b[{n}A"  # cursor up n lines
_CLEAR = "\r\x1b[2K"  # to column 0, clear the line


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _secs(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def episode_line(e: EpisodeEvent, action: str = "") -> str:
    """``ep0 open-terminal  step 3/8  click(12, 40)  hit 91%  crit 0.41 s``"""
    head = f"{e.spec.episode_id} {e.spec.task}"
    if e.kind == "start":
        return f"{head}  starting"
    tail = (f"  hit {_pct(e.cache_hit)}  crit {_secs(e.critical_path_s)}"
            if e.kind == "step" else f"  {e.status} reward {e.reward:g}"
            + (f" ({e.error})" if e.error else ""))
    return f"{head}  step {e.step}/{e.max_steps}  {e.action or action or '-'}{tail}"


class ProgressDisplay:
    """Render ``EpisodeEvent``s; call ``close()`` when the run ends."""

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._lines: dict[str, str] = {}  # episode id → its line, in start order
        self._actions: dict[str, str] = {}
        self._summary = ""
        self._drawn = 0  # lines of the block currently on screen (TTY mode)

    def __call__(self, event: EpisodeEvent) -> None:
        ep = event.spec.episode_id
        if event.kind == "step":
            self._actions[ep] = event.action
        # the end event carries no action: keep showing the last one
        self._lines[ep] = episode_line(event, self._actions.get(ep, ""))
        self._summary = event.summary
        if self.tty:
            self._redraw()
        else:
            self.stream.write(f"{self._lines[ep]} | {self._summary}\n")
            self.stream.flush()

    def _redraw(self) -> None:
        width = max(20, shutil.get_terminal_size((120, 24)).columns - 1)
        # truncate so no line wraps: the cursor arithmetic counts one row per line
        rows = [line[:width] for line in (*self._lines.values(), self._summary)]
        out = [_UP.format(n=self._drawn)] if self._drawn else []
        out += [f"{_CLEAR}{row}\n" for row in rows]
        self.stream.write("".join(out))
        self.stream.flush()
        self._drawn = len(rows)

    def close(self) -> None:
        """Leave the last state on screen (nothing to undo in plain mode)."""
        self._drawn = 0


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


SUMMARY_COLUMNS = ("episode", "task", "steps", "status", "reward", "unparsable",
                   "crit prefill", "crit s", "prefill")


def summary_table(result: RunResult) -> str:
    """One row per episode: steps, status, reward, unparsable outputs, and the means of
    critical-path prefill tokens, critical-path seconds and prefill tokens (critical path +
    prefetch) per step; then the run's task success with its 95 % interval."""
    rows = [SUMMARY_COLUMNS]
    for e in result.episodes:
        rows.append((e.episode_id, e.task or "-", str(e.n_steps), e.status,
                     f"{e.reward:g}", str(e.unparsable),
                     _num(e.mean("critical_path_prefill_tokens"), ".0f"),
                     _num(e.mean("critical_path_s"), ".2f"),
                     _num(e.mean("prefill_tokens"), ".0f")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(SUMMARY_COLUMNS))]
    lines = ["  ".join(c.rjust(w) if i >= 2 else c.ljust(w)
                       for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for e in result.errors:
        lines.append(f"{e.episode_id}: {e.error}")
    wins = sum(succeeded(e.reward, e.status) for e in result.episodes)
    said = sum(ended_by_done([s.action for s in e.steps]) for e in result.episodes)
    lines.append(f"task success ({rule_label(result.success_rule)}): "
                 f"{SuccessRate(wins, len(result.episodes))}; ended by the agent's done(): "
                 f"{said}/{len(result.episodes)}")
    return "\n".join(lines)
