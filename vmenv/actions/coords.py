"""Coordinate conventions: how a model writes a screen position, and conversion to pixels.

* ``ABSOLUTE`` — pixels of the screenshot the model saw (OSWorld's PromptAgent, UI-TARS 1.5).
* ``RELATIVE_999`` — a 0–999 grid over each axis (Qwen3-VL): pixel = value / 1000 × size.
* ``RELATIVE_1`` — fractions 0–1 of each axis: pixel = value × size.

Every result is clamped into the screen (0..size-1): a model pointing one pixel past the
edge, or at 999.9 on the grid, still acts on the screen instead of failing in pyautogui.
"""

from __future__ import annotations

import enum
import math

from vmenv.actions.errors import InvalidActionError

Screen = tuple[int, int]
"""(width, height) in pixels."""


class CoordConvention(enum.Enum):
    """How a model writes coordinates."""

    ABSOLUTE = "absolute"
    RELATIVE_999 = "relative_999"
    RELATIVE_1 = "relative_1"

    @property
    def scale(self) -> float | None:
        """Model units per full axis, or None for absolute pixels."""
        return {"absolute": None, "relative_999": 1000.0, "relative_1": 1.0}[self.value]


def _check_screen(screen: Screen) -> None:
    w, h = screen
    if w < 1 or h < 1:
        raise InvalidActionError(f"screen size must be positive, got {screen}")


def _axis(value: float, size: int, convention: CoordConvention) -> int:
    if isinstance(value, bool) or not math.isfinite(value):
        raise InvalidActionError(f"coordinate {value!r} is not a finite number")
    scale = convention.scale
    pixel = value if scale is None else value / scale * size
    return min(max(round(pixel), 0), size - 1)


def to_screen(x: float, y: float, convention: CoordConvention, screen: Screen) -> tuple[int, int]:
    """Model coordinates → absolute pixels, clamped into ``screen``.

    Raises ``InvalidActionError`` for a non-finite coordinate or an empty screen.
    """
    _check_screen(screen)
    return _axis(x, screen[0], convention), _axis(y, screen[1], convention)


def from_screen(x: int, y: int, convention: CoordConvention,
                screen: Screen) -> tuple[float, float] | tuple[int, int]:
    """Absolute pixels → the convention's units (for prompts and recorded histories).

    RELATIVE_999 gives ints in 0..999, RELATIVE_1 floats rounded to 3 decimals, so that
    ``to_screen(from_screen(p))`` lands within one grid cell of ``p``.
    """
    _check_screen(screen)
    w, h = screen
    if convention is CoordConvention.ABSOLUTE:
        return x, y
    if convention is CoordConvention.RELATIVE_999:
        return min(round(x / w * 1000), 999), min(round(y / h * 1000), 999)
    return round(x / w, 3), round(y / h, 3)
