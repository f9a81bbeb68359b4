"""Where things are on the simulated desktop: rectangles derived from the screen size.

Every position is a pure function of (width, height) and, inside a window, of the window's
rectangle, so the desktop looks the same at any resolution (scaled) and two desktops of one
size are pixel-identical.  Rectangles are half-open: [x0, x1) × [y0, y1).
"""

from __future__ import annotations

from typing import Literal

import attrs

App = Literal["terminal", "notes"]
#: Taskbar order, left to right.
APPS: tuple[App, ...] = ("terminal", "notes")
APP_TITLES: dict[App, str] = {"terminal": "Terminal", "notes": "Notes"}


@attrs.frozen
class Rect:
    """An axis-aligned rectangle, half-open."""

    x0: int
    y0: int
    x1: int
    y1: int

    def __attrs_post_init__(self) -> None:
        assert self.x0 < self.x1 and self.y0 < self.y1, self

    @property
    def width(self) -> int:
        return self.x1 - self.x0

    @property
    def height(self) -> int:
        return self.y1 - self.y0

    @property
    def center(self) -> tuple[int, int]:
        return (self.x0 + self.x1) // 2, (self.y0 + self.y1) // 2

    def contains(self, x: int, y: int) -> bool:
        return self.x0 <= x < self.x1 and self.y0 <= y < self.y1

    def moved(self, dx: int, dy: int) -> Rect:
        return Rect(self.x0 + dx, self.y0 + dy, self.x1 + dx, self.y1 + dy)

    def inset(self, d: int) -> Rect:
        return Rect(self.x0 + d, self.y0 + d, self.x1 - d, self.y1 - d)

    @property
    def box(self) -> tuple[int, int, int, int]:
        """Pillow's inclusive box (x0, y0, x1 - 1, y1 - 1)."""
        return self.x0, self.y0, self.x1 - 1, self.y1 - 1


@attrs.frozen
class Metrics:
    """Sizes that scale with the screen (at 1280×720: taskbar 48, title bar 30, font 16)."""

    width: int
    height: int

    def __attrs_post_init__(self) -> None:
        if self.width < 320 or self.height < 240:
            raise ValueError(f"the simulated desktop needs at least 320x240, got "
                             f"{self.width}x{self.height}")

    @property
    def unit(self) -> int:
        """One layout unit: 1/45 of the height (16 px at 720p)."""
        return max(self.height // 45, 6)

    @property
    def taskbar_h(self) -> int:
        return 3 * self.unit

    @property
    def title_h(self) -> int:
        return self.unit * 15 // 8

    @property
    def pad(self) -> int:
        return self.unit

    @property
    def font_px(self) -> int:
        return self.unit

    @property
    def desktop(self) -> Rect:
        """The area above the taskbar."""
        return Rect(0, 0, self.width, self.height - self.taskbar_h)


def taskbar(m: Metrics) -> Rect:
    return Rect(0, m.height - m.taskbar_h, m.width, m.height)


def icon(m: Metrics, app: App) -> Rect:
    """The app's launcher icon in the taskbar."""
    size = m.taskbar_h - m.unit // 2
    x0 = m.unit // 2 + APPS.index(app) * (size + m.unit // 2)
    y0 = m.height - m.taskbar_h + (m.taskbar_h - size) // 2
    return Rect(x0, y0, x0 + size, y0 + size)


def clock(m: Metrics) -> Rect:
    """The step counter / clock at the right end of the taskbar."""
    bar = taskbar(m)
    return Rect(bar.x1 - 14 * m.unit, bar.y0, bar.x1, bar.y1)


def default_window(m: Metrics, app: App) -> Rect:
    """Where an app's window opens (terminal left, notes right; they overlap a little)."""
    d = m.desktop
    if app == "terminal":
        x0, y0, w, h = d.width // 16, d.height // 10, d.width // 2, d.height * 6 // 10
    else:
        x0, y0, w, h = d.width * 7 // 16, d.height * 2 // 10, d.width * 7 // 16, d.height // 2
    return Rect(x0, y0, x0 + w, y0 + h)


def title_bar(m: Metrics, win: Rect) -> Rect:
    return Rect(win.x0, win.y0, win.x1, win.y0 + m.title_h)


def close_button(m: Metrics, win: Rect) -> Rect:
    s = m.title_h - 6
    return Rect(win.x1 - s - 3, win.y0 + 3, win.x1 - 3, win.y0 + 3 + s)


def client(m: Metrics, win: Rect) -> Rect:
    """The window's content area below the title bar."""
    return Rect(win.x0 + 1, win.y0 + m.title_h, win.x1 - 1, win.y1 - 1)


def notes_field(m: Metrics, win: Rect) -> Rect:
    c = client(m, win)
    y0 = c.y0 + m.pad + 2 * m.unit
    return Rect(c.x0 + m.pad, y0, c.x1 - m.pad, y0 + 2 * m.unit)


def notes_save(m: Metrics, win: Rect) -> Rect:
    f = notes_field(m, win)
    return Rect(f.x1 - 6 * m.unit, f.y1 + m.pad, f.x1, f.y1 + m.pad + 2 * m.unit)


def dialog(m: Metrics) -> Rect:
    d = m.desktop
    w, h = max(d.width // 3, 20 * m.unit), 9 * m.unit
    x0, y0 = (d.width - w) // 2, (d.height - h) // 2
    return Rect(x0, y0, x0 + w, y0 + h)


def dialog_button(m: Metrics, box: Rect, which: Literal["ok", "cancel"]) -> Rect:
    """OK on the right, Cancel to its left (GNOME order)."""
    w, h = 6 * m.unit, 2 * m.unit
    x1 = box.x1 - m.pad if which == "ok" else box.x1 - 2 * m.pad - w
    y1 = box.y1 - m.pad
    return Rect(x1 - w, y1 - h, x1, y1)


def clamp_window(m: Metrics, win: Rect) -> Rect:
    """Keep a dragged window's title bar reachable: inside the desktop, above the taskbar."""
    d = m.desktop
    dx = min(max(win.x0, d.x0 - win.width + 4 * m.unit), d.x1 - 4 * m.unit) - win.x0
    dy = min(max(win.y0, d.y0), d.y1 - m.title_h) - win.y0
    return win.moved(dx, dy)
