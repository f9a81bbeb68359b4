"""Drawing primitives for ``render``: fonts, rectangles, text that fits, app glyphs.

Pure drawing on a Pillow image; no state.  Text is Pillow's built-in scalable font at the
layout's sizes, so one Pillow build draws the same pixels for the same calls.
"""

from __future__ import annotations

import functools

from PIL import Image, ImageDraw, ImageFont

from vmenv.simdesk.apps import APPS
from vmenv.simdesk.geometry import Rect, Sizes

Color = tuple[int, int, int]
WHITE: Color = (255, 255, 255)
BLACK: Color = (0, 0, 0)
TERM_BG: Color = (18, 18, 18)
TERM_FG: Color = (210, 210, 210)
Font = ImageFont.FreeTypeFont | ImageFont.ImageFont


@functools.cache
def font(px: int) -> Font:
    return ImageFont.load_default(size=px)


def text_width(s: str, px: int) -> int:
    """How wide ``s`` is drawn at ``px`` pixels (layouts size buttons with it)."""
    return int(font(px).getlength(s))


class Painter:
    def __init__(self, img: Image.Image, sizes: Sizes) -> None:
        self.d = ImageDraw.Draw(img)
        self.sz = sizes
        self.font = font(sizes.font_px)

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

    def centered(self, r: Rect, s: str, fill: Color, px: int | None = None,
                 stroke: Color | None = None) -> None:
        f = self.font if px is None else font(px)
        self.d.text(r.center, s, fill=fill, font=f, anchor="mm",
                    stroke_width=1 if stroke else 0, stroke_fill=stroke)

    def glyph(self, r: Rect, app: str) -> None:
        """``app``'s icon filling the square ``r`` (the classic tiles for terminal and notes)."""
        if app == "terminal":
            self.rect(r, TERM_BG, outline=(120, 120, 120))
            self.centered(r, ">_", (80, 220, 100), px=self._glyph_px(r))
        elif app == "notes":
            self.rect(r, (250, 214, 90), outline=(180, 150, 40))
            for i in range(3):
                y = r.y0 + (i + 1) * r.height // 4
                self.d.line((r.x0 + 5, y, r.x1 - 6, y), fill=(150, 120, 30))
        else:
            spec = APPS.get(app)
            tile, ink, mark = (spec.tile, spec.ink, spec.glyph) if spec else (WHITE, BLACK, "?")
            self.d.rounded_rectangle(r.box, radius=max(r.width // 6, 2), fill=tile,
                                     outline=(120, 120, 120))
            self.centered(r, mark, ink, px=self._glyph_px(r))

    def _glyph_px(self, r: Rect) -> int:
        # the classic taskbar tiles use the layout font; bigger icons get a bigger mark
        return max(self.sz.font_px, r.height * 2 // 5)
