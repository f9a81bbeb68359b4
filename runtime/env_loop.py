"""The async env loop: observe → ``driver.act`` (critical path) → the env executes the action
while the driver prefetches the next step.

One task group per episode owns the prefetch task; blocking env work is the env's business
(its methods are coroutines that offload); cancellation propagates, and the caller closes the
driver (``aclose``) in its ``finally``.

Failures, each with a defined outcome (docs/reliability.md):

* a step the model side cannot run (the scheduler's typed errors, a screenshot the engine
  cannot decode, a context that no plan fits) is recorded as a failed step with its reason;
* an env step that raises, does not return within ``env_timeout_s``, or returns no usable
  screenshot is recorded the same way (the decided action with its measurements, status
  ``failed``) — the env's state is unknown afterwards, so the episode ends (status
  ``error``);
* an ``on_step`` hook that raises (e.g. the disk is full) ends the episode with that
  exception, raised outside the task group so callers see the cause, not a group.

Every screenshot entering the loop is verified and, when the env sent another image format,
converted to PNG (``vmenv.png.screenshot_png``), so the engine and the recorder only ever
see whole, sane PNGs of a known size.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import anyio.to_thread
import attrs
import structlog

from cachepolicy.errors import KvagentCacheError
from runtime.driver import DriverStep, EpisodeDriver
from runtime.errors import describe_error
from runtime.metrics import EpisodeResult, StepMetrics
from scheduler.errors import SchedulerError
from vmenv.actions import TERMINAL_ACTIONS, Fail
from vmenv.base import Env, Observation, StepOutcome
from vmenv.errors import EnvTimeoutError, MissingScreenshotError
from vmenv.png import screenshot_png

log = structlog.get_logger("kvagent.episode")
T = TypeVar("T")

#: Bound on one ``env.step``.  OSWorld's VM server gives an action's ``python -c`` command
#: 120 s; DesktopEnv then sleeps its ``pause`` (2 s by default) and fetches the screenshot
#: (10 s per try).  180 s lets the slowest legitimate step (a command that runs into the
#: server's own 120 s limit, the pause, a retried screenshot) finish, and still ends a hung
#: VM within three minutes.
DEFAULT_ENV_TIMEOUT_S = 180.0
#: Bound on ``env.reset``: reverting a VM snapshot and running a task's setup takes minutes
#: (OSWorld's runner then waits 60 s more before the first observation).
DEFAULT_RESET_TIMEOUT_S = 900.0

#: Called after every decided step: (step index, its observation, the step, the env outcome,
#: the step's final metrics); awaited when it returns an awaitable.
StepHook = Callable[[int, Observation, DriverStep, StepOutcome, StepMetrics],
                    Awaitable[None] | None]


async def run_episode(driver: EpisodeDriver, env: Env, *, task: str | None = None,
                      max_steps: int = 15, on_step: StepHook | None = None,
                      env_timeout_s: float | None = DEFAULT_ENV_TIMEOUT_S,
                      reset_timeout_s: float | None = DEFAULT_RESET_TIMEOUT_S,
                      ) -> EpisodeResult:
    """Run until done() / fail(), the env says done, or ``max_steps``; a failed step ends the
    episode with status ``error`` (see the module docstring).  ``env_timeout_s`` /
    ``reset_timeout_s`` bound each env call (None: unbounded).  A reset that fails or times
    out raises (no step was taken)."""
    bound = log.bind(episode_id=driver.episode_id)
    obs = await checked_observation(await _within(env.reset(task), reset_timeout_s, "reset"))
    steps: list[StepMetrics] = []
    reward, status, error = 0.0, "max_steps", ""
    failure: Exception | None = None
    async with anyio.create_task_group() as tg:
        for t in range(max_steps):
            arrived = time.perf_counter()  # the screenshot's bytes are in hand
            try:
                step = await driver.act(obs.screenshot, arrived_at=arrived, screen=obs.size)
            except (SchedulerError, KvagentCacheError) as exc:  # explained: rolled back
                error = describe_error(exc)
                bound.warning("step_failed", step=t, reason=error)
                steps.append(StepMetrics.failed(driver.episode_id, t, error,
                                                critical_path_s=time.perf_counter() - arrived))
                status = "error"
                break
            driver.start_prefetch(tg, step)
            t_env = time.perf_counter()
            try:
                outcome = await _within(env.step(step.act.action), env_timeout_s, f"step {t}")
                outcome = attrs.evolve(outcome,
                                       observation=await checked_observation(outcome.observation))
            except Exception as exc:  # noqa: BLE001  the VM failed this step: recorded
                now = time.perf_counter()
                error = describe_error(exc)
                bound.warning("env_step_failed", step=t, reason=error)
                steps.append(attrs.evolve(step.metrics.after_env(vm_s=now - t_env,
                                                                 step_wall_s=now - arrived),
                                          status="failed", reason=error))
                status = "error"
                break
            now = time.perf_counter()
            metrics = step.metrics.after_env(vm_s=now - t_env, step_wall_s=now - arrived)
            steps.append(metrics)
            try:
                if on_step is not None:
                    maybe = on_step(t, obs, step, outcome, metrics)
                    if maybe is not None:
                        await maybe
            except Exception as exc:  # noqa: BLE001  re-raised below, outside the task
                failure = exc         # group, so callers see the cause, not a group
                break
            reward, obs = outcome.reward, outcome.observation
            if isinstance(step.act.action, TERMINAL_ACTIONS) or outcome.done:
                status = "fail" if isinstance(step.act.action, Fail) else "done"
                break
        # the episode is over: a prefetch for a step that will not come is dropped
        await driver.cancel_prefetch()
    if failure is not None:
        raise failure
    bound.info("episode_end", status=status, reward=reward, steps=len(steps),
               unparsable=driver.session.unparsable, error=error or None)
    return EpisodeResult(driver.episode_id, task, status, reward, tuple(steps),
                         driver.session.unparsable, error)


async def checked_observation(obs: Observation) -> Observation:
    """``obs`` with a verified PNG screenshot and the size read from it (another image format
    is converted; the check runs in a worker thread).  Raises ``ScreenshotError``
    (``MissingScreenshotError`` for none at all) for anything that is not a whole, sane
    screenshot — empty, corrupt, a decompression bomb, absurdly large."""
    shot = obs.screenshot
    if not isinstance(shot, bytes | bytearray) or not shot:
        raise MissingScreenshotError(
            f"the env returned no screenshot (got {type(shot).__name__}"
            f"{' of 0 bytes' if isinstance(shot, bytes | bytearray) else ''})")
    png, (width, height) = await anyio.to_thread.run_sync(screenshot_png, bytes(shot))
    if png is shot and (width, height) == obs.size:
        return obs
    return attrs.evolve(obs, screenshot=png, width=width, height=height)


async def _within(call: Awaitable[T], seconds: float | None, what: str) -> T:
    """Await an env call, at most ``seconds``: EnvTimeoutError after that.  The call is
    cancelled; an env that blocks in a worker thread must let that thread be abandoned
    (``anyio.to_thread.run_sync(..., abandon_on_cancel=True)``) for this to return."""
    if seconds is None:
        return await call
    with anyio.move_on_after(seconds) as scope:
        return await call
    assert scope.cancelled_caught
    raise EnvTimeoutError(f"the env's {what} did not return within {seconds:g} s")
