"""The clickable parts of the current screen, top-most first: hit-testing and lookup by name.

One list serves the mouse (``hit``), the tasks' scripted solutions and tests (``locate``), so
the places a script clicks are exactly the places the desktop reacts to.

Names: ``dialog.ok``, ``dialog.cancel``, ``dialog`` (its body), ``modal`` (everything else
while a dialog is open); per window ``<app>.close``, ``<app>.title``, ``notes.field``,
``notes.save``, ``terminal.input`` (the terminal's whole client area), ``<app>.window``;
``icon.<app>``; ``taskbar``.  A point hitting nothing is the bare desktop.
"""

from __future__ import annotations

import attrs

from vmenv.simdesk import geometry as geo
from vmenv.errors import UnknownWidgetError
from vmenv.simdesk.geometry import Rect
from vmenv.simdesk.state import DeskState


@attrs.frozen
class Widget:
    name: str
    rect: Rect


def widgets(state: DeskState) -> tuple[Widget, ...]:
    """Every widget on screen, top-most first (the first one containing a point gets it)."""
    m = state.metrics
    out: list[Widget] = []
    if state.dialog is not None:
        box = geo.dialog(m)
        out += [Widget("dialog.ok", geo.dialog_button(m, box, "ok")),
                Widget("dialog.cancel", geo.dialog_button(m, box, "cancel")),
                Widget("dialog", box),
                Widget("modal", Rect(0, 0, m.width, m.height))]
    for win in reversed(state.windows):
        r, app = win.rect, win.app
        out += [Widget(f"{app}.close", geo.close_button(m, r)),
                Widget(f"{app}.title", geo.title_bar(m, r))]
        if app == "notes":
            out += [Widget("notes.field", geo.notes_field(m, r)),
                    Widget("notes.save", geo.notes_save(m, r))]
        else:
            out.append(Widget("terminal.input", geo.client(m, r)))
        out.append(Widget(f"{app}.window", r))
    out += [Widget(f"icon.{app}", geo.icon(m, app)) for app in geo.APPS]
    out.append(Widget("taskbar", geo.taskbar(m)))
    return tuple(out)


def hit(state: DeskState, x: int, y: int) -> Widget | None:
    """The widget that receives a click at (x, y), or None for the bare desktop."""
    return next((w for w in widgets(state) if w.rect.contains(x, y)), None)


def locate(state: DeskState, name: str) -> tuple[int, int]:
    """The centre of widget ``name`` — where a click reaches it (raises ``UnknownWidgetError``).

    The centre of a covered widget may belong to the window above it; callers that need a
    reachable point check ``hit`` (the tasks' scripted solutions only use uncovered widgets).
    """
    for w in widgets(state):
        if w.name == name:
            return w.rect.center
    raise UnknownWidgetError(f"no widget {name!r} on screen")
