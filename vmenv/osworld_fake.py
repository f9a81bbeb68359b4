"""A stand-in for OSWorld's ``DesktopEnv`` backed by the simulated desktop: no VM, no network.

It offers the synchronous surface ``lib_run_single.run_single_example`` uses —
``reset(task_config=None, seed=None, options=None) -> obs``, ``_get_obs()``,
``step(action, pause=2) -> (obs, reward, done, info)``, ``evaluate() -> float``, ``close()``,
``vm_ip``, ``controller.start_recording()`` / ``end_recording(path)`` — with DesktopEnv's
semantics: reward is always 0, only 'DONE' / 'FAIL' end an episode (info ``{"done": True}`` /
``{"fail": True}``), ``evaluate`` scores the task's checker and gives 0 after a final 'FAIL'.
It reads the examples ``simdesk_example`` makes (``vmenv.osworld_vm.protocol``), the same ones
the real DesktopEnv runs against the loopback VM server.

The pyautogui code it receives is READ, never executed, by ``vmenv.pyautogui_parse`` (the
reader the loopback VM server ``vmenv.osworld_vm`` shares): only ``pyautogui.<function>(<literal
arguments>)`` statements from a fixed list are accepted, turned into ``vmenv.actions`` records
and applied to the desktop state.  Anything else raises ``UnsupportedCodeError`` and leaves
the desktop as it was (a step is all or nothing).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import attrs

from vmenv.actions import SPECIAL_ACTIONS, Action
from vmenv.errors import EnvClosedError, NotResetError
from vmenv.osworld_vm.protocol import example_task, simdesk_example
from vmenv.pyautogui_parse import (
    PyAutoGuiCall, UnsupportedCodeError, apply_code, read_pyautogui,
)
from vmenv.simdesk.render import render_png
from vmenv.simdesk.lookup import resolve_task
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.tasks import Task, default_tasks

__all__ = ["SPECIAL_ACTIONS", "FakeController", "FakeDesktopEnv",
           "PyAutoGuiCall", "UnsupportedCodeError", "apply_code", "read_pyautogui",
           "simdesk_example"]

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
        name = "open-terminal" if task_config is None else example_task(task_config)
        self.task = resolve_task(name, self.tasks)
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
