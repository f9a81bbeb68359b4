"""Clicks moved onto a grid's points, for an agent that answers in cells.

An agent whose vision encoder sees the screen in ``cell``-pixel cells (the shipped agents:
32 px) clicks best where a cell's point is, so its demonstrations should too.  A cell's
*point* (``cell_points``) is its centre, unless the grid has off-centre ``offsets`` (per axis,
from the centre: the sub-cell grid, ``(0, -8, 8)`` at 32 px) and the centre reaches no widget
that ``counts`` (the background, a dialog's body): then it is the off-centre point that
reaches a counted widget with the fewest offsets (then nearest that widget's centre, then
top-most, left-most), so a target too small or too far off the grid to hold a cell centre
(the classic OK button, 16 px tall) is still some cell's point.

``on_grid`` moves a click to the point, among the cells whose point reaches the clicked
widget (the same top-most widget: the click does exactly what the expert's did), nearest
that widget's centre; a click no cell's point reaches, and every other action, is left as
it is.  With the centre alone (``offsets=(0,)``) a cell's point is its centre whatever it
reaches, and ``on_grid`` the nearest reaching centre.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from vmenv.actions import Action, Click
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.widgets import Widget, hit_in, widgets

__all__ = ["ClickGrid", "cell_points", "on_grid"]

Counts = Callable[[DeskState, Widget], bool]


def _centre_first(offsets: tuple[int, ...]) -> tuple[int, ...]:
    if not offsets or offsets[0] != 0 or len(set(offsets)) != len(offsets):
        raise ValueError(f"grid offsets must start at 0 and not repeat, got {offsets}")
    return offsets


@attrs.frozen
class ClickGrid:
    """Where a ``cell``-pixel grid lets an agent click (see the module docstring)."""

    cell: int
    offsets: tuple[int, ...] = attrs.field(default=(0,), converter=_centre_first)
    #: which widgets an off-centre point may be for (None: every widget)
    counts: Counts | None = attrs.field(default=None, eq=False)

    def names_target(self, state: DeskState, w: Widget | None) -> bool:
        """Whether an off-centre point may be for ``w`` (never the bare desktop)."""
        return w is not None and (self.counts is None or self.counts(state, w))


def cell_points(state: DeskState, grid: ClickGrid,
                ) -> list[list[tuple[int, int, Widget | None]]]:
    """[rows][cols] of each cell's point ``(x, y)`` and the widget it reaches (None: the bare
    desktop); see the module docstring for which point."""
    lay, n = state.layout, grid.cell
    ws = widgets(state)
    off = [(dx, dy) for dy in grid.offsets for dx in grid.offsets][1:]
    out: list[list[tuple[int, int, Widget | None]]] = []
    for r in range(lay.height // n):
        row: list[tuple[int, int, Widget | None]] = []
        for c in range(lay.width // n):
            cx, cy = c * n + n // 2, r * n + n // 2
            w0 = hit_in(ws, cx, cy)
            point = (cx, cy, w0)
            if off and not grid.names_target(state, w0):
                best: tuple[tuple[int, ...], tuple[int, int, Widget | None]] | None = None
                for dx, dy in off:
                    x, y = cx + dx, cy + dy
                    w = hit_in(ws, x, y)
                    if not grid.names_target(state, w):
                        continue
                    assert w is not None
                    wx, wy = w.rect.center
                    rank = ((dx != 0) + (dy != 0), (x - wx) ** 2 + (y - wy) ** 2, dy, dx)
                    if best is None or rank < best[0]:
                        best = (rank, (x, y, w))
                if best is not None:
                    point = best[1]
            row.append(point)
        out.append(row)
    return out


def on_grid(state: DeskState, action: Action, grid: int | ClickGrid) -> Action:
    """``action`` with a click moved to a cell's point (see the module docstring); ``grid``
    an int is a grid of cell centres that many pixels apart."""
    if not isinstance(action, Click):
        return action
    if isinstance(grid, int):
        grid = ClickGrid(grid)
    target = hit_in(widgets(state), action.x, action.y)
    if target is None:
        return action
    cx, cy = target.rect.center
    reach = [(x, y) for row in cell_points(state, grid) for x, y, w in row if w == target]
    if not reach:
        return action
    x, y = min(reach, key=lambda p: ((p[0] - cx) ** 2 + (p[1] - cy) ** 2, p[1], p[0]))
    return attrs.evolve(action, x=x, y=y)
