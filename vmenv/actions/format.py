"""Action → the action language's text (the inverse of ``parse_action``).

Used for prompt histories ("Step 3: click(512, 300)") and recorded trajectories.  Strings are
written as JSON strings, which are valid Python literals, so ``parse_action`` reads back
exactly the same action: ``parse_action(format_action(a), screen=s) == a`` for every action
with coordinates inside ``s`` (absolute convention).
"""

from __future__ import annotations

import json

from vmenv.actions.coords import CoordConvention, Screen, from_screen
from vmenv.actions.errors import InvalidActionError
from vmenv.actions.types import (
    Action, Click, Done, DragTo, Fail, Hotkey, MoveTo, NoOp, Press, Scroll, TypeText, Wait,
)


def _str(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def format_action(action: Action, *, convention: CoordConvention = CoordConvention.ABSOLUTE,
                  screen: Screen | None = None) -> str:
    """The one-line action-language text for ``action``, coordinates in ``convention``.

    Relative conventions need ``screen``.  ``NoOp`` formats as ``noop()`` (not part of the
    language: reading it back gives a NoOp again).
    """
    if convention is not CoordConvention.ABSOLUTE and screen is None:
        raise InvalidActionError(f"formatting in {convention.value} needs the screen size")

    def pt(x: int, y: int) -> str:
        if screen is None:
            return f"{x}, {y}"
        u, v = from_screen(x, y, convention, screen)
        return f"{_num(u)}, {_num(v)}"

    match action:
        case Click(x=x, y=y, button="left", clicks=1):
            return f"click({pt(x, y)})"
        case Click(x=x, y=y, button="left", clicks=2):
            return f"double_click({pt(x, y)})"
        case Click(x=x, y=y, button="left", clicks=3):
            return f"triple_click({pt(x, y)})"
        case Click(x=x, y=y, button="right", clicks=1):
            return f"right_click({pt(x, y)})"
        case Click(x=x, y=y, button="middle", clicks=1):
            return f"middle_click({pt(x, y)})"
        case Click(x=x, y=y, button=button, clicks=clicks):
            return f"click({pt(x, y)}, button={_str(button)}, clicks={clicks})"
        case MoveTo(x=x, y=y):
            return f"move_to({pt(x, y)})"
        case DragTo(x0=x0, y0=y0, x1=x1, y1=y1):
            return f"drag({pt(x0, y0)}, {pt(x1, y1)})"
        case TypeText(text=text):
            return f"type({_str(text)})"
        case Hotkey(keys=keys):
            return "hotkey(" + ", ".join(_str(k) for k in keys) + ")"
        case Press(key=key):
            return f"press({_str(key)})"
        case Scroll(dx=dx, dy=dy, x=None, y=None):
            return f"scroll({dx}, {dy})"
        case Scroll(dx=dx, dy=dy, x=int() as x, y=int() as y):
            return f"scroll({dx}, {dy}, {pt(x, y)})"
        case Wait(seconds=s):
            return f"wait({_num(s)})"
        case Done():
            return "done()"
        case Fail():
            return "fail()"
        case NoOp():
            return "noop()"
    raise InvalidActionError(f"not an action: {action!r}")
