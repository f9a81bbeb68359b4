"""What each 32x32 cell of a simdesk screen *is* for a click: the class of the widget a click
at the cell's centre reaches — the targets the projector's recogniser learns.

A class is named for what a task asks for, not for how it is drawn: an app's taskbar button
and desktop icon are one class (``launch.<app>``: a task names the app), menu entries,
dialog and recall buttons are their widget names (``menu.notes``, ``dialog.retry``), and the
Notes and Terminal windows' parts too (``notes.field``, ``terminal.title``).  Everything a
task never clicks — the bare desktop, the taskbar's background, decoy windows, a dialog's
body — is ``other``.  On simdesk laid out on the encoder's grid (640x384: unit 16 px) every
scripted click lands in a cell whose centre reaches the clicked widget, so a cell is the
unit the agent clicks.
"""

from __future__ import annotations

import numpy as np

from runtime.train.cell_features import CELL
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.widgets import hit_in, widgets

__all__ = ["OTHER", "cell_classes", "click_class", "widget_class"]

OTHER = "other"
_CLICKABLE = ("menu.", "dialog.", "recall.", "notes.", "terminal.")
_LAUNCHERS = ("icon.", "desk.")


def widget_class(name: str | None) -> str:
    """The class of widget ``name`` (None: the bare desktop)."""
    if name is None:
        return OTHER
    if name.startswith(_LAUNCHERS):
        return "launch." + name.split(".", 1)[1]
    if name.startswith(_CLICKABLE):
        return name
    return OTHER


def click_class(state: DeskState, x: int, y: int) -> str:
    """The class of the widget a click at (x, y) reaches."""
    w = hit_in(widgets(state), x, y)
    return widget_class(w.name if w else None)


def cell_classes(state: DeskState) -> np.ndarray:
    """[rows, cols] of class names (object array): the class a click at each cell's centre
    reaches."""
    lay = state.layout
    rows, cols = lay.height // CELL, lay.width // CELL
    ws = widgets(state)
    out = np.empty((rows, cols), object)
    for r in range(rows):
        for c in range(cols):
            w = hit_in(ws, c * CELL + CELL // 2, r * CELL + CELL // 2)
            out[r, c] = widget_class(w.name if w else None)
    return out
