"""The test-side DesktopEnv fake: ``vmenv.osworld_fake.FakeDesktopEnv`` plus contract checks
and fault injection.

``CheckingDesktopEnv.step`` asserts what OSWorld requires of an agent's action before the
base fake applies it: a string that is 'WAIT' / 'DONE' / 'FAIL' or code that ``ast.parse``s
into ``pyautogui.<f>(literals)`` statements only, whose coordinates lie on the screen.
``missing_screenshots`` makes chosen observations come back with ``screenshot=None`` (what
DesktopEnv returns after three failed screenshot requests).
"""

from __future__ import annotations

from typing import Any

from vmenv.actions import SPECIAL_ACTIONS, Click, DragTo, MoveTo, Scroll
from vmenv.osworld_fake import (
    FakeController, FakeDesktopEnv, PyAutoGuiCall, UnsupportedCodeError,
    apply_code, read_pyautogui, simdesk_example,
)

__all__ = [
    "SPECIAL_ACTIONS", "CheckingDesktopEnv", "FakeController", "FakeDesktopEnv",
    "PyAutoGuiCall", "UnsupportedCodeError", "apply_code", "assert_action_contract",
    "read_pyautogui", "simdesk_example",
]


def assert_action_contract(action: Any, screen: tuple[int, int]) -> None:
    """An OSWorld pyautogui action: a special string, or pyautogui-only code on the screen."""
    assert isinstance(action, str), f"an action must be a str, got {type(action).__name__}"
    if action in SPECIAL_ACTIONS:
        return
    calls = read_pyautogui(action)  # raises UnsupportedCodeError for anything else
    assert calls and all(isinstance(c, PyAutoGuiCall) for c in calls)
    w, h = screen
    for c in calls:
        for axis, limit in (("x", w), ("y", h)):
            value = c.kwargs.get(axis)
            if value is None and c.name in ("moveTo", "dragTo") and c.args:
                value = c.args[0 if axis == "x" else 1]
            if value is not None:
                assert isinstance(value, int) and 0 <= value < limit, (action, axis, value)


class CheckingDesktopEnv(FakeDesktopEnv):
    """FakeDesktopEnv that checks every action against the contract and can drop
    screenshots: ``missing_screenshots`` holds indexes of ``_get_obs`` calls (0 = the first
    observation of the env's life) that return ``screenshot=None``."""

    def __init__(self, *, missing_screenshots: set[int] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.missing_screenshots = set(missing_screenshots or ())
        self.n_observations = 0
        self.resets = 0

    def reset(self, task_config: Any = None, seed: Any = None, options: Any = None) -> Any:
        self.resets += 1
        return super().reset(task_config, seed, options)

    def _get_obs(self) -> dict[str, Any]:
        obs = super()._get_obs()
        if self.n_observations in self.missing_screenshots:
            obs["screenshot"] = None
        self.n_observations += 1
        return obs

    def step(self, action: Any, pause: float = 2) -> Any:
        assert_action_contract(action, self.screen_size)
        result = super().step(action, pause)
        w, h = self.screen_size
        for a in self.applied:  # what the code meant, in absolute pixels
            if isinstance(a, Click | MoveTo):
                assert 0 <= a.x < w and 0 <= a.y < h, a
            elif isinstance(a, DragTo):
                assert max(a.x0, a.x1) < w and max(a.y0, a.y1) < h, a
            elif isinstance(a, Scroll) and a.x is not None:
                assert a.x < w and a.y is not None and a.y < h, a
        return result
