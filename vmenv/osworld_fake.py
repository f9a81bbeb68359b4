"""A stand-in for OSWorld's ``DesktopEnv`` backed by the simulated desktop: no VM, no network.

It offers the synchronous surface ``lib_run_single.run_single_example`` uses —
``reset(task_config=None, seed=None, options=None) -> obs``, ``_get_obs()``,
``step(action, pause=2) -> (obs, reward, done, info)``, ``evaluate() -> float``, ``close()``,
``vm_ip``, ``controller.start_recording()`` / ``end_recording(path)`` — with DesktopEnv's
semantics: reward is always 0, only 'DONE' / 'FAIL' end an episode (info ``{"done": True}`` /
``{"fail": True}``), ``evaluate`` scores the task's checker and gives 0 after a final 'FAIL'.

The pyautogui code it receives is READ, never executed: ``ast.parse`` and only statements of
the form ``pyautogui.<function>(<literal arguments>)`` from a fixed list are accepted, turned
into ``vmenv.actions`` records and applied to the desktop state.  Anything else raises
``UnsupportedCodeError`` and leaves the desktop as it was (a step is all or nothing).
"""

from __future__ import annotations

import ast
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from vmenv.actions import (
    Action, ActionError, Click, DragTo, Hotkey, MoveTo, Press, Scroll, TypeText,
)
from vmenv.errors import EnvClosedError, NotResetError, UnknownTaskError, VmEnvError
from vmenv.simdesk_apply import apply_action
from vmenv.simdesk_render import render_png
from vmenv.simdesk_state import DeskState
from vmenv.simdesk_tasks import Task, default_tasks

#: The evaluator ``func`` of an OSWorld-shaped example that names a simulated-desktop task.
SIMDESK_EVALUATOR = "simdesk_check"


class UnsupportedCodeError(VmEnvError):
    """Action code the fake refuses: not a special string, not only ``pyautogui`` calls with
    literal arguments, or a pyautogui function it does not know."""


@attrs.frozen
class PyAutoGuiCall:
    """One ``pyautogui.<name>(*args, **kwargs)`` statement, arguments as Python literals."""

    name: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]


def read_pyautogui(code: str) -> tuple[PyAutoGuiCall, ...]:
    """Parse ``code`` into pyautogui calls without running it; raise ``UnsupportedCodeError``
    for anything that is not a sequence of ``pyautogui.f(literals)`` statements."""
    try:
        tree = ast.parse(code, mode="exec")
    except SyntaxError as exc:
        raise UnsupportedCodeError(f"not Python: {exc.msg}") from exc
    if not tree.body:
        raise UnsupportedCodeError("empty action code")
    calls = []
    for stmt in tree.body:
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


def _arg(call: PyAutoGuiCall, index: int, name: str, default: Any = None) -> Any:
    if name in call.kwargs:
        return call.kwargs[name]
    return call.args[index] if index < len(call.args) else default


def _point(call: PyAutoGuiCall, pointer: tuple[int, int]) -> tuple[int, int]:
    x, y = _arg(call, 0, "x"), _arg(call, 1, "y")
    return (pointer if x is None and y is None else (x, y))


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
        raise UnsupportedCodeError("the fake types strings only, not key lists")
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


def apply_code(state: DeskState, code: str) -> tuple[DeskState, tuple[Action, ...]]:
    """The desktop after running ``code`` (read, not executed) and the actions it meant."""
    actions = []
    for call in read_pyautogui(code):
        reader = _READERS.get(call.name)
        if reader is None:
            raise UnsupportedCodeError(f"pyautogui.{call.name} is not supported by the fake")
        try:
            action = reader(call, state.pointer)
        except (ActionError, TypeError, ValueError) as exc:
            raise UnsupportedCodeError(f"bad arguments to pyautogui.{call.name}: {exc}") from exc
        state = apply_action(state, action)
        actions.append(action)
    return state, tuple(actions)


def simdesk_example(task: str, *, example_id: str | None = None,
                    tasks: Mapping[str, Task] | None = None) -> dict[str, Any]:
    """An OSWorld-shaped task config (id, instruction, config, evaluator) for a simdesk task."""
    known = dict(tasks) if tasks is not None else default_tasks()
    if task not in known:
        raise UnknownTaskError(f"unknown task {task!r}; known: {', '.join(sorted(known))}")
    return {"id": example_id or task, "snapshot": "simdesk", "source": "kvagent-simdesk",
            "instruction": known[task].instruction, "config": [], "related_apps": [],
            "evaluator": {"func": SIMDESK_EVALUATOR, "task": task}}


