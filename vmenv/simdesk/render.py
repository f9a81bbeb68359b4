"""Draw a ``DeskState`` with Pillow and encode it as PNG.  CPU work: call it in a worker thread.

Deterministic: the picture is a pure function of the state (no clock, no randomness, fixed
PNG settings), so equal states give byte-identical PNGs on one Pillow build.  The taskbar
shows a clock derived from ``state.step`` (and, in the classic layout, the step counter), so
consecutive screenshots differ even when an action changed nothing else — unless the clock
stands still (``clock_step_s=0``, a desktop whose clock does not visibly move during an
episode, as an hours-and-minutes clock): then a step that changed nothing shows the same
pixels (on the random layouts; the classic layout's step counter still advances).

The first screen of ``marked-launch`` marks one app's launchers (``DeskState.mark``): each is
drawn on a ``MARK``-coloured plate (a colour no theme, glyph or window uses; a taskbar tile's
glyph shrunk to show it), so every cell of the launcher shows it.

Layers, bottom to top (the reverse of ``widgets``' hit order): desktop icons, windows, the
taskbar, the notification of a dismissed dialog, the launcher menu, the dialog, the pointer.
Every position and colour comes from the state's ``Layout``.
"""

from __future__ import annotations

import io

from PIL import Image

from vmenv.simdesk import geometry as geo
from vmenv.simdesk.apps import APPS
from vmenv.simdesk.geometry import Rect
from vmenv.simdesk.layout import Launcher, Theme
from vmenv.simdesk.paint import BLACK, TERM_BG, TERM_FG, WHITE, Color, Painter
from vmenv.simdesk.state import DeskState, Window

#: The clock starts at 09:00:00 and each step takes this many (simulated) seconds.
SECONDS_PER_STEP = 7
#: The plate under a marked launcher.
MARK: Color = (255, 0, 255)


def _shade(c: Color, d: int) -> Color:
    return (min(max(c[0] + d, 0), 255), min(max(c[1] + d, 0), 255), min(max(c[2] + d, 0), 255))


