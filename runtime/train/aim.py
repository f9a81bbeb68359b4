"""Where the trained agents click: the encoder cell's centre nearest the expert's point.

simdesk's scripted solutions click a widget's centre; any point on the widget does the same.
The readable projector (``runtime.train.readable_vision``) gives every 32x32 cell the decimal
digits of its centre, so a demonstration that clicks a cell centre on the target widget asks the
model to copy digits it can read, not to interpolate them: ``aim_at_cells`` moves each click
to the nearest cell centre that hits the same widget (the same effect on the desktop), and
leaves a click alone when no cell centre does (a widget narrower than a cell).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from runtime.train.readable_vision import cell_centres
from vmenv.actions import Action, Click
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.widgets import Widget, hit_in, widgets

__all__ = ["aim_at_cells", "cell_point"]


def cell_point(shown: Sequence[Widget], target: Widget, x: int, y: int,
               centres: tuple[Sequence[int], Sequence[int]]) -> tuple[int, int]:
    """The cell centre nearest (x, y) where a click reaches ``target`` (``shown``: the
    screen's widgets, top-most first), or (x, y) itself if there is none."""
    best: tuple[int, int, int] | None = None
    for cx in centres[0]:
        for cy in centres[1]:
            if not target.rect.contains(cx, cy) or hit_in(shown, cx, cy) is not target:
                continue
            d = (cx - x) ** 2 + (cy - y) ** 2
            if best is None or d < best[0]:
                best = (d, cx, cy)
    return (x, y) if best is None else (best[1], best[2])


def aim_at_cells(screen: tuple[int, int]) -> Callable[[DeskState, Action], Action]:
    """The expert's action with a click moved to a cell centre on the same widget (other
    actions unchanged)."""
    centres = cell_centres(screen)

    def aim(state: DeskState, action: Action) -> Action:
        if not isinstance(action, Click):
            return action
        shown = widgets(state)
        target = hit_in(shown, action.x, action.y)
        if target is None:
            return action
        x, y = cell_point(shown, target, action.x, action.y, centres)
        return attrs.evolve(action, x=x, y=y)

    return aim
