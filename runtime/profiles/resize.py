"""The image size a Qwen2-VL-family vision encoder works at ("smart resize").

UI-TARS 1.5 (on Qwen2.5-VL) writes absolute coordinates in the pixels of the image it was
given, and its processor first resizes every screenshot so that both sides are multiples of
the patch-merge unit (28 px), the pixel count lies within [min_pixels, max_pixels], and the
aspect ratio is kept as well as those allow.  To map the model's points back onto the screen
kvagent needs that size; this is our own implementation of the rule as published with the
models (round each side to the unit; if the area is too large, shrink both sides by the same
factor rounding down to the unit; if too small, grow them rounding up).
"""

from __future__ import annotations

import math

from vmenv.actions.coords import Screen

#: The patch-merge unit of Qwen2-VL / Qwen2.5-VL: 14 px patches merged 2x2.
UNIT = 28
#: UI-TARS' processor bounds (in units of UNIT^2): 100 .. 16384 merged patches.
MIN_PIXELS = 100 * UNIT * UNIT
MAX_PIXELS = 16384 * UNIT * UNIT


def smart_resize(screen: Screen, *, unit: int = UNIT, min_pixels: int = MIN_PIXELS,
                 max_pixels: int = MAX_PIXELS) -> Screen:
    """(width, height) the encoder sees for a ``screen``-sized screenshot."""
    w, h = screen
    if w < 1 or h < 1:
        raise ValueError(f"image size must be positive, got {screen}")
    if max(w, h) / min(w, h) > 200:
        raise ValueError(f"aspect ratio of {screen} exceeds 200")
    rw = max(unit, round(w / unit) * unit)
    rh = max(unit, round(h / unit) * unit)
    if rw * rh > max_pixels:
        shrink = math.sqrt(w * h / max_pixels)
        rw = max(unit, math.floor(w / shrink / unit) * unit)
        rh = max(unit, math.floor(h / shrink / unit) * unit)
    elif rw * rh < min_pixels:
        grow = math.sqrt(min_pixels / (w * h))
        rw = math.ceil(w * grow / unit) * unit
        rh = math.ceil(h * grow / unit) * unit
    return rw, rh
