"""The async episode loop: observe → act (critical step) → execute in the env, with the
prefetch of the next step overlapping the env's execution.

Every task has an owner (one task group per step); blocking env work is the env's business
(its methods are coroutines that offload); cancellation propagates and the caller's
``finally`` closes the episode's cache.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import attrs
import structlog

from runtime.actions import TERMINAL_ACTIONS, Fail, format_action
from runtime.session import ActStep, AgentSession
from scheduler.errors import SchedulerError
from vmenv.base import Env, Observation, StepOutcome

log = structlog.get_logger("kvagent.episode")


@attrs.frozen
class StepResult:
    act: ActStep | None  # None when the step failed before an action was decided
    outcome: StepOutcome | None
    critical_path_s: float  # screenshot in hand → action ready
    env_s: float  # the env executing the action (VM time)
    prefetch_s: float  # the overlapped prefetch's engine time
    error: str = ""


@attrs.frozen
class EpisodeResult:
    episode_id: str
    task: str | None
    steps: tuple[StepResult, ...]
    reward: float
    status: str  # done | fail | max_steps | error

    @property
    def n_steps(self) -> int:
        return len(self.steps)


StepHook = Callable[[int, Observation, StepResult], Awaitable[None] | None]


async def run_episode(session: AgentSession, env: Env, *, task: str | None = None,
                      max_steps: int = 15,
                      on_step: StepHook | None = None) -> EpisodeResult:
    """Run until done() / fail(), the env says done, or ``max_steps``."""
    ep_id = session.episode.episode_id
    bound = log.bind(episode_id=ep_id, seq_id=session.episode.seq)
    obs = await env.reset(task)
    steps: list[StepResult] = []
    reward, status = 0.0, "max_steps"
    for t in range(max_steps):
        t0 = time.perf_counter()
        try:
            act = await session.act(obs.screenshot)
        except SchedulerError as exc:  # rung 4: this episode's step failed, explained
            bound.warning("step_failed", step=t, reason=str(exc))
            steps.append(StepResult(None, None, time.perf_counter() - t0, 0.0, 0.0, str(exc)))
            status = "error"
            break
        critical = time.perf_counter() - t0
        bound.info("step_decided", step=t, action=format_action(act.action)
                   if act.parsed else None, parsed=act.parsed,
                   prefill_tokens=act.record.prefill_tokens, critical_path_s=round(critical, 4))
        outcome, env_s, prefetch_s = await _execute(session, env, act)
        result = StepResult(act, outcome, critical, env_s, prefetch_s)
        steps.append(result)
        if on_step is not None:
            maybe = on_step(t, obs, result)
            if maybe is not None:
                await maybe
        reward = outcome.reward
        obs = outcome.observation
        if isinstance(act.action, TERMINAL_ACTIONS) or outcome.done:
            status = "fail" if isinstance(act.action, Fail) else "done"
            break
    bound.info("episode_end", status=status, reward=reward, steps=len(steps),
               unparsable=session.unparsable)
    return EpisodeResult(ep_id, task, tuple(steps), reward, status)


async def _execute(session: AgentSession, env: Env,
                   act: ActStep) -> tuple[StepOutcome, float, float]:
    """The env executes the action while (with overlap) the next step is prefetched."""
    timings: dict[str, Any] = {}

    async def prefetch() -> None:
        t = time.perf_counter()
        rec = await session.prefetch()
        timings["prefetch_s"] = rec.prefill_s if rec is not None else time.perf_counter() - t

    async with anyio.create_task_group() as tg:
        if session.overlap and not isinstance(act.action, TERMINAL_ACTIONS):
            tg.start_soon(prefetch)
        t0 = time.perf_counter()
        outcome = await env.step(act.action)
        env_s = time.perf_counter() - t0
    return outcome, env_s, timings.get("prefetch_s", 0.0)
