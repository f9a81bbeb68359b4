"""Model text → a structured ``Action``.  Model output is data: it is parsed, never executed.

The text is read with ``ast.parse(mode="eval")`` (a parser, not an evaluator) and only a call of
a known action name with literal arguments is accepted; argument values are read with
``ast.literal_eval``.  Accepted forms, besides the grammar's own language (see ``grammar.py``):

* surrounding whitespace, a code fence, an ``Action:`` prefix (the text after the last one is
  used, so UI-TARS' "Thought: ...\\nAction: ..." works), trailing end-of-turn tokens;
* keyword arguments (``click(x=1, y=2, button="right")``) and aliases (``left_click``,
  ``hover``, ``write``, ``finished``, ``DONE``, ...);
* UI-TARS boxes: ``click(start_box='(x,y)')``, ``drag(start_box=..., end_box=...)``,
  ``scroll(start_box=..., direction='down')``, ``hotkey(key='ctrl c')``, ``type(content=...)``;
  a 4-number box means its centre.

``parse_action`` returns ``NoOp(reason, raw)`` for anything else and never raises for bad
model text; ``parse_action_strict`` raises the typed error instead.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from typing import Any

import structlog

from vmenv.actions.coords import CoordConvention, Screen, to_screen
from vmenv.actions.errors import ActionError, ActionParseError, InvalidActionError
from vmenv.actions.types import (
    Action, Click, Done, DragTo, Fail, Hotkey, MoveTo, NoOp, Press, Scroll, TypeText, Wait,
)

log = structlog.get_logger(__name__)

#: Longer texts are refused before parsing (a model's one action is short; this also bounds
#: the parser's work on garbage).
MAX_RAW_CHARS = 8_000
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?```$", re.DOTALL)
_EOG = re.compile(r"(?:\s*(?:<\|im_end\|>|<\|endoftext\|>|<\|eot_id\|>|</s>))+\s*$")
_ACTION_PREFIX = re.compile(r"(?:^|\n)\s*action\s*:\s*", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_SCROLL_DIRECTIONS = {"up": (0, 1), "down": (0, -1), "left": (-1, 0), "right": (1, 0)}
#: clicks per UI-TARS scroll(direction=...) step
_BOX_SCROLL_CLICKS = 5


def _clean(text: str) -> str:
    s = _EOG.sub("", text.strip()).strip()
    fence = _FENCE.match(s)
    if fence:
        s = fence.group(1).strip()
    prefixes = list(_ACTION_PREFIX.finditer(s))
    if prefixes:
        s = s[prefixes[-1].end():].strip()
    return s


class _Args:
    """The literal arguments of one call, read by position or keyword."""

    def __init__(self, call: ast.Call, name: str) -> None:
        self.name = name
        try:
            self.pos = [ast.literal_eval(a) for a in call.args]
            self.kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
            raise ActionParseError(f"{name}: arguments must be literals") from exc
        if any(k.arg is None for k in call.keywords):
            raise ActionParseError(f"{name}: **kwargs are not allowed")
        self._used: set[str] = set()
        self._n_pos_used = 0

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

    def finish(self) -> None:
        extra = set(self.kw) - self._used
        if extra or len(self.pos) > self._n_pos_used:
            what = ", ".join(sorted(extra)) or f"{len(self.pos)} positional"
            raise ActionParseError(f"{self.name}: unexpected arguments ({what})")


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ActionParseError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ActionParseError(f"{what} must be finite, got {value!r}")
    return float(value)


def _int(value: Any, what: str) -> int:
    v = _number(value, what)
    if v != int(v):
        raise ActionParseError(f"{what} must be a whole number, got {value!r}")
    return int(v)


def _box(value: Any) -> tuple[float, float]:
    """A UI-TARS box string '(x,y)' / '[x1,y1,x2,y2]' (or a tuple) → its point / centre."""
    if isinstance(value, str):
        nums = [float(n) for n in _NUMBER.findall(value)]
    elif isinstance(value, tuple | list):
        nums = [_number(v, "box coordinate") for v in value]
    else:
        raise ActionParseError(f"a box must be a string or a tuple, got {value!r}")
    if len(nums) == 2:
        return nums[0], nums[1]
    if len(nums) == 4:
        return (nums[0] + nums[2]) / 2, (nums[1] + nums[3]) / 2
    raise ActionParseError(f"a box needs 2 or 4 numbers, got {value!r}")


class _Reader:
    """Builds actions from calls, converting coordinates into screen pixels."""

    def __init__(self, convention: CoordConvention, screen: Screen) -> None:
        self.convention, self.screen = convention, screen

    def _xy(self, x: float, y: float) -> tuple[int, int]:
        return to_screen(x, y, self.convention, self.screen)

    def point(self, a: _Args, first: int = 0, box: str = "start_box") -> tuple[int, int]:
        if a.has(box, "point", "coordinate"):
            return self._xy(*_box(a.get(-1, box, "point", "coordinate")))
        return self._xy(_number(a.get(first, "x"), "x"), _number(a.get(first + 1, "y"), "y"))

    def click(self, a: _Args, button: str = "left", clicks: int = 1) -> Click:
        x, y = self.point(a)
        return Click(x, y, button=a.get(None, "button", default=button),
                     clicks=a.get(None, "clicks", default=clicks))

    def drag(self, a: _Args) -> DragTo:
        if a.has("start_box"):
            (x0, y0), (x1, y1) = self.point(a), self.point(a, box="end_box")
        else:
            x0, y0 = self._xy(_number(a.get(0, "x0"), "x0"), _number(a.get(1, "y0"), "y0"))
            x1, y1 = self._xy(_number(a.get(2, "x1"), "x1"), _number(a.get(3, "y1"), "y1"))
        return DragTo(x0, y0, x1, y1)

    def scroll(self, a: _Args) -> Scroll:
        if a.has("direction"):
            direction = a.get(None, "direction")
            if not isinstance(direction, str) or direction not in _SCROLL_DIRECTIONS:
                raise ActionParseError("scroll direction must be one of up/down/left/right")
            ux, uy = _SCROLL_DIRECTIONS[direction]
            at = self.point(a) if a.has("start_box", "point", "coordinate") else None
            dx, dy = ux * _BOX_SCROLL_CLICKS, uy * _BOX_SCROLL_CLICKS
        else:
            dx, dy = _int(a.get(0, "dx"), "dx"), _int(a.get(1, "dy"), "dy")
            at = self.point(a, first=2) if len(a.pos) > 2 or a.has("x", "start_box") else None
        return Scroll(dx, dy, *(at or (None, None)))

    def hotkey(self, a: _Args) -> Hotkey:
        if a.has("key", "keys"):
            value = a.get(None, "key", "keys")
            keys = value.split() if isinstance(value, str) else value
        else:
            keys = a.rest(0)
        if not isinstance(keys, list | tuple):
            raise ActionParseError(f"hotkey needs key names, got {keys!r}")
        return Hotkey(tuple(keys))

    def finished(self, a: _Args) -> Done:
        a.get(0, "content", default=None)  # UI-TARS' final answer: accepted, not needed here
        return Done()

    def type(self, a: _Args) -> TypeText:
        text = a.get(0, "text", "content")
        if not isinstance(text, str):
            raise ActionParseError(f"type needs a string, got {text!r}")
        return TypeText(text)


_Builder = Callable[[_Reader, _Args], Action]
_CALLS: dict[str, _Builder] = {
    "click": lambda r, a: r.click(a),
    "left_click": lambda r, a: r.click(a),
    "left_single": lambda r, a: r.click(a),
    "double_click": lambda r, a: r.click(a, clicks=2),
    "left_double": lambda r, a: r.click(a, clicks=2),
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
    "wait": lambda r, a: Wait(_number(a.get(0, "seconds", "time", default=1.0), "seconds")),
    "done": lambda r, a: Done(),
    "finished": lambda r, a: r.finished(a),
    "fail": lambda r, a: Fail(),
    "infeasible": lambda r, a: Fail(),
}
_BARE: dict[str, Action] = {"DONE": Done(), "FAIL": Fail(), "WAIT": Wait(1.0)}


def parse_action_strict(text: str, *, convention: CoordConvention = CoordConvention.ABSOLUTE,
                        screen: Screen) -> Action:
    """Parse one action or raise ``ActionParseError`` / ``InvalidActionError`` (with the cause).

    Coordinates are read in ``convention`` and returned as absolute pixels of ``screen``
    (clamped into it).
    """
    if len(text) > MAX_RAW_CHARS:
        raise ActionParseError(f"output of {len(text)} characters exceeds {MAX_RAW_CHARS}")
    s = _clean(text)
    if not s:
        raise ActionParseError("empty output")
    if "\n" in s:
        raise ActionParseError("expected one action on one line")
    if s in _BARE:
        return _BARE[s]
    try:
        node = ast.parse(s, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ActionParseError(f"not an action call: {type(exc).__name__}") from exc
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ActionParseError("not an action call")
    name = node.func.id
    builder = _CALLS.get(name.lower())
    if builder is None:
        raise ActionParseError(f"unknown action {name[:40]!r}")
    args = _Args(node, name)
    action = builder(_Reader(convention, screen), args)
    args.finish()
    return action


def parse_action(text: str, *, convention: CoordConvention = CoordConvention.ABSOLUTE,
                 screen: Screen) -> Action:
    """Parse model text into an ``Action``; anything unparsable becomes ``NoOp(reason, raw)``.

    Never raises for bad model text (a bad ``screen`` is the caller's error and does raise).
    """
    if screen[0] < 1 or screen[1] < 1:
        raise InvalidActionError(f"screen size must be positive, got {screen}")
    try:
        return parse_action_strict(text, convention=convention, screen=screen)
    except (ActionError, TypeError) as exc:
        reason = str(exc) or type(exc).__name__
        log.debug("action_parse_failed", reason=reason, n_chars=len(text))
        return NoOp(reason=reason, raw=text)
