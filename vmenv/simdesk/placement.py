"""Randomized layouts: where launchers, windows, the menu and dialogs go, drawn from an rng.

Sizes are in cells of ``unit_for(width, height)`` pixels (15 at 640x360, 30 at 1280x720),
and positions are drawn in whole cells, so one seed gives the same picture at every 16:9
size, scaled.  Legibility (what a small vision model needs, at 640x360): text is one cell
(15 px) high, codes two; every target an agent clicks is at least three cells (45 px; the
window close button 41 px) on its short side — title bars, fields, buttons, taskbar
launchers, menu entries — and desktop icons are 5x4 to 6x5 cells.  A dense scene
(``Scene.dense``, the ``dense-*`` kinds) is the small case: cells of ``dense_unit`` (half),
half of them compact (bars two cells tall), windows and dialogs off the cells by less than
one (``Layout.jitter``).

Invariants of ``place_scene`` (tested over many seeds): launchers and the menu button never
overlap each other; desktop icons keep a cell of space between them and are not covered by
any window open at the start (nor by the windows of ``Scene.clear_of`` when they open);
every rectangle lies on the screen, windows and dialogs inside
the desktop (above the taskbar).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs

from vmenv.simdesk.apps import WORKING_APPS, app_title
from vmenv.simdesk.dialogs import Dialog, DialogButton
from vmenv.simdesk.geometry import Rect, Sizes
from vmenv.simdesk.layout import Launcher, Layout, MenuSpec, RecallSpec
from vmenv.simdesk.paint import text_width
from vmenv.simdesk.state import Window
from vmenv.simdesk.themes import random_theme

#: Desktop icon sizes in cells (width, height), one per layout; labels need five cells.
ICON_CELLS: tuple[tuple[int, int], ...] = ((5, 4), (5, 5), (6, 5))
#: The share of layouts whose taskbar shows square glyph tiles without labels.
TILE_TASKBAR_SHARE = 0.25
#: (min, max) width and height of a window, in cells.
WINDOW_CELLS: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "notes": ((16, 26), (12, 14)), "terminal": ((16, 26), (9, 13)),
}
DECOY_WINDOW_CELLS = ((11, 18), (7, 11))


class PlacementError(Exception):
    """The drawn window rectangles left no room for a required icon (callers redraw)."""


def unit_for(width: int, height: int) -> int:
    """The cell size in pixels: a 24th of the height, narrower when the screen is narrow."""
    return max(min(height // 24, width // 32), 8)


def _jitter(rng: random.Random, r: Rect, bound: Rect, unit: int) -> Rect:
    """``r`` moved right and down by 0 .. unit - 1 px each, as far as ``bound`` leaves room."""
    dx = rng.randrange(max(min(unit, bound.x1 - r.x1 + 1), 1))
    dy = rng.randrange(max(min(unit, bound.y1 - r.y1 + 1), 1))
    return Rect(r.x0 + dx, r.y0 + dy, r.x1 + dx, r.y1 + dy)


def dense_unit(width: int, height: int) -> int:
    """The cell size of a dense scene: half ``unit_for`` (8 px at 640x384, where the classic
    layout's unit is 8 too), at least 6."""
    return max(unit_for(width, height) // 2, 6)


#: The share of dense layouts whose title bars, fields and buttons are two cells tall
#: instead of three (16 px at 640x384, as the classic layout's), the Notes field labelled.
COMPACT_SHARE = 0.5


def random_sizes(unit: int, compact: bool = False) -> Sizes:
    """Sizes in cells of ``unit``; ``compact``: title bars, fields and buttons two cells
    tall, not three, and the Notes field labelled ("Note:", two cells above it), as the
    classic layout's."""
    bar = (2 if compact else 3) * unit
    return Sizes(unit=unit, pad=max(unit * 2 // 3, 4), font_px=unit, big_font_px=2 * unit,
                 title_h=bar, close_inset=max(unit // 8, 2), field_h=bar,
                 button_w=6 * unit, button_h=bar, label_h=2 * unit if compact else 0)


@attrs.frozen
class Scene:
    """What a task kind asks for; ``place_scene`` decides where.

    ``required`` apps keep their launchers and menu entries whatever room there is; other
    launchers are dropped when the taskbar or the desktop is full.
    """

    taskbar: tuple[str, ...] = ()  # apps with a taskbar launcher, left to right
    desktop: tuple[str, ...] = ()  # apps with a desktop icon
    menu: tuple[str, ...] | None = None  # menu entries, top to bottom (None: no menu)
    windows: tuple[str, ...] = ()  # windows open at the start, bottom to top
    required: frozenset[str] = frozenset()
    recall: bool = False  # room for the notification that reopens a dismissed dialog
    menu_label: str = "Apps"
    clear_of: tuple[str, ...] = ()  # apps whose window, once opened, covers no desktop icon
    #: laid out in half-size cells (``dense_unit``), windows and dialogs moved off
    #: them by less than a cell (``Layout.jitter``): targets as small as the classic
    #: layout's, at any pixel as the classic layout's are, most of them off the encoder's
    #: 32-px grid (the ``dense-*`` kinds)
    dense: bool = False
    #: laid out as the classic layout is (``classic_style``): its taskbar tiles, sizes and
    #: window places, in a random theme, off the cells by less than one (the
    #: ``classic-*`` kinds)
    classic: bool = False


@attrs.frozen
class Placed:
    layout: Layout
    windows: tuple[Window, ...]


class CellGrid:
    """The screen in cells of ``unit`` px: the taskbar (three cells and two margins tall),
    the desktop above it, and rectangles drawn in whole cells (moved off them by less than
    a cell with ``jitter``)."""

    def __init__(self, rng: random.Random, width: int, height: int, unit: int,
                 jitter: bool = False) -> None:
        self.rng, self.w, self.h = rng, width, height
        self.u = unit
        self.jitter = jitter
        self.m = max(self.u // 4, 2)  # the margin around taskbar items
        self.taskbar = Rect(0, height - 3 * self.u - 2 * self.m, width, height)
        self.desk = Rect(0, 0, width, self.taskbar.y0)
        self.cols, self.rows = width // self.u, self.desk.height // self.u

    def rect_cells(self, cx: int, cy: int, cw: int, ch: int) -> Rect:
        u = self.u
        return Rect(cx * u, cy * u, (cx + cw) * u, (cy + ch) * u)

    def random_rect(self, cw: int, ch: int) -> Rect:
        cw, ch = min(cw, self.cols), min(ch, self.rows)
        return self.jittered(self.rect_cells(self.rng.randint(0, self.cols - cw),
                                             self.rng.randint(0, self.rows - ch), cw, ch))

    def jittered(self, r: Rect) -> Rect:
        """``r`` moved right and down by less than a cell, staying on the desktop, on a
        grid with jitter (drawn only then); else ``r``."""
        return _jitter(self.rng, r, self.desk, self.u) if self.jitter else r

    def window_rect(self, app: str) -> Rect:
        (w0, w1), (h0, h1) = WINDOW_CELLS.get(app, DECOY_WINDOW_CELLS)
        return self.random_rect(self.rng.randint(w0, w1), self.rng.randint(h0, h1))


def _taskbar_items(g: CellGrid, sz: Sizes, scene: Scene,
                   rng: random.Random) -> tuple[tuple[Launcher, ...], MenuSpec | None, Rect]:
    """Taskbar launchers, the menu (button and panel) and the clock.  ``rng`` is the
    taskbar's own: its draws depend on pixel widths of labels, and must not shift the draws
    in cells that follow."""
    u, m, bar = g.u, g.m, g.taskbar
    y0, y1 = bar.y0 + m, bar.y0 + m + 3 * u
    clock_w = text_width("00:00:00", sz.font_px) + 2 * u
    menu_label = scene.menu_label
    menu_w = max(text_width(menu_label, sz.font_px) + 2 * u, 4 * u)
    menu_left = scene.menu is not None and rng.random() < 0.5
    if menu_left:
        menu_x, lo, clock = m, 2 * m + menu_w, Rect(g.w - m - clock_w, y0, g.w - m, y1)
    else:
        clock = Rect(m, y0, m + clock_w, y1)
        lo, menu_x = clock.x1 + m, g.w - m - menu_w
    hi = menu_x - m if scene.menu is not None and not menu_left else g.w - 2 * m - clock_w
    glyph = 3 * u - 2 * m
    gap = rng.randint(m, u)
    tiles = rng.random() < TILE_TASKBAR_SHARE
    widths = {a: 3 * u if tiles else 2 * m + glyph + text_width(app_title(a), sz.font_px)
              + u // 2 + m for a in scene.taskbar}
    apps = list(scene.taskbar)
    while apps and sum(widths[a] + gap for a in apps) > hi - lo:
        droppable = [a for a in apps if a not in scene.required]
        if not droppable:
            raise PlacementError("the required taskbar launchers do not fit")
        apps.remove(droppable[-1])
    x = lo + rng.randint(0, max(hi - lo - sum(widths[a] + gap for a in apps), 0) // 2)
    launchers = []
    for a in apps:
        launchers.append(Launcher(a, Rect(x, y0, x + widths[a], y1),
                                  "tile" if tiles else "button"))
        x += widths[a] + gap
    menu = None
    if scene.menu is not None:
        button = Rect(menu_x, y0, menu_x + menu_w, y1)
        menu = _menu(g, sz, scene, button, menu_label, menu_left)
    return tuple(launchers), menu, clock


def _menu(g: CellGrid, sz: Sizes, scene: Scene, button: Rect, label: str,
          left: bool) -> MenuSpec:
    u, m = g.u, g.m
    assert scene.menu is not None
    entry_h = 3 * u
    fit = (g.desk.height - m) // (entry_h + m)
    apps = list(scene.menu)
    while len(apps) > fit:
        apps.remove([a for a in apps if a not in scene.required][-1])
    glyph = entry_h - 2 * m
    text = max((text_width(app_title(a), sz.font_px) for a in apps), default=0)
    w = max(3 * sz.pad + glyph + text + u, 9 * u)
    h = len(apps) * (entry_h + m) + m
    x0 = button.x0 if left else button.x1 - w
    panel = Rect(x0, g.taskbar.y0 - h, x0 + w, g.taskbar.y0)
    entries = tuple((a, Rect(x0 + m, panel.y0 + m + i * (entry_h + m), x0 + w - m,
                             panel.y0 + m + i * (entry_h + m) + entry_h))
                    for i, a in enumerate(apps))
    return MenuSpec(button, label, panel, entries)


def _free_spots(g: CellGrid, taken: Sequence[Rect], w: int, h: int) -> list[tuple[int, int]]:
    """Cells (cx, cy) where a w x h block overlaps none of ``taken`` (rectangles aligned to
    cells, so overlapping means sharing a cell): a prefix sum over the occupied cells."""
    cols, rows, u = g.cols, g.rows, g.u
    busy = [[0] * cols for _ in range(rows)]
    for r in taken:
        for cy in range(max(r.y0 // u, 0), min(-(-r.y1 // u), rows)):
            for cx in range(max(r.x0 // u, 0), min(-(-r.x1 // u), cols)):
                busy[cy][cx] = 1
    acc = [[0] * (cols + 1) for _ in range(rows + 1)]
    for y in range(rows):
        for x in range(cols):
            acc[y + 1][x + 1] = busy[y][x] + acc[y][x + 1] + acc[y + 1][x] - acc[y][x]
    return [(cx, cy) for cx in range(cols - w + 1) for cy in range(rows - h + 1)
            if acc[cy + h][cx + w] - acc[cy][cx + w] - acc[cy + h][cx] + acc[cy][cx] == 0]


def _desktop_icons(g: CellGrid, scene: Scene, blocked: Sequence[Rect]) -> tuple[Launcher, ...]:
    """Icons in free cells: off every start window, a cell apart from each other."""
    rng, u = g.rng, g.u
    cw, ch = rng.choice(ICON_CELLS)
    out: list[Launcher] = []
    for app in scene.desktop:
        free = _free_spots(g, [*blocked, *(x.rect.inset(-u) for x in out)], cw, ch)
        if not free:
            if app in scene.required:
                raise PlacementError(f"no room for the {app} icon")
            continue
        out.append(Launcher(app, g.rect_cells(*rng.choice(free), cw, ch), "desktop"))
    return tuple(out)


def recall_spec(g: CellGrid, sz: Sizes) -> RecallSpec:
    u, m = g.u, g.m
    w, h = min(18 * u, g.w - 2 * m), 3 * u + 2 * m
    corner = g.rng.randrange(4)
    x0 = m if corner % 2 == 0 else g.w - m - w
    y0 = m if corner < 2 else g.desk.y1 - m - h
    box = Rect(x0, y0, x0 + w, y0 + h)
    bw = max(text_width("Reopen", sz.font_px) + 2 * u, 5 * u)
    return RecallSpec(box, Rect(box.x1 - m - bw, box.y0 + m, box.x1 - m, box.y1 - m))


def place_scene(rng: random.Random, width: int, height: int, scene: Scene) -> Placed:
    """A random layout for ``scene`` at this screen size (raises ``PlacementError`` when the
    drawn windows leave no room for a required icon; callers draw again)."""
    g = CellGrid(rng, width, height,
              dense_unit(width, height) if scene.dense else unit_for(width, height),
              jitter=scene.dense)
    # a dense scene's one extra draw comes first, and only for it: the other scenes' layouts
    # stay the draws they were
    sz = random_sizes(g.u, compact=scene.dense and rng.random() < COMPACT_SHARE)
    theme = random_theme(rng)
    launchers, menu, clock = _taskbar_items(g, sz, scene, random.Random(rng.getrandbits(64)))
    apps = dict.fromkeys((*WORKING_APPS, *scene.taskbar, *scene.desktop, *(scene.menu or ()),
                          *scene.windows))
    openings = tuple((a, g.window_rect(a)) for a in apps)
    where = dict(openings)
    windows = tuple(Window(a, where[a]) for a in scene.windows)
    icons = _desktop_icons(g, scene, [*(w.rect for w in windows),
                                      *(where[a] for a in scene.clear_of)])
    layout = Layout(width=width, height=height, sizes=sz, theme=theme, taskbar=g.taskbar,
                    clock=clock, launchers=(*launchers, *icons), menu=menu, openings=openings,
                    recall=recall_spec(g, sz) if scene.recall else None, keep_inside=True,
                    short_clock=True, jitter=scene.dense)
    return Placed(layout, windows)


def place_dialog(rng: random.Random, layout: Layout, title: str, message: str,
                 buttons: Sequence[tuple[str, str]], *, primary: str | None = None,
                 code: str = "", transient: bool = False, records: bool = True,
                 reopenable: bool = False) -> Dialog:
    """A dialog somewhere on the desktop, its ``(id, label)`` buttons in the given order, in
    a row (aligned left, centre, right or spread) or, for up to three, a centred column."""
    sz, desk = layout.sizes, layout.desktop
    u, pad = sz.unit, sz.pad
    bh, gap = sz.button_h, max(u // 2, 4)
    bws = [max(text_width(label, sz.font_px) + 2 * u, 5 * u) for _, label in buttons]
    column = len(buttons) <= 3 and rng.random() < 0.3
    row_w = sum(bws) + gap * (len(bws) - 1)
    need_w = max(text_width(message, sz.font_px), text_width(title, sz.font_px),
                 row_w if not column else max(bws)) + 2 * pad
    w = min(max(rng.randint(18, 26) * u, need_w + rng.randint(0, 2) * u), desk.width)
    code_h = sz.big_font_px + 2 * pad if code else 0
    body_h = (len(bws) * (bh + gap) - gap) if column else bh
    h = sz.title_h + 2 * pad + sz.font_px + code_h + pad + body_h + pad
    x0 = rng.randint(0, max((desk.width - w) // u, 0)) * u
    y0 = rng.randint(0, max((desk.height - h) // u, 0)) * u
    box = Rect(x0, y0, x0 + w, y0 + h)
    if layout.jitter:
        box = _jitter(rng, box, desk, u)
    top = box.y1 - pad - body_h
    rects: list[Rect] = []
    if column:
        width = max(bws)
        bx = box.x0 + (w - width) // 2
        rects = [Rect(bx, top + i * (bh + gap), bx + width, top + i * (bh + gap) + bh)
                 for i in range(len(bws))]
    else:
        align = rng.choice(("left", "center", "right", "spread"))
        spare = w - 2 * pad - row_w
        step_gap = gap + (spare // max(len(bws) - 1, 1) if align == "spread" else 0)
        x = box.x0 + pad + {"left": 0, "center": spare // 2, "right": spare,
                            "spread": 0 if len(bws) > 1 else spare // 2}[align]
        for bw in bws:
            rects.append(Rect(x, top, x + bw, top + bh))
            x += bw + step_gap
    return Dialog(title, message, box,
                  tuple(DialogButton(i, label, r, primary=i == primary)
                        for (i, label), r in zip(buttons, rects, strict=True)),
                  code=code, transient=transient, records=records, reopenable=reopenable)
