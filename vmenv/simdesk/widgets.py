"""The clickable parts of the current screen, top-most first: hit-testing and lookup by name.

One list serves the mouse (``hit``), the tasks' scripted solutions and experts, and tests
(``locate``), so the places a script clicks are exactly the places the desktop reacts to.

Layers, top-most first (the picture is painted in the reverse order):
* while a dialog is open: ``dialog.<button id>`` (``dialog.ok``, ``dialog.cancel``, ...),
  ``dialog`` (its body), ``modal`` (everything else);
* while the launcher menu is open: ``menu.<app>`` per entry, ``menu.panel``, ``menu.button``,
  ``menu.outside`` (everything else: a click there closes the menu);
* the notification of a dismissed dialog: ``recall.reopen``, ``recall``;
* the taskbar: ``icon.<app>`` per taskbar launcher, ``menu.button``, ``taskbar``;
* per window, top to bottom: ``<app>.close``, ``<app>.title``, ``notes.field``,
  ``notes.save``, ``terminal.input`` (the terminal's whole client area), ``<app>.window``;
* ``desk.<app>`` per desktop icon.
A point hitting nothing is the bare desktop.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from vmenv.errors import UnknownWidgetError
from vmenv.simdesk import geometry as geo
from vmenv.simdesk.geometry import Rect
from vmenv.simdesk.state import DeskState


@attrs.frozen
class Widget:
    name: str
    rect: Rect


def _window_widgets(state: DeskState) -> list[Widget]:
    sz, out = state.layout.sizes, []
    for win in reversed(state.windows):
        r, app = win.rect, win.app
        out += [Widget(f"{app}.close", geo.close_button(sz, r)),
                Widget(f"{app}.title", geo.title_bar(sz, r))]
        if app == "notes":
            out += [Widget("notes.field", geo.notes_field(sz, r)),
                    Widget("notes.save", geo.notes_save(sz, r))]
        elif app == "terminal":
            out.append(Widget("terminal.input", geo.client(sz, r)))
        out.append(Widget(f"{app}.window", r))
    return out


def widgets(state: DeskState) -> tuple[Widget, ...]:
    """Every widget on screen, top-most first (the first one containing a point gets it)."""
    lay = state.layout
    screen = Rect(0, 0, lay.width, lay.height)
    out: list[Widget] = []
    if state.dialog is not None:
        d = state.dialog
        out += [Widget(f"dialog.{b.id}", b.rect) for b in d.buttons]
        out += [Widget("dialog", d.rect), Widget("modal", screen)]
    if state.menu_open and lay.menu is not None:
        out += [Widget(f"menu.{app}", r) for app, r in lay.menu.entries]
        out += [Widget("menu.panel", lay.menu.panel), Widget("menu.button", lay.menu.button),
                Widget("menu.outside", screen)]
    if state.recall is not None and lay.recall is not None:
        out += [Widget("recall.reopen", lay.recall.button), Widget("recall", lay.recall.box)]
    out += [Widget(x.name, x.rect) for x in lay.launchers if x.style != "desktop"]
    if lay.menu is not None and not state.menu_open:
        out.append(Widget("menu.button", lay.menu.button))
    out.append(Widget("taskbar", lay.taskbar))
    out += _window_widgets(state)
    out += [Widget(x.name, x.rect) for x in lay.launchers if x.style == "desktop"]
    return tuple(out)


def hit_in(ws: Sequence[Widget], x: int, y: int) -> Widget | None:
    """``hit`` over a list already built by ``widgets`` (for callers that test many points)."""
    return next((w for w in ws if w.rect.contains(x, y)), None)


def hit(state: DeskState, x: int, y: int) -> Widget | None:
    """The widget that receives a click at (x, y), or None for the bare desktop."""
    return hit_in(widgets(state), x, y)


def find(state: DeskState, name: str) -> Widget | None:
    """Widget ``name`` if it is on screen (covered or not)."""
    return next((w for w in widgets(state) if w.name == name), None)


def locate(state: DeskState, name: str) -> tuple[int, int]:
    """The centre of widget ``name`` — where a click reaches it (raises ``UnknownWidgetError``).

    The centre of a covered widget may belong to the window above it; callers that need a
    reachable point check ``hit`` (the tasks' scripted solutions only use uncovered widgets).
    """
    w = find(state, name)
    if w is None:
        raise UnknownWidgetError(f"no widget {name!r} on screen")
    return w.rect.center
