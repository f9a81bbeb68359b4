"""Coordinate conventions: how a model writes a screen position, and conversion to pixels.

* ``ABSOLUTE`` — pixels of the image the model saw (OSWorld's PromptAgent, UI-TARS 1.5).
  That image is the screenshot itself unless ``image`` names the size it was resized to
  (UI-TARS 1.5 answers in the pixels of its smart-resized input).
* ``RELATIVE_999`` — a 0–999 grid over each axis (Qwen3-VL): pixel = value / 1000 × size.
* ``RELATIVE_1`` — fractions 0–1 of each axis: pixel = value × size.

A point outside the screen (a model pointing one pixel past the edge, or at 999.9 on the grid)
is clamped onto it, and ``place`` says so.  With a ``margin`` (the agent profiles use
``CLAMP_MARGIN``), a point farther than that fraction of an axis outside is rejected instead:
the model meant something else (typically it wrote pixels where a grid value was asked for),
and clicking the screen's edge would act on the wrong thing.  Without one every point is
clamped: an unbounded grammar (absolute pixels up to 9999 whatever the screen) must still
always yield an action.
"""

from __future__ import annotations

import enum
import math
import re

import attrs

from vmenv.actions.errors import InvalidActionError

Screen = tuple[int, int]

_WXH = re.compile(r"\s*(\d{1,6})\s*[xX]\s*(\d{1,6})\s*")


def parse_wxh(text: str, *, option: str, low: Screen = (1, 1),
              high: Screen = (16384, 16384)) -> Screen:
    """'1280x720' (spaces and a capital X allowed) → (1280, 720), each side within
    ``low``..``high``; ValueError naming ``option`` otherwise.  The one WxH parser: every
    command's sizes (``runtime.arg_parsers``) and the VM stand-in's come through here."""
    m = _WXH.fullmatch(text)
    if m is not None:
        w, h = int(m[1]), int(m[2])
        if low[0] <= w <= high[0] and low[1] <= h <= high[1]:
            return w, h
    raise ValueError(f"{option} {text!r}: give WxH between {low[0]}x{low[1]} and "
                     f"{high[0]}x{high[1]}")
"""(width, height) in pixels."""

#: How far past an edge, as a fraction of that axis, the profiles still clamp a point.
CLAMP_MARGIN = 0.1


class CoordConvention(enum.Enum):
    """How a model writes coordinates."""

    ABSOLUTE = "absolute"
    RELATIVE_999 = "relative_999"
    RELATIVE_1 = "relative_1"

    @property
    def scale(self) -> float | None:
        """Model units per full axis, or None for absolute pixels."""
        return {"absolute": None, "relative_999": 1000.0, "relative_1": 1.0}[self.value]


@attrs.frozen
class Placed:
    """A model point as screen pixels; ``clamped``: it lay outside and was moved onto the edge."""

    x: int
    y: int
    clamped: bool


def _check_screen(screen: Screen, what: str = "screen") -> None:
    w, h = screen
    if w < 1 or h < 1:
        raise InvalidActionError(f"{what} size must be positive, got {screen}")


def _pixel(value: float, size: int, units: int | None, convention: CoordConvention) -> float:
    """One axis in screen pixels (unrounded).  ``units``: the image's size on this axis."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidActionError(f"coordinate {value!r} is not a number")
    try:
        v = float(value)  # a 400-digit int overflows here rather than in the arithmetic
    except OverflowError:
        raise InvalidActionError("coordinate is too large") from None
    if not math.isfinite(v):
        raise InvalidActionError(f"coordinate {value!r} is not a finite number")
    scale = convention.scale
    if scale is None:
        pixel = v if units is None else v / units * size
    else:
        pixel = v / scale * size
    if not math.isfinite(pixel):  # a finite number scaled past the largest float
        raise InvalidActionError(f"coordinate {value!r} is too large")
    return pixel


def _axis(value: float, size: int, units: int | None, convention: CoordConvention,
          margin: float | None) -> tuple[int, bool]:
    pixel = _pixel(value, size, units, convention)
    if margin is not None and not -margin * size <= pixel <= size - 1 + margin * size:
        raise InvalidActionError(
            f"coordinate {value!r} lies more than {margin:.0%} outside the screen")
    rounded = round(pixel)
    clamped = min(max(rounded, 0), size - 1)
    return clamped, clamped != rounded


def place(x: float, y: float, convention: CoordConvention, screen: Screen, *,
          image: Screen | None = None, margin: float | None = None) -> Placed:
    """Model coordinates → absolute pixels of ``screen``, clamped or rejected (see the module).

    ``image``: for ``ABSOLUTE``, the size of the (resized) image whose pixels the model wrote;
    None means the screen itself.  ``margin``: reject points farther outside than this
    fraction of an axis (None: clamp them all).  Raises ``InvalidActionError`` for a
    non-finite coordinate, a rejected point, or an empty screen.
    """
    _check_screen(screen)
    units = _image_units(convention, image)
    px, cx = _axis(x, screen[0], units and units[0], convention, margin)
    py, cy = _axis(y, screen[1], units and units[1], convention, margin)
    return Placed(px, py, cx or cy)


def to_screen(x: float, y: float, convention: CoordConvention, screen: Screen, *,
              image: Screen | None = None) -> tuple[int, int]:
    """``place`` without the clamping flag: (x, y) in pixels of ``screen``."""
    p = place(x, y, convention, screen, image=image)
    return p.x, p.y


def _image_units(convention: CoordConvention, image: Screen | None) -> Screen | None:
    if image is None:
        return None
    if convention is not CoordConvention.ABSOLUTE:
        raise InvalidActionError("an image size only applies to absolute coordinates")
    _check_screen(image, "image")
    return image


def from_screen(x: int, y: int, convention: CoordConvention, screen: Screen, *,
                image: Screen | None = None) -> tuple[float, float] | tuple[int, int]:
    """Absolute pixels → the convention's units (for prompts and recorded histories).

    RELATIVE_999 gives ints in 0..999, RELATIVE_1 floats rounded to 3 decimals, ABSOLUTE with
    ``image`` ints in that image's pixels, so that ``to_screen(from_screen(p))`` lands within
    one grid cell (or resized pixel) of ``p``.
    """
    _check_screen(screen)
    w, h = screen
    units = _image_units(convention, image)
    if convention is CoordConvention.ABSOLUTE:
        if units is None:
            return x, y
        iw, ih = units
        return min(round(x / w * iw), iw - 1), min(round(y / h * ih), ih - 1)
    if convention is CoordConvention.RELATIVE_999:
        return min(round(x / w * 1000), 999), min(round(y / h * 1000), 999)
    return round(x / w, 3), round(y / h, 3)
