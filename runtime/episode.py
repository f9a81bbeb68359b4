"""The async env loop: observe → ``driver.act`` (critical path) → the env executes the action
while the driver prefetches the next step.

One task group per episode owns the prefetch task; blocking env work is the env's business
(its methods are coroutines that offload); cancellation propagates, and the caller closes the
driver (``aclose``) in its ``finally``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio
import structlog

from runtime.driver import DriverStep, EpisodeDriver
from runtime.metrics import EpisodeResult, StepMetrics
from scheduler.errors import SchedulerError
from vmenv.actions import TERMINAL_ACTIONS, Fail
from vmenv.base import Env, Observation, StepOutcome

log = structlog.get_logger("kvagent.episode")

#: Called after every decided step: (step index, its observation, the step, the env outcome,
#: the step's final metrics); awaited when it returns an awaitable.
StepHook = Callable[[int, Observation, DriverStep, StepOutcome, StepMetrics],
                    Awaitable[None] | None]


async def run_episode(driver: EpisodeDriver, env: Env, *, task: str | None = None,
                      max_steps: int = 15, on_step: StepHook | None = None) -> EpisodeResult:
    """Run until done() / fail(), the env says done, or ``max_steps``.  A step the scheduler
    cannot admit (its typed error) ends the episode with status ``error``, recorded."""
    bound = log.bind(episode_id=driver.episode_id)
    obs = await env.reset(task)
    steps: list[StepMetrics] = []
    reward, status, error = 0.0, "max_steps", ""
    failure: Exception | None = None
    async with anyio.create_task_group() as tg:
        for t in range(max_steps):
            arrived = time.perf_counter()  # the screenshot's bytes are in hand
            try:
                step = await driver.act(obs.screenshot, arrived_at=arrived)
            except SchedulerError as exc:  # rung 4: this episode's step failed, explained
                error = f"{type(exc).__name__}: {exc}"
                bound.warning("step_failed", step=t, reason=error)
                steps.append(StepMetrics.failed(driver.episode_id, t, error,
                                                critical_path_s=time.perf_counter() - arrived))
                status = "error"
                break
            driver.start_prefetch(tg, step)
            try:
                t_env = time.perf_counter()
                outcome = await env.step(step.act.action)
                now = time.perf_counter()
                metrics = step.metrics.after_env(vm_s=now - t_env, step_wall_s=now - arrived)
                steps.append(metrics)
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
               unparsable=driver.session.unparsable)
    return EpisodeResult(driver.episode_id, task, status, reward, tuple(steps),
                         driver.session.unparsable, error)
