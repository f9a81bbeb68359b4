"""One action call (``name(args)`` with literal arguments) → an ``Action`` record.

Shared by every text format kvagent reads: its own action language and UI-TARS' calls are
Python-call syntax read with ``ast`` (a parser, never an evaluator), Qwen3-VL's tool calls are
JSON objects; all of them end here as named arguments handed to a builder.

``Reader`` converts the model's coordinates into screen pixels (``vmenv.actions.place``) and
records what it changed (a clamped point) in ``notes``; ``CALLS`` is kvagent's table of action
names, the other formats pick builders from ``Reader``.  Every failure is an ``ActionError``.
"""

from __future__ import annotations

import ast
import math
import re
import warnings
from collections.abc import Callable
from typing import Any

import attrs

from vmenv.actions.coords import CoordConvention, Screen, place
from vmenv.actions.errors import ActionParseError
from vmenv.actions.types import (
    Action, Click, Done, DragTo, Fail, Hotkey, MoveTo, Press, Scroll, TypeText, Wait,
)

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
SCROLL_DIRECTIONS = {"up": (0, 1), "down": (0, -1), "left": (-1, 0), "right": (1, 0)}
#: Keyword names under which a single point (or a box around it) may come.
POINT_NAMES = ("start_box", "point", "start_point", "coordinate")
END_NAMES = ("end_box", "end_point")


class Args:
    """The literal arguments of one call, read by position or keyword; ``finish`` rejects
    arguments nobody read (a typo'd keyword must not be silently dropped)."""

    def __init__(self, name: str, pos: list[Any] | None = None,
                 kw: dict[str, Any] | None = None) -> None:
        self.name, self.pos, self.kw = name, pos or [], kw or {}
        self._used: set[str] = set()
        self._n_pos_used = 0

    @classmethod
    def of_call(cls, call: ast.Call, name: str) -> Args:
        if any(k.arg is None for k in call.keywords):
            raise ActionParseError(f"{name}: **kwargs are not allowed")
        try:
            pos = [ast.literal_eval(a) for a in call.args]
            kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
            raise ActionParseError(f"{name}: arguments must be literals") from exc
        return cls(name, pos, kw)

    def get(self, index: int | None, *names: str, default: Any = ...) -> Any:
        """The argument at position ``index`` or under any of ``names`` (keywords win)."""
        for n in names:
            if n in self.kw:
                self._used.add(n)
                return self.kw[n]
        if index is not None and index < len(self.pos):
            self._n_pos_used = max(self._n_pos_used, index + 1)
            return self.pos[index]
        if default is ...:
            raise ActionParseError(f"{self.name}: missing argument {names[0] if names else index}")
        return default

    def rest(self, start: int) -> list[Any]:
        """All positional arguments from ``start`` on."""
        self._n_pos_used = max(self._n_pos_used, len(self.pos))
        return self.pos[start:]

    def has(self, *names: str) -> bool:
        return any(n in self.kw for n in names)

    def unused(self) -> list[str]:
        """Keyword arguments nobody read, sorted."""
        return sorted(str(k)[:40] for k in set(self.kw) - self._used)

    def finish(self) -> None:
        extra = set(self.kw) - self._used
        if extra or len(self.pos) > self._n_pos_used:
            what = ", ".join(sorted(str(e)[:40] for e in extra)) or f"{len(self.pos)} positional"
            raise ActionParseError(f"{self.name}: unexpected arguments ({what})")


def number(value: Any, what: str) -> float:
    """A finite int or float argument as a float (bools and strings are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ActionParseError(f"{what} must be a number, got {_short(value)}")
    try:
        v = float(value)  # a 309-digit int overflows here: reject it, do not raise past us
    except OverflowError:
        raise ActionParseError(f"{what} is too large") from None
    if not math.isfinite(v):
        raise ActionParseError(f"{what} must be finite, got {value!r}")
    return v


def whole(value: Any, what: str) -> int:
    v = number(value, what)
    if v != int(v):
        raise ActionParseError(f"{what} must be a whole number, got {value!r}")
    return int(v)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def box_point(value: Any) -> tuple[float, float]:
    """A point given as a box string ('(x,y)', '<point>x y</point>', '[x1,y1,x2,y2]') or a
    2- / 4-number list → the point, or the box's centre."""
    if isinstance(value, str):
        nums = [float(n) for n in _NUMBER.findall(value[:200])]
    elif isinstance(value, tuple | list):
        nums = [number(v, "box coordinate") for v in value[:5]]
    else:
        raise ActionParseError(f"a point must be a string or a list, got {_short(value)}")
    if len(nums) == 2:
        return nums[0], nums[1]
    if len(nums) == 4:
        return (nums[0] + nums[2]) / 2, (nums[1] + nums[3]) / 2
    raise ActionParseError(f"a point needs 2 (or a box 4) numbers, got {_short(value)}")


