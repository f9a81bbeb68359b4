"""The one async interface every environment implements (simulated, replayed, OSWorld).

An episode is ``reset(task)`` → ``Observation``, then ``step(action)`` → ``StepOutcome``
until ``outcome.done``; ``close()`` releases the env.  Actions are the structured records of
``vmenv.actions`` (never raw model text); how an env executes them is its own business
(the simulated desktop applies them, OSWorld receives generated pyautogui code).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import attrs

from vmenv.actions import Action


@attrs.frozen
class Observation:
    """What the agent sees after a reset or a step."""

    screenshot: bytes = attrs.field(repr=False)  # PNG, ``width`` × ``height`` pixels
    width: int
    height: int
    instruction: str
    step: int  # 0 after reset, then the number of steps taken

    @property
    def size(self) -> tuple[int, int]:
        """(width, height): the screen size action coordinates refer to."""
        return self.width, self.height


@attrs.frozen
class StepOutcome:
    """The result of one ``step``: OSWorld's (obs, reward, done, info) as a record."""

    observation: Observation
    reward: float
    done: bool
    info: dict[str, Any] = attrs.field(factory=dict)


@runtime_checkable
class Env(Protocol):
    """An episode-at-a-time environment.  Methods are coroutines; one call at a time."""

    async def reset(self, task: str | None = None) -> Observation:
        """Start an episode (of ``task``, or the env's default) and return the first screen."""
        ...

    async def step(self, action: Action) -> StepOutcome:
        """Execute one action; return the next screen, the reward and whether the episode ended."""
        ...

    async def close(self) -> None:
        """Release the env; later calls raise ``EnvClosedError``.  Idempotent."""
        ...