def _launcher(p: Painter, state: DeskState, x: Launcher) -> None:
    r, t, sz = x.rect, state.layout.theme, p.sz
    title = APPS[x.app].title if x.app in APPS else x.app
    marked = state.mark == x.app
    if marked:
        p.rect(r, MARK)
    if x.style == "tile":
        p.glyph(r.inset(r.width // 4) if marked else r, x.app)
    elif x.style == "button":
        p.rect(r, MARK if marked else _shade(t.taskbar, 28), outline=_shade(t.taskbar, 60))
        g = r.height - 2 * max(sz.unit // 4, 2)
        gy = r.y0 + (r.height - g) // 2
        p.glyph(Rect(r.x0 + gy - r.y0, gy, r.x0 + gy - r.y0 + g, gy + g), x.app)
        tx = r.x0 + (gy - r.y0) * 2 + g
        p.text(tx, r.y0 + (r.height - sz.font_px) // 2, title, t.taskbar_text, max_w=r.x1 - tx)
    else:
        top = sz.unit // 3
        g = min(r.height - sz.font_px - 2 * top - sz.unit // 3, r.width - sz.unit)
        gx = r.x0 + (r.width - g) // 2
        p.glyph(Rect(gx, r.y0 + top, gx + g, r.y0 + top + g), x.app)
        label = Rect(r.x0, r.y0 + top + g, r.x1, r.y1)
        p.centered(label, title, t.icon_label, stroke=BLACK)
    if x.style != "desktop" and state.is_open(x.app):  # running-app indicator
        cx = r.center[0]
        p.d.rectangle((cx - 4, r.y1 + 1, cx + 4, r.y1 + 2), fill=WHITE)


def _clock_text(state: DeskState, clock_step_s: int) -> str:
    secs = 9 * 3600 + state.step * clock_step_s
    hms = f"{secs // 3600 % 24:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
    return hms if state.layout.short_clock else f"step {state.step}   {hms}"


def _taskbar(p: Painter, state: DeskState, clock_step_s: int) -> None:
    lay, sz = state.layout, p.sz
    p.rect(lay.taskbar, lay.theme.taskbar)
    for x in lay.launchers:
        if x.style != "desktop":
            _launcher(p, state, x)
    if lay.menu is not None:
        b = lay.menu.button
        p.rect(b, lay.theme.primary if state.menu_open else _shade(lay.theme.taskbar, 40),
               outline=_shade(lay.theme.taskbar, 80))
        p.centered(b, lay.menu.label, lay.theme.primary_text if state.menu_open else WHITE)
    c = lay.clock
    if lay.short_clock:
        p.centered(c, _clock_text(state, clock_step_s), lay.theme.taskbar_text)
    else:
        p.text(c.x0, c.y0 + (c.height - sz.font_px) // 2, _clock_text(state, clock_step_s),
               WHITE)


def _window(p: Painter, state: DeskState, win: Window) -> None:
    sz, r, t = p.sz, win.rect, state.layout.theme
    active = win is state.top and state.dialog is None
    p.rect(r, t.paper, outline=t.frame)
    bar = geo.title_bar(sz, r)
    p.rect(bar, t.title_active if active else t.title_inactive)
    title = APPS[win.app].title if win.app in APPS else win.app
    x = geo.close_button(sz, r)
    p.text(bar.x0 + sz.pad, bar.y0 + (bar.height - sz.font_px) // 2, title,
           t.title_text, max_w=x.x0 - bar.x0 - 2 * sz.pad)
    p.rect(x, t.close)
    i = x.inset(max(x.width // 4, 2))
    p.d.line((i.x0, i.y0, i.x1 - 1, i.y1 - 1), fill=WHITE, width=2)
    p.d.line((i.x0, i.y1 - 1, i.x1 - 1, i.y0), fill=WHITE, width=2)
    if win.app == "notes":
        _notes(p, state, r, t)
    elif win.app == "terminal":
        _terminal(p, state, r)
    else:
        _decoy(p, win, t)


def _caret(p: Painter, x: int, r: Rect, color: Color) -> None:
    p.d.line((x + 2, r.y0 + 4, x + 2, r.y1 - 5), fill=color, width=2)


def _notes(p: Painter, state: DeskState, r: Rect, t: Theme) -> None:
    sz = p.sz
    c = geo.client(sz, r)
    if sz.label_h:
        p.text(c.x0 + sz.pad, c.y0 + sz.pad // 2 + sz.unit // 2, "Note:", t.ink)
    f = geo.notes_field(sz, r)
    focused = state.focus == "notes"
    p.rect(f, WHITE, outline=t.focus if focused else (130, 130, 130), width=2 if focused else 1)
    inner = f.width - 2 * sz.pad // 2 - 6
    w = p.text(f.x0 + sz.pad // 2, f.y0 + (f.height - sz.font_px) // 2, state.notes.text, BLACK,
               max_w=inner, keep_tail=True)
    if focused:
        _caret(p, f.x0 + sz.pad // 2 + w, f, BLACK)
    s = geo.notes_save(sz, r)
    p.rect(s, t.button, outline=(120, 120, 120))
    p.centered(s, "Save", BLACK)
    if state.notes.saved:
        p.text(c.x0 + sz.pad, s.y0 + (s.height - sz.font_px) // 2,
               f"Saved: {state.notes.saved[-1]}", (40, 110, 40), max_w=s.x0 - c.x0 - 2 * sz.pad)


def _terminal(p: Painter, state: DeskState, r: Rect) -> None:
    sz = p.sz
    c = geo.client(sz, r)
    p.rect(c, TERM_BG)
    line_h = sz.font_px + sz.font_px // 4
    n_rows = max((c.height - sz.pad) // line_h, 1)
    rows = [*state.terminal.lines, f"$ {state.terminal.command}"][-n_rows:]
    for i, row in enumerate(rows):
        y = c.y0 + sz.pad // 2 + i * line_h
        w = p.text(c.x0 + sz.pad // 2, y, row, TERM_FG, max_w=c.width - sz.pad, keep_tail=True)
        if i == len(rows) - 1 and state.focus == "terminal":  # block cursor
            x0 = c.x0 + sz.pad // 2 + w + 2
            p.d.rectangle((x0, y, x0 + sz.font_px // 2, y + sz.font_px), fill=TERM_FG)


def _decoy(p: Painter, win: Window, t: Theme) -> None:
    sz = p.sz
    c = geo.client(sz, win.rect)
    spec = APPS.get(win.app)
    for i, line in enumerate(spec.body if spec else ()):
        p.text(c.x0 + sz.pad, c.y0 + sz.pad + i * (sz.font_px + sz.pad), line, t.ink,
               max_w=c.width - 2 * sz.pad)


def _recall(p: Painter, state: DeskState) -> None:
    spec, t, sz = state.layout.recall, state.layout.theme, p.sz
    assert spec is not None and state.recall is not None
    p.rect(spec.box, t.dialog, outline=t.frame, width=2)
    box = spec.box
    p.text(box.x0 + sz.pad, box.y0 + (box.height - sz.font_px) // 2,
           f"{state.recall.title}: closed", t.ink, max_w=spec.button.x0 - box.x0 - 2 * sz.pad)
    p.rect(spec.button, t.primary, outline=t.frame)
    p.centered(spec.button, "Reopen", t.primary_text)


def _menu(p: Painter, state: DeskState) -> None:
    menu, t, sz = state.layout.menu, state.layout.theme, p.sz
    assert menu is not None
    p.rect(menu.panel.moved(3, 3), (20, 20, 20))  # shadow
    p.rect(menu.panel, t.menu, outline=t.frame, width=2)
    for app, r in menu.entries:
        p.rect(r, _shade(t.menu, -12), outline=_shade(t.menu, -40))
        g = r.height - 2 * max(sz.unit // 4, 2)
        gy = r.y0 + (r.height - g) // 2
        p.glyph(Rect(r.x0 + sz.pad, gy, r.x0 + sz.pad + g, gy + g), app)
        tx = r.x0 + 2 * sz.pad + g
        title = APPS[app].title if app in APPS else app
        p.text(tx, r.y0 + (r.height - sz.font_px) // 2, title, t.ink, max_w=r.x1 - tx)


def _dialog(p: Painter, state: DeskState) -> None:
    d, t, sz = state.dialog, state.layout.theme, p.sz
    assert d is not None
    box = d.rect
    p.rect(box.moved(4, 4), (20, 20, 20))  # shadow
    p.rect(box, t.dialog, outline=t.frame)
    bar = Rect(box.x0, box.y0, box.x1, box.y0 + sz.title_h)
    p.rect(bar, t.title_active)
    p.text(bar.x0 + sz.pad, bar.y0 + (bar.height - sz.font_px) // 2, d.title, t.title_text,
           max_w=bar.width - 2 * sz.pad)
    p.text(box.x0 + sz.pad, bar.y1 + sz.pad, d.message, t.ink, max_w=box.width - 2 * sz.pad)
    if d.code:
        top = bar.y1 + 2 * sz.pad + sz.font_px
        bottom = min(b.rect.y0 for b in d.buttons) if d.buttons else box.y1
        p.centered(Rect(box.x0, top, box.x1, max(bottom, top + 1)), d.code, t.ink,
                   px=sz.big_font_px)
    for b in d.buttons:
        if b.primary:
            p.rect(b.rect, t.primary, outline=(30, 60, 120))
            p.centered(b.rect, b.label, t.primary_text)
        else:
            p.rect(b.rect, t.button, outline=(120, 120, 120))
            p.centered(b.rect, b.label, BLACK)


def _pointer(p: Painter, x: int, y: int) -> None:
    s = p.sz.unit
    arrow = [(x, y), (x, y + s), (x + s * 5 // 16, y + s * 12 // 16),
             (x + s * 11 // 16, y + s * 11 // 16)]
    p.d.polygon(arrow, fill=WHITE, outline=BLACK)


def render(state: DeskState, *, clock_step_s: int = SECONDS_PER_STEP) -> Image.Image:
    """The screen as an RGB image; the clock advances ``clock_step_s`` a step."""
    lay = state.layout
    img = Image.new("RGB", (lay.width, lay.height), lay.theme.desktop)
    p = Painter(img, lay.sizes)
    for x in lay.launchers:
        if x.style == "desktop":
            _launcher(p, state, x)
    for win in state.windows:
        _window(p, state, win)
    _taskbar(p, state, clock_step_s)
    if state.recall is not None and lay.recall is not None:
        _recall(p, state)
    if state.menu_open and lay.menu is not None:
        _menu(p, state)
    if state.dialog is not None:
        _dialog(p, state)
    _pointer(p, *state.pointer)
    return img


def render_png(state: DeskState, *, clock_step_s: int = SECONDS_PER_STEP) -> bytes:
    """The screen as PNG bytes (fixed encoder settings: same state, same bytes)."""
    buf = io.BytesIO()
    render(state, clock_step_s=clock_step_s).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()