@attrs.define
class Reader:
    """Builds actions from arguments for one parse, converting coordinates into pixels.

    ``image``: for absolute coordinates, the size of the resized image the model wrote them in
    (None: the screen).  ``pointer``: where the mouse is, for actions that start there
    (Qwen3-VL's drag); None when unknown.  ``margin``: reject points farther outside the
    screen than this fraction of an axis (None: clamp every point).  ``notes`` collects what
    was changed.
    """

    convention: CoordConvention
    screen: Screen
    image: Screen | None = None
    pointer: tuple[int, int] | None = None
    margin: float | None = None
    wait_default_s: float = 1.0
    direction_clicks: int = 5  # clicks of one scroll(direction=...) step
    notes: list[str] = attrs.Factory(list)

    def xy(self, x: float, y: float) -> tuple[int, int]:
        p = place(x, y, self.convention, self.screen, image=self.image, margin=self.margin)
        if p.clamped:
            self.notes.append(f"point ({x:g}, {y:g}) lay outside the screen: clamped to "
                              f"({p.x}, {p.y})")
        return p.x, p.y

    def point(self, a: Args, first: int = 0, names: tuple[str, ...] = POINT_NAMES
              ) -> tuple[int, int]:
        """A point from a box / point / coordinate keyword, or from x, y (or positions)."""
        if a.has(*names):
            return self.xy(*box_point(a.get(None, *names)))
        return self.xy(number(a.get(first, "x"), "x"), number(a.get(first + 1, "y"), "y"))

    def point_or_pointer(self, a: Args) -> tuple[int, int]:
        """The call's point, or the pointer's position when the call names none."""
        if a.has(*POINT_NAMES, "x") or a.pos:
            return self.point(a)
        if self.pointer is None:
            raise ActionParseError(f"{a.name} names no point and the pointer position is unknown")
        self.notes.append(f"{a.name} without a point acts at the pointer {self.pointer}")
        return self.pointer

    def click(self, a: Args, button: str = "left", clicks: int = 1) -> Click:
        x, y = self.point_or_pointer(a)
        return Click(x, y, button=a.get(None, "button", default=button),
                     clicks=a.get(None, "clicks", default=clicks))

    def drag(self, a: Args) -> DragTo:
        if a.has(*POINT_NAMES):
            (x0, y0), (x1, y1) = self.point(a), self.point(a, names=END_NAMES)
        else:
            x0, y0 = self.xy(number(a.get(0, "x0"), "x0"), number(a.get(1, "y0"), "y0"))
            x1, y1 = self.xy(number(a.get(2, "x1"), "x1"), number(a.get(3, "y1"), "y1"))
        return DragTo(x0, y0, x1, y1)

    def drag_from_pointer(self, a: Args) -> DragTo:
        """A drag to ``coordinate`` from ``start_coordinate``, or from the pointer."""
        x1, y1 = self.xy(*box_point(a.get(None, "coordinate")))
        if a.has("start_coordinate"):
            x0, y0 = self.xy(*box_point(a.get(None, "start_coordinate")))
        elif self.pointer is not None:
            x0, y0 = self.pointer
            self.notes.append(f"{a.name} starts at the pointer {self.pointer}")
        else:
            raise ActionParseError(f"{a.name} starts at the pointer, whose position is unknown")
        return DragTo(x0, y0, x1, y1)

    def scroll(self, a: Args) -> Scroll:
        if a.has("direction"):
            direction = a.get(None, "direction")
            if not isinstance(direction, str) or direction.lower() not in SCROLL_DIRECTIONS:
                raise ActionParseError("scroll direction must be one of up/down/left/right")
            ux, uy = SCROLL_DIRECTIONS[direction.lower()]
            at = self.point(a) if a.has(*POINT_NAMES) else None
            dx, dy = ux * self.direction_clicks, uy * self.direction_clicks
        else:
            dx, dy = whole(a.get(0, "dx"), "dx"), whole(a.get(1, "dy"), "dy")
            at = self.point(a, first=2) if len(a.pos) > 2 or a.has("x", *POINT_NAMES) else None
        return Scroll(dx, dy, *(at or (None, None)))

    def hotkey(self, a: Args, *, single_is_press: bool = False) -> Hotkey | Press:
        """Keys as separate arguments, a list, or one string split on spaces ('ctrl c')."""
        if a.has("key", "keys", "hotkey"):
            value = a.get(None, "key", "keys", "hotkey")
            keys = value.split() if isinstance(value, str) else value
        else:
            keys = a.rest(0)
        if not isinstance(keys, list | tuple):
            raise ActionParseError(f"hotkey needs key names, got {_short(keys)}")
        if single_is_press and len(keys) == 1:
            return Press(keys[0])
        return Hotkey(tuple(keys))

    def type(self, a: Args) -> TypeText:
        text = a.get(0, "text", "content")
        if not isinstance(text, str):
            raise ActionParseError(f"type needs a string, got {_short(text)}")
        return TypeText(text)

    def wait(self, a: Args) -> Wait:
        return Wait(number(a.get(0, "seconds", "time", default=self.wait_default_s), "seconds"))

    def finished(self, a: Args) -> Done:
        a.get(0, "content", default=None)  # a final answer: accepted, not needed here
        return Done()


