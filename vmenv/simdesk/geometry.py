"""Where things are on the simulated desktop: rectangles, sizes, the classic layout.

The classic layout (``default_tasks``) is a pure function of (width, height): the taskbar
icons, where windows open and where the dialog sits scale with the screen, so two desktops of
one size are pixel-identical.  Inside a window, every part is a function of the window's
rectangle and the layout's ``Sizes`` (classic sizes come from ``Metrics``; randomized layouts
bring larger ones, see ``placement``).  Rectangles are half-open: [x0, x1) × [y0, y1).
"""

from __future__ import annotations

from typing import Literal

import attrs

#: An app id (see ``apps``): "terminal", "notes" or a decoy.
App = str
#: The classic taskbar's apps, left to right.
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

    def overlaps(self, other: Rect) -> bool:
        return (self.x0 < other.x1 and other.x0 < self.x1
                and self.y0 < other.y1 and other.y0 < self.y1)

    def inside(self, other: Rect) -> bool:
        """Whether this rectangle lies entirely within ``other``."""
        return (other.x0 <= self.x0 and self.x1 <= other.x1
                and other.y0 <= self.y0 and self.y1 <= other.y1)

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


@attrs.frozen
class Sizes:
    """The sizes of window parts, text and the pointer in one layout (pixels)."""

    unit: int  # the pointer's size and small decorations
    pad: int
    font_px: int
    big_font_px: int  # codes shown to be remembered
    title_h: int
    close_inset: int  # the close button's margin inside the title bar
    field_h: int
    button_w: int
    button_h: int
    label_h: int  # room above the notes field for its "Note:" label (0: no label)

    @classmethod
    def classic(cls, m: Metrics) -> Sizes:
        u = m.unit
        return cls(unit=u, pad=m.pad, font_px=m.font_px, big_font_px=2 * u, title_h=m.title_h,
                   close_inset=3, field_h=2 * u, button_w=6 * u, button_h=2 * u, label_h=2 * u)


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


def title_bar(sz: Sizes, win: Rect) -> Rect:
    return Rect(win.x0, win.y0, win.x1, win.y0 + sz.title_h)


def close_button(sz: Sizes, win: Rect) -> Rect:
    i = sz.close_inset
    s = sz.title_h - 2 * i
    return Rect(win.x1 - s - i, win.y0 + i, win.x1 - i, win.y0 + i + s)


def client(sz: Sizes, win: Rect) -> Rect:
    """The window's content area below the title bar."""
    return Rect(win.x0 + 1, win.y0 + sz.title_h, win.x1 - 1, win.y1 - 1)


def notes_field(sz: Sizes, win: Rect) -> Rect:
    c = client(sz, win)
    y0 = c.y0 + sz.pad + sz.label_h
    return Rect(c.x0 + sz.pad, y0, c.x1 - sz.pad, y0 + sz.field_h)


def notes_save(sz: Sizes, win: Rect) -> Rect:
    f = notes_field(sz, win)
    return Rect(f.x1 - sz.button_w, f.y1 + sz.pad, f.x1, f.y1 + sz.pad + sz.button_h)


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
