"""Where the parts of one desktop are and what colours they have: the ``Layout`` record.

A ``DeskState`` carries its layout; widgets, rendering and the state transition read every
position from it.  ``classic_layout`` is the fixed layout of ``default_tasks`` (a function of
the screen size only); ``placement`` draws randomized ones from a seed.

Invariants: every rectangle lies on the screen; launchers lie in the taskbar ("tile",
"button") or in the desktop area ("desktop"); at most one launcher of each style per app.
"""

from __future__ import annotations

from typing import Literal

import attrs

from vmenv.simdesk import geometry as geo
from vmenv.simdesk.geometry import App, Metrics, Rect, Sizes

Color = tuple[int, int, int]
LauncherStyle = Literal["tile", "button", "desktop"]


@attrs.frozen
class Theme:
    """The colours of one layout (randomized ones come from legible palettes)."""

    desktop: Color = (46, 84, 126)
    taskbar: Color = (28, 28, 34)
    taskbar_text: Color = (255, 255, 255)
    frame: Color = (90, 90, 100)
    title_active: Color = (52, 101, 164)
    title_inactive: Color = (140, 140, 150)
    title_text: Color = (255, 255, 255)
    close: Color = (204, 64, 64)
    paper: Color = (246, 246, 242)
    ink: Color = (0, 0, 0)
    button: Color = (222, 222, 222)
    primary: Color = (52, 101, 164)  # the highlighted dialog button
    primary_text: Color = (255, 255, 255)
    focus: Color = (40, 120, 240)
    dialog: Color = (236, 236, 236)
    menu: Color = (245, 245, 245)
    icon_label: Color = (255, 255, 255)  # desktop icon labels, on ``desktop``


CLASSIC_THEME = Theme()


@attrs.frozen
class Launcher:
    """An icon that opens ``app``: a square tile or a labelled button in the taskbar, or an
    icon with its label under it on the desktop.  ``rect`` is the whole clickable area."""

    app: App
    rect: Rect
    style: LauncherStyle

    @property
    def name(self) -> str:
        """Its widget name: ``icon.<app>`` in the taskbar, ``desk.<app>`` on the desktop."""
        return f"desk.{self.app}" if self.style == "desktop" else f"icon.{self.app}"


@attrs.frozen
class MenuSpec:
    """A launcher menu: a taskbar button that opens a panel of entries, one per app."""

    button: Rect
    label: str
    panel: Rect
    entries: tuple[tuple[App, Rect], ...]

    def entry(self, app: App) -> Rect | None:
        return next((r for a, r in self.entries if a == app), None)


@attrs.frozen
class RecallSpec:
    """Where the notification that reopens a dismissed dialog appears."""

    box: Rect
    button: Rect


@attrs.frozen
class Layout:
    """Every position and colour of one desktop (see the module docstring)."""

    width: int
    height: int
    sizes: Sizes
    theme: Theme
    taskbar: Rect
    clock: Rect
    launchers: tuple[Launcher, ...] = ()
    menu: MenuSpec | None = None
    openings: tuple[tuple[App, Rect], ...] = ()  # where each app's window opens
    recall: RecallSpec | None = None
    keep_inside: bool = False  # dragged windows stay inside the desktop (else: title reachable)
    short_clock: bool = False  # "HH:MM:SS" centred (else the classic "step N  HH:MM:SS")
    #: windows and dialogs placed off the unit grid, by less than a unit (dense)
    jitter: bool = False

    @property
    def desktop(self) -> Rect:
        """The area above the taskbar."""
        return Rect(0, 0, self.width, self.taskbar.y0)

    def opening(self, app: App) -> Rect:
        """Where ``app``'s window opens (an app without a place opens centred)."""
        for a, r in self.openings:
            if a == app:
                return r
        d = self.desktop
        w, h = d.width * 3 // 5, d.height * 3 // 5
        x0, y0 = (d.width - w) // 2, (d.height - h) // 2
        return Rect(x0, y0, x0 + w, y0 + h)

    def launchers_of(self, app: App) -> tuple[Launcher, ...]:
        return tuple(x for x in self.launchers if x.app == app)

    def clamp(self, win: Rect) -> Rect:
        """A dragged window's rectangle, kept reachable (see ``keep_inside``)."""
        if not self.keep_inside:
            return geo.clamp_window(Metrics(self.width, self.height), win)
        d = self.desktop
        dx = min(max(win.x0, d.x0), max(d.x1 - win.width, d.x0)) - win.x0
        dy = min(max(win.y0, d.y0), max(d.y1 - win.height, d.y0)) - win.y0
        return win.moved(dx, dy)


def classic_layout(m: Metrics) -> Layout:
    """The fixed layout: Terminal and Notes tiles in the taskbar, the classic windows."""
    return Layout(
        width=m.width, height=m.height, sizes=Sizes.classic(m), theme=CLASSIC_THEME,
        taskbar=geo.taskbar(m), clock=geo.clock(m),
        launchers=tuple(Launcher(app, geo.icon(m, app), "tile") for app in geo.APPS),
        openings=tuple((app, geo.default_window(m, app)) for app in geo.APPS))
