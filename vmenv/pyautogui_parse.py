"""pyautogui code → ``vmenv.actions`` records, by reading it (``ast``), never by running it.

The simulated desktop's stand-ins for an OSWorld VM (``osworld_fake.FakeDesktopEnv`` and the
loopback VM server ``vmenv.osworld_vm``) both receive pyautogui code strings and apply what
they mean to a ``DeskState`` through this one reader.

Accepted: a sequence of ``pyautogui.<f>(<literal arguments>)`` statements with ``f`` from a
fixed list, optionally (``prelude=True``) preceded by the exact statements OSWorld's
``PythonController`` puts in front of every command (``OSWORLD_PRELUDE``).  Anything else
raises ``UnsupportedCodeError``; ``apply_code`` is all or nothing (the state it was given is
immutable, so a refused program changes nothing).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from vmenv.actions import (
    Action, ActionError, Click, DragTo, Hotkey, MoveTo, Press, Scroll, TypeText,
)
from vmenv.errors import VmEnvError
from vmenv.simdesk.apply import apply_action
from vmenv.simdesk.state import DeskState

#: What OSWorld's PythonController prepends to every pyautogui command before sending
#: ``["python", "-c", prelude + "; " + code]`` to the VM's /execute.
OSWORLD_PRELUDE = "import pyautogui; import time; pyautogui.FAILSAFE = False"
_PRELUDE_DUMPS = tuple(ast.dump(s) for s in ast.parse(OSWORLD_PRELUDE).body)


class UnsupportedCodeError(VmEnvError):
    """Code the simulated desktop refuses: not Python, not only ``pyautogui`` calls with
    literal arguments, or a pyautogui function it does not know."""


@attrs.frozen
class PyAutoGuiCall:
    """One ``pyautogui.<name>(*args, **kwargs)`` statement, arguments as Python literals."""

    name: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]


def parse_program(code: str, *, prelude: bool = False) -> list[ast.stmt]:
    """The statements of ``code`` (parsed, not run); with ``prelude``, OSWorld's prelude is
    dropped from the front when it is there.  Raises ``UnsupportedCodeError`` for code that
    is not Python or has no statement left."""
    try:
        body = ast.parse(code, mode="exec").body
    except SyntaxError as exc:
        raise UnsupportedCodeError(f"not Python: {exc.msg}") from exc
    n = len(_PRELUDE_DUMPS)
    if prelude and tuple(ast.dump(s) for s in body[:n]) == _PRELUDE_DUMPS:
        body = body[n:]
    if not body:
        raise UnsupportedCodeError("empty action code")
    return body


def read_pyautogui(code: str, *, prelude: bool = False) -> tuple[PyAutoGuiCall, ...]:
    """Parse ``code`` into pyautogui calls without running it; raise ``UnsupportedCodeError``
    for anything that is not a sequence of ``pyautogui.f(literals)`` statements."""
    calls = []
    for stmt in parse_program(code, prelude=prelude):
        if _no_op(stmt):
            continue
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if not isinstance(call, ast.Call):
            raise UnsupportedCodeError(f"not a call statement: {ast.unparse(stmt)!r}")
        f = call.func
        if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                and f.value.id == "pyautogui"):
            raise UnsupportedCodeError(f"not a pyautogui call: {ast.unparse(call)!r}")
        if any(k.arg is None for k in call.keywords):
            raise UnsupportedCodeError(f"**kwargs in {ast.unparse(call)!r}")
        try:
            args = tuple(ast.literal_eval(a) for a in call.args)
            kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
            raise UnsupportedCodeError(f"non-literal argument in {ast.unparse(call)!r}") from exc
        calls.append(PyAutoGuiCall(f.attr, args, kwargs))
    return tuple(calls)


#: modules an action may import again (OSWorld's UI-TARS agents start their code with
#: ``import pyautogui`` / ``import time``): the prelude has them, so importing is a no-op
_HARMLESS_IMPORTS = frozenset({"pyautogui", "time"})


def _no_op(stmt: ast.stmt) -> bool:
    """A statement that does nothing when run: re-importing ``_HARMLESS_IMPORTS`` (unaliased),
    or a bare string (the UI-TARS agents' ``'''Observation: ... Thought: ...'''`` note)."""
    if isinstance(stmt, ast.Import):
        return all(a.name in _HARMLESS_IMPORTS and a.asname is None for a in stmt.names)
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str))


def _arg(call: PyAutoGuiCall, index: int, name: str, default: Any = None) -> Any:
    if name in call.kwargs:
        return call.kwargs[name]
    return call.args[index] if index < len(call.args) else default


def _point(call: PyAutoGuiCall, pointer: tuple[int, int]) -> tuple[int, int]:
    x, y = _arg(call, 0, "x"), _arg(call, 1, "y")
    return (pointer if x is None and y is None else (_pixel(x), _pixel(y)))


def _pixel(v: Any) -> Any:
    """pyautogui moves to ``int(round(v))`` (OSWorld's UI-TARS agents write float points);
    anything else is left for the action's own check."""
    return int(round(v)) if isinstance(v, float) and abs(v) < 2**31 else v


def _click(button: str, clicks: int | None = None) -> Callable[[PyAutoGuiCall, Any], Action]:
    # pyautogui.click(x, y, clicks, interval, button, ...); the other clicks take
    # (x, y, interval, button, ...): read button and clicks by keyword (as generated).
    def read(call: PyAutoGuiCall, pointer: tuple[int, int]) -> Action:
        n = clicks if clicks is not None else _arg(call, 2, "clicks", 1)
        b = call.kwargs.get("button", button)
        return Click(*_point(call, pointer), button=b, clicks=n)
    return read


def _scroll(horizontal: bool) -> Callable[[PyAutoGuiCall, Any], Action]:
    def read(call: PyAutoGuiCall, _pointer: tuple[int, int]) -> Action:
        n, x, y = _arg(call, 0, "clicks"), _arg(call, 1, "x"), _arg(call, 2, "y")
        return Scroll(n, 0, x, y) if horizontal else Scroll(0, n, x, y)
    return read


def _type(call: PyAutoGuiCall, _pointer: tuple[int, int]) -> Action:
    text = _arg(call, 0, "message")
    if not isinstance(text, str):
        raise UnsupportedCodeError("the simulated desktop types strings only, not key lists")
    return TypeText(text)


#: pyautogui function → reader into an action record (the pointer is the current position).
_READERS: dict[str, Callable[[PyAutoGuiCall, tuple[int, int]], Action]] = {
    "click": _click("left"),
    "doubleClick": _click("left", 2),
    "rightClick": _click("right", 1),
    "middleClick": _click("middle", 1),
    "moveTo": lambda c, p: MoveTo(*_point(c, p)),
    "dragTo": lambda c, p: DragTo(p[0], p[1], *_point(c, p)),
    "typewrite": _type,
    "write": _type,
    "press": lambda c, _p: Press(_arg(c, 0, "keys")),
    "hotkey": lambda c, _p: Hotkey(c.args),
    "scroll": _scroll(False),
    "hscroll": _scroll(True),
}


def apply_code(state: DeskState, code: str, *,
               prelude: bool = False) -> tuple[DeskState, tuple[Action, ...]]:
    """The desktop after running ``code`` (read, not executed) and the actions it meant."""
    actions = []
    for call in read_pyautogui(code, prelude=prelude):
        reader = _READERS.get(call.name)
        if reader is None:
            raise UnsupportedCodeError(
                f"pyautogui.{call.name} is not supported by the simulated desktop")
        try:
            action = reader(call, state.pointer)
        except (ActionError, TypeError, ValueError) as exc:
            raise UnsupportedCodeError(f"bad arguments to pyautogui.{call.name}: {exc}") from exc
        state = apply_action(state, action)
        actions.append(action)
    return state, tuple(actions)
