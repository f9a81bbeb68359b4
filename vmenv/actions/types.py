"""Structured actions: what a parsed model output means, as immutable records.

Coordinates in these records are ABSOLUTE screen pixels (the parser converts model
coordinates with ``coords.to_screen``), so every consumer — the pyautogui code generator, the
simulated desktop, the prompt history — works in one convention.

Model output is data: nothing here holds or forwards raw model text except ``NoOp.raw``,
which is kept for logs and never executed.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import attrs

from vmenv.actions.errors import InvalidActionError
from vmenv.actions.keys import normalize_key

MouseButton = Literal["left", "right", "middle"]

#: Upper bound on one coordinate: far beyond any screen, small enough to catch garbage.
MAX_COORD = 100_000
#: Upper bound on a typed text (a model's one-step output, not a document).
MAX_TEXT_CHARS = 4_000
#: Upper bound on scroll clicks per axis and on a wait.
MAX_SCROLL = 10_000
MAX_WAIT_S = 600.0


def _coord(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidActionError(f"{attr.name} must be an int, got {value!r}")
    if not 0 <= value <= MAX_COORD:
        raise InvalidActionError(f"{attr.name}={value} outside 0..{MAX_COORD}")


def _opt_coord(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _coord(inst, attr, value)


def _scroll_amount(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidActionError(f"{attr.name} must be an int, got {value!r}")
    if abs(value) > MAX_SCROLL:
        raise InvalidActionError(f"{attr.name}={value} outside ±{MAX_SCROLL}")


def _one_of(*allowed: Any) -> Any:
    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        # `type(value) is` keeps True from passing as 1
        if not any(type(value) is type(a) and value == a for a in allowed):
            raise InvalidActionError(f"{attr.name} must be one of {allowed}, got {value!r}")
    return check


def _key(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidActionError(f"a key name must be a string, got {value!r}")
    return normalize_key(value)


def _keys(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not hasattr(value, "__iter__"):
        raise InvalidActionError(f"hotkey keys must be a sequence of names, got {value!r}")
    return tuple(_key(k) for k in value)


@attrs.frozen
class Click:
    """Press and release ``button`` ``clicks`` times at (x, y) (3: a triple click, which
    selects a line or paragraph in most toolkits)."""

    kind: ClassVar[str] = "click"
    x: int = attrs.field(validator=_coord)
    y: int = attrs.field(validator=_coord)
    button: MouseButton = attrs.field(default="left", validator=_one_of("left", "right", "middle"))
    clicks: Literal[1, 2, 3] = attrs.field(default=1, validator=_one_of(1, 2, 3))


@attrs.frozen
class MoveTo:
    """Move the pointer to (x, y) without clicking."""

    kind: ClassVar[str] = "move_to"
    x: int = attrs.field(validator=_coord)
    y: int = attrs.field(validator=_coord)


@attrs.frozen
class DragTo:
    """Press the left button at (x0, y0), move to (x1, y1), release."""

    kind: ClassVar[str] = "drag"
    x0: int = attrs.field(validator=_coord)
    y0: int = attrs.field(validator=_coord)
    x1: int = attrs.field(validator=_coord)
    y1: int = attrs.field(validator=_coord)


@attrs.frozen
class TypeText:
    """Type ``text`` into whatever has keyboard focus ("\\n" presses enter)."""

    kind: ClassVar[str] = "type"
    text: str = attrs.field()

    @text.validator
    def _check(self, _attr: attrs.Attribute[Any], value: str) -> None:
        if not isinstance(value, str):
            raise InvalidActionError(f"text must be a string, got {value!r}")
        if not 1 <= len(value) <= MAX_TEXT_CHARS:
            raise InvalidActionError(f"text length {len(value)} outside 1..{MAX_TEXT_CHARS}")


@attrs.frozen
class Hotkey:
    """Press ``keys`` in order, release in reverse (a chord such as ctrl+c)."""

    kind: ClassVar[str] = "hotkey"
    keys: tuple[str, ...] = attrs.field(converter=_keys)

    @keys.validator
    def _check(self, _attr: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
        if not 1 <= len(value) <= 4:
            raise InvalidActionError(f"a hotkey needs 1..4 keys, got {len(value)}")


@attrs.frozen
class Press:
    """Press and release one key."""

    kind: ClassVar[str] = "press"
    key: str = attrs.field(converter=_key)


@attrs.frozen
class Scroll:
    """Scroll ``dx`` clicks right (negative: left) and ``dy`` up (negative: down), as pyautogui.

    With (x, y) the pointer moves there first; without, it scrolls where the pointer is.
    """

    kind: ClassVar[str] = "scroll"
    dx: int = attrs.field(validator=_scroll_amount)
    dy: int = attrs.field(validator=_scroll_amount)
    x: int | None = attrs.field(default=None, validator=_opt_coord)
    y: int | None = attrs.field(default=None, validator=_opt_coord)

    def __attrs_post_init__(self) -> None:
        if (self.x is None) != (self.y is None):
            raise InvalidActionError("scroll needs both x and y, or neither")


@attrs.frozen
class Wait:
    """Do nothing for ``seconds`` (the VM keeps running)."""

    kind: ClassVar[str] = "wait"
    seconds: float = attrs.field(default=1.0)

    @seconds.validator
    def _check(self, _attr: attrs.Attribute[Any], value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidActionError(f"seconds must be a number, got {value!r}")
        if not (math.isfinite(value) and 0.0 <= value <= MAX_WAIT_S):
            raise InvalidActionError(f"wait of {value} s outside 0..{MAX_WAIT_S}")


@attrs.frozen
class Done:
    """The agent believes the task is complete."""

    kind: ClassVar[str] = "done"


@attrs.frozen
class Fail:
    """The agent declares the task infeasible."""

    kind: ClassVar[str] = "fail"


@attrs.frozen
class NoOp:
    """Model output that is not an action: ``reason`` says why, ``raw`` is the text (data only)."""

    kind: ClassVar[str] = "noop"
    reason: str
    raw: str = attrs.field(repr=lambda s: repr(s if len(s) <= 80 else s[:77] + "..."))


Action = Click | MoveTo | DragTo | TypeText | Hotkey | Press | Scroll | Wait | Done | Fail | NoOp
"""Every action the parser can return (``NoOp`` for unparsable output)."""

#: Actions that end an episode.
TERMINAL_ACTIONS = (Done, Fail)
