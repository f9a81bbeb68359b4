"""``ReplayEnv``: replays a recorded trajectory, whatever the agent does (for benchmarks).

``reset`` returns the first recorded screen; each ``step`` waits ``vm_seconds`` (standing in
for the VM executing the action) and returns the next recorded screen, ignoring the action.
The episode is done on the last recorded screen.  So two agents (or two cache policies)
replayed on one trajectory see byte-identical screenshots, which is what makes their
timings and output hashes comparable.

``record_trajectory`` writes such a trajectory from any ``Env`` (typically ``SimDesk``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import structlog

from vmenv.actions import Action, format_action, to_pyautogui
from vmenv.base import Env, Observation, StepOutcome
from vmenv.errors import (
    EnvBusyError, EnvClosedError, EpisodeOverError, NotResetError, TrajectoryError,
)
from vmenv.trajectory import Trajectory, load_trajectory
from vmenv.trajectory_writer import TRAJ_FILE, TrajectoryWriter

log = structlog.get_logger(__name__)

Sleep = Callable[[float], Awaitable[Any]]


class ReplayEnv:
    """Replays ``trajectory`` (implements ``vmenv.base.Env``).  One call at a time."""

    def __init__(self, trajectory: Trajectory, *, vm_seconds: float = 0.0,
                 sleep: Sleep = anyio.sleep) -> None:
        if vm_seconds < 0:
            raise ValueError("vm_seconds must be >= 0")
        self.trajectory = trajectory
        self.vm_seconds = vm_seconds
        self._sleep = sleep
        self._index: int | None = None
        self._busy = False
        self._closed = False

    @classmethod
    def from_dir(cls, directory: str | Path, **kwargs: Any) -> ReplayEnv:
        """Load a trajectory directory (blocking; see ``vmenv.trajectory``)."""
        return cls(load_trajectory(directory), **kwargs)

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[bytes, str | None]], *, instruction: str = "",
                   **kwargs: Any) -> ReplayEnv:
        """From in-memory (screenshot PNG, action taken on it) pairs."""
        return cls(Trajectory.from_pairs(pairs, instruction=instruction), **kwargs)

    def __len__(self) -> int:
        """Number of recorded screens (steps possible = len - 1)."""
        return len(self.trajectory.frames)

    @property
    def recorded_actions(self) -> tuple[str | None, ...]:
        """The recorded action on each screen (a benchmark's teacher-forced agent outputs)."""
        return self.trajectory.actions

    async def reset(self, task: str | None = None) -> Observation:
        """Back to the first recorded screen (``task`` is ignored: the recording is the task)."""
        self._check()
        self._index = 0
        log.debug("replay_reset", n_frames=len(self))
        return self._observe(0)

    async def step(self, action: Action) -> StepOutcome:
        """The next recorded screen, after ``vm_seconds``; ``action`` does not change it."""
        self._check()
        if self._index is None:
            raise NotResetError("call reset() before step()")
        if self._index >= len(self) - 1:
            raise EpisodeOverError("the recorded trajectory has no more screens; call reset()")
        self._busy = True
        try:
            await self._sleep(self.vm_seconds)
        finally:
            self._busy = False
        self._index += 1  # only after the wait: a cancelled step replays the same screen
        i = self._index
        frame = self.trajectory.frames[i]
        done = i == len(self) - 1
        info = {"recorded_action": self.trajectory.frames[i - 1].action,
                "action": format_action(action), "replayed": True}
        log.debug("replay_step", step=i, done=done)
        return StepOutcome(self._observe(i), frame.reward, done, info)

    async def close(self) -> None:
        """Close the env (idempotent)."""
        self._closed = True

    def _check(self) -> None:
        if self._closed:
            raise EnvClosedError("the replay env is closed")
        if self._busy:
            raise EnvBusyError("another step of this env is running")

    def _observe(self, i: int) -> Observation:
        f = self.trajectory.frames[i]
        return Observation(screenshot=f.screenshot, width=f.width, height=f.height,
                           instruction=self.trajectory.instruction, step=i)


async def record_trajectory(env: Env, actions: Sequence[Action], out_dir: str | Path, *,
                            task: str | None = None) -> Path:
    """Reset ``env`` (on ``task``), run ``actions`` until done, write a trajectory directory.

    Writes ``step_<n>.png`` and ``traj.jsonl`` (a step-0 line for the first screen, then one
    line per step with the pyautogui code as ``action`` and the action language as
    ``action_text``).  Refuses a directory that already holds a trajectory.  Returns the
    directory.
    """
    out = Path(out_dir)
    if (out / TRAJ_FILE).exists():
        raise TrajectoryError(f"{out} already holds a trajectory")
    await anyio.to_thread.run_sync(lambda: out.mkdir(parents=True, exist_ok=True))
    obs = await env.reset(task)
    writer = await anyio.to_thread.run_sync(TrajectoryWriter, out)
    try:
        await anyio.to_thread.run_sync(lambda: writer.write_step(
            0, screenshot=obs.screenshot, screenshot_file="step_0.png", action=None,
            reward=0.0, done=False, instruction=obs.instruction))
        n = 0
        for action in actions:
            outcome = await env.step(action)
            step = outcome.observation.step
            await anyio.to_thread.run_sync(lambda: writer.write_step(
                step, screenshot=outcome.observation.screenshot,
                screenshot_file=f"step_{step}.png", action=to_pyautogui(action),
                action_text=format_action(action), reward=outcome.reward, done=outcome.done,
                info=outcome.info))
            n += 1
            if outcome.done:
                break
    finally:
        writer.close()
    log.info("trajectory_recorded", path=str(out), n_steps=n)
    return out
