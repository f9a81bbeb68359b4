"""``SimDesk``: a deterministic simulated desktop behind the ``Env`` interface.

A taskbar with Terminal and Notes launchers, windows with title bars and close buttons, a
text field, a modal dialog (see ``apply`` for how it reacts, ``tasks`` for the classic tasks;
``kinds`` draws randomized ones from a seed, named ``KIND@SEED``).  No clock and no hidden
randomness: the same task and actions give byte-identical screenshots.

Per step: apply the action to the state (pure, instant), wait ``action_latency_s`` (standing
in for the time a VM takes to execute it), render in a worker thread, evaluate the task's
checker.  ``reward`` is 1.0 whenever the checker passes (0.0 after Fail, as OSWorld's
``evaluate`` scores a final FAIL).  As in OSWorld, the episode ends on Done / Fail or after
``max_steps``, so an episode's success is the checker on its final state — an agent that
solves the task and then undoes it scores 0.  ``done_on_success`` restores the older rule
(the episode also ends the moment the checker passes: an oracle OSWorld does not have).
A step that is cancelled leaves the desktop as it was before that step.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Self

import anyio
import anyio.to_thread
import attrs
import structlog

from vmenv.actions import TERMINAL_ACTIONS, Action, Fail, NoOp, format_action
from vmenv.base import Observation, StepOutcome
from vmenv.errors import (
    EnvBusyError, EnvClosedError, EpisodeOverError, NotResetError,
)
from vmenv.simdesk.apply import apply_action
from vmenv.simdesk.lookup import resolve_task
from vmenv.simdesk.render import SECONDS_PER_STEP, render_png
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.tasks import Task, default_tasks
from vmenv.simdesk.widgets import locate

log = structlog.get_logger(__name__)

Sleep = Callable[[float], Awaitable[Any]]


@attrs.frozen
class SimDeskConfig:
    """How the simulated desktop behaves."""

    width: int = attrs.field(default=1280, validator=attrs.validators.ge(320))
    height: int = attrs.field(default=720, validator=attrs.validators.ge(240))
    action_latency_s: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    #: also end the episode when the checker passes (not OSWorld's rule: there only the
    #: agent's DONE / FAIL or max_steps end it)
    done_on_success: bool = False
    max_steps: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.ge(1)))
    default_task: str = "open-terminal"
    #: simulated seconds the taskbar clock advances a step (0: it stands still, so a step
    #: that changed nothing shows the previous screenshot's pixels)
    clock_step_s: int = attrs.field(default=SECONDS_PER_STEP, validator=attrs.validators.ge(0))


class SimDesk:
    """The simulated desktop env (implements ``vmenv.base.Env``).  One call at a time."""

    def __init__(self, config: SimDeskConfig | None = None, *,
                 tasks: Mapping[str, Task] | None = None, sleep: Sleep = anyio.sleep) -> None:
        """``tasks`` replaces the built-in tasks; ``sleep`` is what the latency awaits (tests)."""
        self.config = config or SimDeskConfig()
        self.tasks: dict[str, Task] = dict(tasks) if tasks is not None else default_tasks()
        self._sleep = sleep
        self._state: DeskState | None = None
        self._task: Task | None = None
        self._done = False
        self._busy = False
        self._closed = False
        self._limiter: anyio.CapacityLimiter | None = None  # made in the event loop

    # ------------------------------------------------------------------ inspection

    @property
    def state(self) -> DeskState:
        if self._state is None:
            raise NotResetError("call reset() first")
        return self._state

    @property
    def task(self) -> Task | None:
        return self._task

    @property
    def done(self) -> bool:
        return self._done

    def locate(self, widget: str) -> tuple[int, int]:
        """Centre of a widget on the current screen, in pixels (see ``simdesk_widgets``)."""
        return locate(self.state, widget)

    def solution(self) -> tuple[Action, ...]:
        """The current task's scripted solution, from the current state (call after reset)."""
        if self._task is None:
            raise NotResetError("call reset() first")
        return self._task.solve(self.state)

    # ------------------------------------------------------------------ Env

    async def reset(self, task: str | None = None) -> Observation:
        """Start ``task`` (default: ``config.default_task``) on a fresh desktop: a name in
        ``tasks`` or a sampled instance ``"<kind>@<seed>"`` (see ``kinds``)."""
        self._enter()
        try:
            name = task or self.config.default_task
            chosen = resolve_task(name, self.tasks)
            state = chosen.setup(DeskState.empty(self.config.width, self.config.height))
            state.check_integrity()
            png = await self._render(state)
        finally:
            self._busy = False
        self._state, self._task, self._done = state, chosen, False
        log.info("simdesk_reset", task=name, width=self.config.width, height=self.config.height)
        return self._observe(state, png)

    async def step(self, action: Action) -> StepOutcome:
        """Apply ``action``, wait the VM latency, render, evaluate the task."""
        self._enter()
        try:
            if self._state is None or self._task is None:
                raise NotResetError("call reset() before step()")
            if self._done:
                raise EpisodeOverError("the episode is over; call reset()")
            state = apply_action(self._state, action)
            state = attrs.evolve(state, step=self._state.step + 1)
            state.check_integrity()
            await self._sleep(self.config.action_latency_s)
            png = await self._render(state)
        finally:
            self._busy = False
        # a final fail() scores 0 whatever the screen shows, as in OSWorld's evaluate()
        success = bool(self._task.check(state)) and not isinstance(action, Fail)
        truncated = self.config.max_steps is not None and state.step >= self.config.max_steps
        done = (isinstance(action, TERMINAL_ACTIONS) or truncated
                or (self.config.done_on_success and success))
        self._state, self._done = state, done
        info: dict[str, Any] = {"task": self._task.name, "success": success,
                                "action": format_action(action), "truncated": truncated}
        if isinstance(action, NoOp):
            info["noop_reason"] = action.reason
        log.debug("simdesk_step", task=self._task.name, step=state.step, action=action.kind,
                  success=success, done=done)
        if done:
            log.info("simdesk_episode_done", task=self._task.name, steps=state.step,
                     success=success, truncated=truncated)
        return StepOutcome(self._observe(state, png), 1.0 if success else 0.0, done, info)

    async def close(self) -> None:
        """Close the env (idempotent)."""
        self._closed = True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ internals

    def _enter(self) -> None:
        if self._closed:
            raise EnvClosedError("the simulated desktop is closed")
        if self._busy:
            raise EnvBusyError("another reset/step of this env is running")
        self._busy = True

    async def _render(self, state: DeskState) -> bytes:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        return await anyio.to_thread.run_sync(
            functools.partial(render_png, state, clock_step_s=self.config.clock_step_s),
            limiter=self._limiter)

    def _observe(self, state: DeskState, png: bytes) -> Observation:
        assert self._task is not None
        return Observation(screenshot=png, width=state.metrics.width, height=state.metrics.height,
                           instruction=self._task.instruction, step=state.step)
