"""Clicks moved onto a grid's cell centres, for an agent that answers in cells.

An agent whose vision encoder sees the screen in ``cell``-pixel cells (the shipped agents:
32 px) clicks best where a cell's centre is, so its demonstrations should too. ``on_grid``
moves a click to the centre of the cell nearest the clicked widget's centre whose centre
still reaches that widget (the same top-most widget: the click does exactly what the
expert's did); a click with no such cell, and every other action, is left as it is.
"""

from __future__ import annotations

import attrs

from vmenv.actions import Action, Click
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.widgets import hit_in, widgets

__all__ = ["on_grid"]


def on_grid(state: DeskState, action: Action, cell: int) -> Action:
    """``action`` with a click moved to the centre of a ``cell``-pixel grid cell (see the
    module docstring)."""
    if not isinstance(action, Click):
        return action
    ws = widgets(state)
    target = hit_in(ws, action.x, action.y)
    if target is None:
        return action
    cx, cy = target.rect.center
    lay = state.layout
    centres = [(c * cell + cell // 2, r * cell + cell // 2)
               for r in range(lay.height // cell) for c in range(lay.width // cell)]
    reach = [p for p in centres if hit_in(ws, *p) is target]
    if not reach:
        return action
    x, y = min(reach, key=lambda p: ((p[0] - cx) ** 2 + (p[1] - cy) ** 2, p[1], p[0]))
    return attrs.evolve(action, x=x, y=y)
