"""Draw a ``DeskState`` with Pillow and encode it as PNG.  CPU work: call it in a worker thread.

Deterministic: the picture is a pure function of the state (no clock, no randomness, fixed
PNG settings), so equal states give byte-identical PNGs on one Pillow build.  The taskbar
shows a step counter and a clock derived from ``state.step``, so consecutive screenshots
differ even when an action changed nothing else.
"""

from __future__ import annotations

import functools
import io

from PIL import Image, ImageDraw, ImageFont

from vmenv.simdesk import geometry as geo
from vmenv.simdesk.geometry import Metrics, Rect
from vmenv.simdesk.state import DeskState, Window

Color = tuple[int, int, int]
DESKTOP: Color = (46, 84, 126)
TASKBAR: Color = (28, 28, 34)
FRAME: Color = (90, 90, 100)
TITLE_ACTIVE: Color = (52, 101, 164)
TITLE_INACTIVE: Color = (140, 140, 150)
CLOSE: Color = (204, 64, 64)
WHITE: Color = (255, 255, 255)
BLACK: Color = (0, 0, 0)
PAPER: Color = (246, 246, 242)
FOCUS: Color = (40, 120, 240)
BUTTON: Color = (222, 222, 222)
TERM_BG: Color = (18, 18, 18)
TERM_FG: Color = (210, 210, 210)
#: The clock starts at 09:00:00 and each step takes this many (simulated) seconds.
SECONDS_PER_STEP = 7


@functools.cache
def _font(px: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=px)


class _Painter:
    def __init__(self, img: Image.Image, m: Metrics) -> None:
        self.d = ImageDraw.Draw(img)
        self.m = m
        self.font = _font(m.font_px)

    def rect(self, r: Rect, fill: Color, outline: Color | None = None, width: int = 1) -> None:
        self.d.rectangle(r.box, fill=fill, outline=outline, width=width)

    def text(self, x: int, y: int, s: str, fill: Color, max_w: int | None = None,
             keep_tail: bool = False) -> int:
        """Draw ``s`` (cut to ``max_w`` pixels, keeping its tail if asked); returns its width."""
        if max_w is not None:
            while s and self.d.textlength(s, font=self.font) > max_w:
                s = s[1:] if keep_tail else s[:-1]
        self.d.text((x, y), s, fill=fill, font=self.font)
        return int(self.d.textlength(s, font=self.font))

    def centered(self, r: Rect, s: str, fill: Color) -> None:
        self.d.text(r.center, s, fill=fill, font=self.font, anchor="mm")


