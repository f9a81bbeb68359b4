"""Structured action → the pyautogui code string OSWorld's DesktopEnv.step executes.

Only values produced by this module reach the VM: every call is fixed here, every string is a
``repr()`` literal (a Python literal whatever the text holds: quotes, backslashes, newlines or
an attempted ``"); import os; ...``), every number is an int or a float we produced.  Model
text is never forwarded.  Coordinates are absolute pixels of the screenshot.

OSWorld's special actions: ``Done`` → 'DONE', ``Fail`` → 'FAIL', ``Wait`` → 'WAIT', and an
unparsable output (``NoOp``) → 'WAIT' (the VM idles one step; the agent sees the same screen).
"""

from __future__ import annotations

from vmenv.actions.errors import InvalidActionError
from vmenv.actions.types import (
    Action, Click, Done, DragTo, Fail, Hotkey, MoveTo, NoOp, Press, Scroll, TypeText, Wait,
)

DONE = "DONE"
FAIL = "FAIL"
WAIT = "WAIT"
#: OSWorld's strings that are not code.
SPECIAL_ACTIONS = frozenset({DONE, FAIL, WAIT})

#: Seconds a drag takes (instant drags are missed by many toolkits).
DRAG_DURATION_S = 0.5
#: Seconds between typed characters.
TYPE_INTERVAL_S = 0.02


def _at(x: int | None, y: int | None) -> str:
    return "" if x is None else f", x={x}, y={y}"


def to_pyautogui(action: Action) -> str:
    """pyautogui code (one call per line) or one of 'DONE' / 'FAIL' / 'WAIT'."""
    match action:
        case Click(x=x, y=y, button=button, clicks=clicks):
            return f"pyautogui.click(x={x}, y={y}, clicks={clicks}, button={button!r})"
        case MoveTo(x=x, y=y):
            return f"pyautogui.moveTo({x}, {y})"
        case DragTo(x0=x0, y0=y0, x1=x1, y1=y1):
            return (f"pyautogui.moveTo({x0}, {y0})\n"
                    f"pyautogui.dragTo({x1}, {y1}, duration={DRAG_DURATION_S!r}, button='left')")
        case TypeText(text=text):
            return _typewrite(text)
        case Hotkey(keys=keys):
            return "pyautogui.hotkey(" + ", ".join(repr(k) for k in keys) + ")"
        case Press(key=key):
            return f"pyautogui.press({key!r})"
        case Scroll(dx=dx, dy=dy, x=x, y=y):
            lines = []
            if dy or not dx:
                lines.append(f"pyautogui.scroll({dy}{_at(x, y)})")
            if dx:
                lines.append(f"pyautogui.hscroll({dx}{_at(x, y)})")
            return "\n".join(lines)
        case Wait() | NoOp():
            return WAIT
        case Done():
            return DONE
        case Fail():
            return FAIL
    raise InvalidActionError(f"not an action: {action!r}")


def _typewrite(text: str) -> str:
    """Type ``text``; each '<' goes through ``hotkey('shift', ',')``.

    pyautogui types '<' as '>' on many VM keyboard layouts, and OSWorld's own workaround only
    rewrites a bare ``typewrite('...')``, so kvagent emits the fix itself.
    """
    lines = []
    for i, part in enumerate(text.split("<")):
        if i:
            lines.append("pyautogui.hotkey('shift', ',')")
        if part:
            lines.append(f"pyautogui.typewrite({part!r}, interval={TYPE_INTERVAL_S!r})")
    return "\n".join(lines)
