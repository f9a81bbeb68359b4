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
import numpy as np

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


def _top_most(ws: tuple[Widget, ...], xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Per point, the index in ``ws`` of the widget a click there reaches (``hit_in``: the
    first containing it), ``len(ws)`` for the bare desktop."""
    hit = np.full(xs.shape, len(ws))
    for i in range(len(ws) - 1, -1, -1):  # the first (top-most) widget is written last
        r = ws[i].rect
        hit[(xs >= r.x0) & (xs < r.x1) & (ys >= r.y0) & (ys < r.y1)] = i
    return hit


def cell_points(state: DeskState, grid: ClickGrid,
                ) -> list[list[tuple[int, int, Widget | None]]]:
    """[rows][cols] of each cell's point ``(x, y)`` and the widget it reaches (None: the bare
    desktop); see the module docstring for which point."""
    lay, n = state.layout, grid.cell
    ws = widgets(state)
    rows, cols = lay.height // n, lay.width // n
    cx = (np.arange(cols) * n + n // 2)[None, :, None]
    cy = (np.arange(rows) * n + n // 2)[:, None, None]
    # candidate 0 is the centre, then the off-centre points in (dy, dx) order
    off = np.array([(dx, dy) for dy in grid.offsets for dx in grid.offsets])
    xs = np.broadcast_to(cx + off[:, 0], (rows, cols, len(off)))
    ys = np.broadcast_to(cy + off[:, 1], (rows, cols, len(off)))
    hit = _top_most(ws, xs, ys)
    counted = np.array([grid.names_target(state, w) for w in ws] + [False])[hit]
    if len(off) > 1:
        centre = np.array([w.rect.center for w in ws] + [(0, 0)])[hit]
        dist = (xs - centre[..., 0]) ** 2 + (ys - centre[..., 1]) ** 2
        # rank: the number of offsets, the distance, dy, dx (the module docstring); the
        # centre wins when it is counted, an uncounted point never
        n_off = (off[:, 0] != 0).astype(int) + (off[:, 1] != 0)
        key = np.lexsort((np.broadcast_to(off[:, 0], hit.shape),
                          np.broadcast_to(off[:, 1], hit.shape), dist,
                          np.broadcast_to(n_off, hit.shape), ~counted), axis=-1)[..., 0]
        pick = np.where(counted[..., 0] | ~counted.any(-1), 0, key)
    else:
        pick = np.zeros((rows, cols), int)
    out: list[list[tuple[int, int, Widget | None]]] = []
    for r in range(rows):
        row: list[tuple[int, int, Widget | None]] = []
        for c in range(cols):
            k = pick[r, c]
            i = hit[r, c, k]
            row.append((int(xs[r, c, k]), int(ys[r, c, k]), ws[i] if i < len(ws) else None))
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