Builder = Callable[[Reader, Args], Action]

#: kvagent's action names and the aliases it accepts (UI-TARS' among them).
CALLS: dict[str, Builder] = {
    "click": lambda r, a: r.click(a),
    "left_click": lambda r, a: r.click(a),
    "left_single": lambda r, a: r.click(a),
    "double_click": lambda r, a: r.click(a, clicks=2),
    "left_double": lambda r, a: r.click(a, clicks=2),
    "triple_click": lambda r, a: r.click(a, clicks=3),
    "right_click": lambda r, a: r.click(a, button="right"),
    "right_single": lambda r, a: r.click(a, button="right"),
    "middle_click": lambda r, a: r.click(a, button="middle"),
    "move_to": lambda r, a: MoveTo(*r.point(a)),
    "moveto": lambda r, a: MoveTo(*r.point(a)),
    "hover": lambda r, a: MoveTo(*r.point(a)),
    "mouse_move": lambda r, a: MoveTo(*r.point(a)),
    "drag": lambda r, a: r.drag(a),
    "drag_to": lambda r, a: r.drag(a),
    "left_drag": lambda r, a: r.drag(a),
    "select": lambda r, a: r.drag(a),
    "type": lambda r, a: r.type(a),
    "write": lambda r, a: r.type(a),
    "typewrite": lambda r, a: r.type(a),
    "hotkey": lambda r, a: r.hotkey(a),
    "press": lambda r, a: Press(a.get(0, "key")),
    "key": lambda r, a: Press(a.get(0, "key")),
    "scroll": lambda r, a: r.scroll(a),
    "wait": lambda r, a: r.wait(a),
    "done": lambda r, a: Done(),
    "finished": lambda r, a: r.finished(a),
    "fail": lambda r, a: Fail(),
    "infeasible": lambda r, a: Fail(),
}


def parse_expression(text: str) -> ast.expr:
    """``text`` as one Python expression tree (parsed, never evaluated); ``ActionParseError``
    if it is none.  Python's SyntaxWarnings about model text (an invalid escape, "1if") are
    noise in the logs: they are silenced here."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ActionParseError(f"not an action call: {type(exc).__name__}") from exc


def read_call(text: str, reader: Reader, calls: dict[str, Builder]) -> Action:
    """Parse ``text`` as exactly one call ``name(literal args)`` of a name in ``calls``
    (case-insensitive) and build its action.  Raises ``ActionError`` subclasses."""
    node = parse_expression(text)
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ActionParseError("not an action call")
    name = node.func.id
    builder = calls.get(name.lower())
    if builder is None:
        raise ActionParseError(f"unknown action {name[:40]!r}")
    args = Args.of_call(node, name)
    action = builder(reader, args)
    args.finish()
    return action
