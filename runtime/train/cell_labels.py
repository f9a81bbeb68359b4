"""What each 32x32 cell of a simdesk screen *is* for a click: the class of the widget a click
at the cell's centre reaches — the targets the projector's recogniser learns.

A class is named for what a task asks for, not for how it is drawn: an app's taskbar button
and desktop icon are one class (``launch.<app>``: a task names the app), menu entries,
dialog and recall buttons are their widget names (``menu.notes``, ``dialog.retry``), and the
Notes and Terminal windows' parts too (``notes.field``, ``terminal.title``).  With
``entries="launch"`` (``MenuEntries``) an app's menu entry is its launcher too: it opens the
app.  As ``menu.<app>`` (``"menu"``, the shipped agents' classes) the agents asked for the
launcher a menu-only scene lacks and clicked the menu button again — the composition "the
named app, in the open menu" was never learnt (docs/training.md).  Everything a
task never clicks — the bare desktop, the taskbar's background, decoy windows, a dialog's
body — is ``other``.  One class is named for how it is drawn: ``marked``, the cells of a
launcher while it carries the first screen's mark (``marked-launch``: the task names no app,
the mark says which; ``DeskState.mark``, gone after the first action — from then on the
same cells are ``launch.<app>`` again, and a click there needs the mark's cells on the first
screenshot: ``query_class``).  On simdesk laid out on the encoder's grid (640x384: unit
16 px) every scripted click lands in a cell whose centre reaches the clicked widget, so a
cell is the unit the agent clicks; on a dense layout a cell's *point* may lie 8 px off its
centre (``sub_cell_grid``; ``cell_targets``: its class and where the point is).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from runtime.train.cell_features import CELL
from vmenv.simdesk.goals import Goal
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.grid_clicks import ClickGrid, cell_points
from vmenv.simdesk.widgets import Widget, hit_in, widgets

__all__ = ["MARKED", "MENU_ENTRIES", "OTHER", "SUB_OFFSETS", "MenuEntries", "cell_classes",
           "cell_targets", "click_class", "query_class", "sub_cell_grid", "widget_class"]

OTHER = "other"
MARKED = "marked"
_CLICKABLE = ("menu.", "dialog.", "recall.", "notes.", "terminal.")
_LAUNCHERS = ("icon.", "desk.")
#: the menu's own widgets; every other ``menu.<app>`` is an app's entry
_MENU_PARTS = ("menu.button", "menu.panel", "menu.outside")
#: classes that contain targets rather than being one: a sub-cell point never names them
_CONTAINERS = ("menu.panel", "menu.outside", "notes.window", "terminal.window")
#: the sub-cell grid's points per axis, from a cell's centre (``sub_cell_grid``)
SUB_OFFSETS = (0, -CELL // 4, CELL // 4)
#: how an app's menu entry is classed: ``menu.<app>`` or its launcher's ``launch.<app>``
MenuEntries = Literal["menu", "launch"]
MENU_ENTRIES: tuple[MenuEntries, ...] = ("menu", "launch")


def widget_class(name: str | None, entries: MenuEntries = "menu") -> str:
    """The class of widget ``name`` (None: the bare desktop)."""
    if name is None:
        return OTHER
    if name.startswith(_LAUNCHERS) or (entries == "launch" and name.startswith("menu.")
                                       and name not in _MENU_PARTS):
        return "launch." + name.split(".", 1)[1]
    if name.startswith(_CLICKABLE):
        return name
    return OTHER


def _launcher_names(app: str | None) -> tuple[str, ...]:
    return () if app is None else (f"icon.{app}", f"desk.{app}")


def _state_class(state: DeskState, name: str | None, entries: MenuEntries) -> str:
    """``widget_class``, but ``marked`` for a launcher of the app the screen marks."""
    if name in _launcher_names(state.mark):
        return MARKED
    return widget_class(name, entries)


def click_class(state: DeskState, x: int, y: int, entries: MenuEntries = "menu") -> str:
    """The class of the widget a click at (x, y) reaches."""
    w = hit_in(widgets(state), x, y)
    return _state_class(state, w.name if w else None, entries)


def query_class(goal: Goal | None, state: DeskState, x: int, y: int,
                entries: MenuEntries = "menu") -> str:
    """The class a click's lookup must name: ``marked`` for a click on a launcher of the app a
    ``marked-launch`` goal opens last (``Goal.then``) — its cells are ``marked`` only on the
    first screenshot, so that is where the lookup finds them — else ``click_class``."""
    w = hit_in(widgets(state), x, y)
    if goal is not None and w is not None and w.name in _launcher_names(goal.then):
        return MARKED
    return click_class(state, x, y, entries)


def cell_classes(state: DeskState, entries: MenuEntries = "menu") -> np.ndarray:
    """[rows, cols] of class names (object array): the class a click at each cell's centre
    reaches."""
    return cell_targets(state, entries)[0]


def cell_targets(state: DeskState, entries: MenuEntries = "menu",
                 grid: ClickGrid | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per cell, the class its point reaches ([rows, cols] of names) and where the point is
    ([rows, cols, 2] int8 of x, y steps of ``CELL // 4`` from the cell's centre: -1, 0, 1);
    the points are ``grid``'s (``grid_clicks.cell_points``; default the cell centres)."""
    pts = cell_points(state, grid or ClickGrid(CELL))
    rows, cols = len(pts), len(pts[0])
    classes = np.empty((rows, cols), object)
    offsets = np.zeros((rows, cols, 2), np.int8)
    for r, row in enumerate(pts):
        for c, (x, y, w) in enumerate(row):
            classes[r, c] = _state_class(state, w.name if w else None, entries)
            offsets[r, c] = ((x - c * CELL - CELL // 2) // (CELL // 4),
                             (y - r * CELL - CELL // 2) // (CELL // 4))
    return classes, offsets


def sub_cell_grid(entries: MenuEntries = "menu") -> ClickGrid:
    """The grid of cell points 8 px either side of a cell's centre (``grid_clicks``): an
    off-centre point where the centre reaches no target (a widget of class ``other``, or a
    container — a window's body, the open menu's panel), for a target: any other class."""

    def counts(state: DeskState, w: Widget) -> bool:
        cls = _state_class(state, w.name, entries)
        return cls != OTHER and cls not in _CONTAINERS

    return ClickGrid(CELL, SUB_OFFSETS, counts)