class FakeController:
    """The parts of OSWorld's PythonController a runner touches (no video is recorded)."""

    def __init__(self, env: FakeDesktopEnv) -> None:
        self._env = env
        self.recording = False
        self.recordings: list[str] = []  # paths end_recording was asked to write

    def get_screenshot(self) -> bytes | None:
        return self._env._screenshot()

    def start_recording(self) -> None:
        self.recording = True

    def end_recording(self, dest: str) -> None:
        self.recording = False
        self.recordings.append(str(dest))


class FakeDesktopEnv:
    """DesktopEnv's synchronous interface over a simulated desktop (one episode at a time)."""

    def __init__(self, *, width: int = 320, height: int = 240,
                 tasks: Mapping[str, Task] | None = None, vm_ip: str = "127.0.0.1",
                 action_space: str = "pyautogui") -> None:
        self.screen_size = (width, height)
        self.tasks = dict(tasks) if tasks is not None else default_tasks()
        self.vm_ip = vm_ip
        self.action_space = action_space
        self.controller = FakeController(self)
        self.instruction: str | None = None
        self.action_history: list[Any] = []  # this episode's actions (DesktopEnv's name)
        self.received: list[Any] = []  # every action over the env's life, as received
        self.applied: list[Action] = []  # the actions the received code meant, in order
        self.task: Task | None = None
        self.closed = False
        self._state: DeskState | None = None

    @property
    def state(self) -> DeskState:
        if self._state is None:
            raise NotResetError("call reset() first")
        return self._state

    def reset(self, task_config: Mapping[str, Any] | None = None, seed: int | None = None,
              options: Any = None) -> dict[str, Any]:
        """Start the example's task (``None``: open-terminal) on a fresh desktop."""
        self._check_open()
        name = "open-terminal"
        if task_config is not None:
            evaluator = task_config.get("evaluator") or {}
            if evaluator.get("func") != SIMDESK_EVALUATOR or evaluator.get("task") not in self.tasks:
                raise UnknownTaskError(
                    f"example {task_config.get('id')!r} is not a simulated-desktop task")
            name = evaluator["task"]
        self.task = self.tasks[name]
        w, h = self.screen_size
        self._state = self.task.setup(DeskState.empty(w, h))
        self.instruction = (task_config or {}).get("instruction") or self.task.instruction
        self.action_history.clear()
        return self._get_obs()

    def _get_obs(self) -> dict[str, Any]:
        return {"screenshot": self._screenshot(), "accessibility_tree": None, "terminal": None,
                "instruction": self.instruction}

    def _screenshot(self) -> bytes | None:
        return render_png(self.state)

    def step(self, action: Any, pause: float = 2) -> tuple[dict[str, Any], float, bool,
                                                            dict[str, Any]]:
        """Apply one action string; sleep ``pause`` like DesktopEnv; observe."""
        self._check_open()
        state = self.state
        self.received.append(action)
        self.action_history.append(action)
        done, info = False, {}
        if not isinstance(action, str):
            raise UnsupportedCodeError(f"the fake speaks pyautogui strings, got {action!r}")
        if action == "DONE":
            done, info = True, {"done": True}
        elif action == "FAIL":
            done, info = True, {"fail": True}
        elif action != "WAIT":
            state, actions = apply_code(state, action)
            self.applied.extend(actions)
        self._state = attrs.evolve(state, step=state.step + 1)  # the taskbar clock moves on
        if pause:
            time.sleep(pause)
        return self._get_obs(), 0.0, done, info

    def evaluate(self) -> float:
        """1.0 if the task's checker passes (0.0 after a final 'FAIL', as in DesktopEnv)."""
        if self.task is None:
            raise NotResetError("call reset() first")
        if self.action_history and self.action_history[-1] == "FAIL":
            return 0.0
        return 1.0 if self.task.check(self.state) else 0.0

    def close(self) -> None:
        self.closed = True

    def render(self, mode: str = "rgb_array") -> bytes | None:
        return self._screenshot()

    def _check_open(self) -> None:
        if self.closed:
            raise EnvClosedError("the fake desktop env is closed")