def _taskbar(p: _Painter, state: DeskState) -> None:
    m = p.m
    p.rect(geo.taskbar(m), TASKBAR)
    for app in geo.APPS:
        r = geo.icon(m, app)
        if app == "terminal":
            p.rect(r, TERM_BG, outline=(120, 120, 120))
            p.centered(r, ">_", (80, 220, 100))
        else:
            p.rect(r, (250, 214, 90), outline=(180, 150, 40))
            for i in range(3):
                y = r.y0 + (i + 1) * r.height // 4
                p.d.line((r.x0 + 5, y, r.x1 - 6, y), fill=(150, 120, 30))
        if state.is_open(app):  # running-app indicator under the icon
            cx = r.center[0]
            p.d.rectangle((cx - 4, r.y1 + 1, cx + 4, r.y1 + 2), fill=WHITE)
    secs = 9 * 3600 + state.step * SECONDS_PER_STEP
    clock = f"step {state.step}   {secs // 3600 % 24:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
    c = geo.clock(m)
    p.text(c.x0, c.y0 + (c.height - m.font_px) // 2, clock, WHITE)


def _window(p: _Painter, state: DeskState, win: Window) -> None:
    m, r = p.m, win.rect
    active = win is state.top and state.dialog is None
    p.rect(r, PAPER, outline=FRAME)
    bar = geo.title_bar(m, r)
    p.rect(bar, TITLE_ACTIVE if active else TITLE_INACTIVE)
    p.text(bar.x0 + m.pad, bar.y0 + (bar.height - m.font_px) // 2, geo.APP_TITLES[win.app],
           WHITE, max_w=bar.width - 3 * m.title_h)
    x = geo.close_button(m, r)
    p.rect(x, CLOSE)
    i = x.inset(max(x.width // 4, 2))
    p.d.line((i.x0, i.y0, i.x1 - 1, i.y1 - 1), fill=WHITE, width=2)
    p.d.line((i.x0, i.y1 - 1, i.x1 - 1, i.y0), fill=WHITE, width=2)
    if win.app == "notes":
        _notes(p, state, r)
    else:
        _terminal(p, state, r)


def _caret(p: _Painter, x: int, r: Rect, color: Color) -> None:
    p.d.line((x + 2, r.y0 + 4, x + 2, r.y1 - 5), fill=color, width=2)


def _notes(p: _Painter, state: DeskState, r: Rect) -> None:
    m = p.m
    c = geo.client(m, r)
    p.text(c.x0 + m.pad, c.y0 + m.pad // 2 + m.unit // 2, "Note:", BLACK)
    f = geo.notes_field(m, r)
    focused = state.focus == "notes"
    p.rect(f, WHITE, outline=FOCUS if focused else (130, 130, 130), width=2 if focused else 1)
    inner = f.width - 2 * m.pad // 2 - 6
    w = p.text(f.x0 + m.pad // 2, f.y0 + (f.height - m.font_px) // 2, state.notes.text, BLACK,
               max_w=inner, keep_tail=True)
    if focused:
        _caret(p, f.x0 + m.pad // 2 + w, f, BLACK)
    s = geo.notes_save(m, r)
    p.rect(s, BUTTON, outline=(120, 120, 120))
    p.centered(s, "Save", BLACK)
    if state.notes.saved:
        p.text(c.x0 + m.pad, s.y0 + (s.height - m.font_px) // 2,
               f"Saved: {state.notes.saved[-1]}", (40, 110, 40), max_w=s.x0 - c.x0 - 2 * m.pad)


def _terminal(p: _Painter, state: DeskState, r: Rect) -> None:
    m = p.m
    c = geo.client(m, r)
    p.rect(c, TERM_BG)
    line_h = m.font_px + m.font_px // 4
    n_rows = max((c.height - m.pad) // line_h, 1)
    rows = [*state.terminal.lines, f"$ {state.terminal.command}"][-n_rows:]
    for i, row in enumerate(rows):
        y = c.y0 + m.pad // 2 + i * line_h
        w = p.text(c.x0 + m.pad // 2, y, row, TERM_FG, max_w=c.width - m.pad, keep_tail=True)
        if i == len(rows) - 1 and state.focus == "terminal":  # block cursor
            x0 = c.x0 + m.pad // 2 + w + 2
            p.d.rectangle((x0, y, x0 + m.font_px // 2, y + m.font_px), fill=TERM_FG)


def _dialog(p: _Painter, state: DeskState) -> None:
    assert state.dialog is not None
    m = p.m
    box = geo.dialog(m)
    p.rect(box.moved(4, 4), (20, 20, 20))  # shadow
    p.rect(box, (236, 236, 236), outline=FRAME)
    bar = Rect(box.x0, box.y0, box.x1, box.y0 + m.title_h)
    p.rect(bar, TITLE_ACTIVE)
    p.text(bar.x0 + m.pad, bar.y0 + (bar.height - m.font_px) // 2, state.dialog.title, WHITE,
           max_w=bar.width - 2 * m.pad)
    p.text(box.x0 + m.pad, bar.y1 + m.pad, state.dialog.message, BLACK,
           max_w=box.width - 2 * m.pad)
    ok, cancel = geo.dialog_button(m, box, "ok"), geo.dialog_button(m, box, "cancel")
    p.rect(ok, TITLE_ACTIVE, outline=(30, 60, 120))
    p.centered(ok, "OK", WHITE)
    p.rect(cancel, BUTTON, outline=(120, 120, 120))
    p.centered(cancel, "Cancel", BLACK)


def _pointer(p: _Painter, x: int, y: int) -> None:
    s = p.m.unit
    arrow = [(x, y), (x, y + s), (x + s * 5 // 16, y + s * 12 // 16),
             (x + s * 11 // 16, y + s * 11 // 16)]
    p.d.polygon(arrow, fill=WHITE, outline=BLACK)


def render(state: DeskState) -> Image.Image:
    """The screen as an RGB image."""
    m = state.metrics
    img = Image.new("RGB", (m.width, m.height), DESKTOP)
    p = _Painter(img, m)
    for win in state.windows:
        _window(p, state, win)
    if state.dialog is not None:
        _dialog(p, state)
    _taskbar(p, state)
    _pointer(p, *state.pointer)
    return img


def render_png(state: DeskState) -> bytes:
    """The screen as PNG bytes (fixed encoder settings: same state, same bytes)."""
    buf = io.BytesIO()
    render(state).save(buf, format="PNG", compress_level=1)
    return buf.getvalue()
