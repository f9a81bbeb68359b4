"""Run N agent episodes through one engine, scheduler and memory ledger — concurrently, or one
after another (``sequential``) in the same scheduler.

Each episode owns an env and an ``EpisodeDriver`` (its session and cache sequence); they share
the engine, the ``Scheduler`` (critical path before prefetch, admission against one budget)
and the ``MemoryLedger``.  ``kvagent run`` and every ``kvagent bench`` arm run through here.
Episodes are recorded in OSWorld's layout as they go (``runtime.run.recording``, when a layout is
given) and report ``EpisodeEvent``s to an ``on_event`` callback (progress).

Failure isolation: an exception in one episode is logged, recorded (an ``Error`` traj line
with its real cause, ``runtime.errors.describe_error``) and reported as that episode's
outcome; the others go on.  Cancellation is never swallowed: the per-episode ``finally``
closes the env, the driver and the files, shielded.

``result.txt`` is written only for an episode that ended without error (done, fail or
max_steps), as OSWorld's runner does: an episode that ended in an error — by exception, a
failed step or a VM timeout — has none, so a rerun into the same result dir retries it
(``runtime.run.result_dir``).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import attrs
import structlog

from cachepolicy.engine import Engine
from cachepolicy.segments import SegmentFactory
from runtime.config import AgentConfig
from runtime.context_budget import ContextNeed, context_need
from runtime.driver import DriverStep, EpisodeDriver
from runtime.env_loop import DEFAULT_ENV_TIMEOUT_S, run_episode
from runtime.errors import describe_error
from runtime.metrics import EpisodeResult, StepMetrics
from runtime.run.recording import EpisodeRecorder, ResultLayout
from runtime.run.success import OSWORLD_RULE, success_rule
from runtime.session import Teacher
from scheduler.ledger import MemoryLedger
from scheduler.release import STALL_TIMEOUT_S
from scheduler.scheduler import Scheduler
from scheduler.sizes import UNLIMITED_BYTES
from vmenv.actions import to_pyautogui
from vmenv.base import Env, Observation, StepOutcome
from vmenv.simdesk.env import SimDesk, SimDeskConfig
from vmenv.simdesk.lookup import resolve_task
from vmenv.simdesk.render import SECONDS_PER_STEP
from vmenv.simdesk.tasks import default_tasks

log = structlog.get_logger("kvagent.run")
_pos = attrs.validators.ge(1)


@attrs.frozen
class RunConfig:
    """What to run.  ``tasks`` are cycled over the episodes (episode i gets task i mod n)."""

    agent: AgentConfig = attrs.Factory(AgentConfig)
    episodes: int = attrs.field(default=3, validator=_pos)
    tasks: tuple[str, ...] = attrs.field(default=tuple(default_tasks()), converter=tuple,
                                         validator=attrs.validators.min_len(1))
    max_steps: int = attrs.field(default=8, validator=_pos)
    screen: tuple[int, int] = (640, 384)  # the shipped agents' screen (20 x 12 cells of 32 px)
    vm_seconds: float = attrs.field(default=0.3, validator=attrs.validators.ge(0.0))
    #: simdesk's clock: simulated seconds a step (0: still, so unchanged screens repeat)
    clock_step_s: int = attrs.field(default=SECONDS_PER_STEP, validator=attrs.validators.ge(0))
    memory_budget: int = attrs.field(default=UNLIMITED_BYTES, validator=_pos)
    #: the scheduler's wait for memory: a stall timeout (no job's progress this long)
    wait_s: float = STALL_TIMEOUT_S
    #: bound of one env step (None: unbounded); see ``runtime.env_loop``
    env_timeout_s: float | None = attrs.field(
        default=DEFAULT_ENV_TIMEOUT_S,
        validator=attrs.validators.optional(attrs.validators.gt(0.0)))
    #: simdesk also ends an episode when its checker passes (False: OSWorld's rule, only
    #: done() / fail() or max_steps end it; ``runtime.run.success``)
    stop_on_success: bool = False

    @property
    def success_rule(self) -> str:
        """The rule its success figures are counted by: ``osworld`` or ``stop-on-success``."""
        return success_rule(self.stop_on_success)

    def context_need(self, image_tokens: int) -> ContextNeed:
        """Positions one episode's sequence may need (the engine's ``n_ctx_per_seq``: see
        ``runtime.context_budget``) with screenshots of ``image_tokens`` tokens."""
        return context_need(self.agent, self.screen, image_tokens, steps=self.max_steps)


@attrs.frozen
class EpisodeSpec:
    """One episode to run: its id, env task, result-directory name and instruction."""

    index: int
    episode_id: str
    task: str
    task_id: str  # the directory name in the result layout
    instruction: str
    screen: tuple[int, int] | None = None  # None: the run's ``screen``


def simdesk_specs(config: RunConfig) -> tuple[EpisodeSpec, ...]:
    """Episode i runs ``config.tasks[i % n]`` of the simulated desktop: a classic task's name
    or a sampled instance's (``KIND@SEED``, see ``vmenv.simdesk.resolve_task``); raises
    ``UnknownTaskError`` for a name that is neither."""
    known, n = default_tasks(), len(config.tasks)
    return tuple(EpisodeSpec(i, f"ep{i}", t, f"{t}-ep{i}", resolve_task(t, known).instruction)
                 for i, t in ((i, config.tasks[i % n]) for i in range(config.episodes)))


def simdesk_env(config: RunConfig) -> Callable[[EpisodeSpec], Env]:
    """A fresh simulated desktop per episode, ``vm_seconds`` per action, ending its episodes
    by ``config.success_rule``."""
    w, h = config.screen
    return lambda spec: SimDesk(SimDeskConfig(width=w, height=h,
                                              action_latency_s=config.vm_seconds,
                                              done_on_success=config.stop_on_success,
                                              clock_step_s=config.clock_step_s))


@attrs.frozen
class EpisodeEvent:
    """A progress report: ``kind`` is start | step | end."""

    kind: str
    spec: EpisodeSpec
    max_steps: int
    step: int = 0  # steps done
    metrics: StepMetrics | None = None  # on step: the step's measurements
    status: str = ""  # on end: done | fail | max_steps | error
    reward: float | None = None
    error: str = ""
    summary: str = ""  # the scheduler's one-line state when the event happened

    @property
    def action(self) -> str:
        """The step's action in the action language ("" for a NoOp or no step)."""
        return (self.metrics.action or "") if self.metrics is not None else ""

    @property
    def cache_hit(self) -> float | None:
        return self.metrics.cache_hit if self.metrics is not None else None

    @property
    def critical_path_s(self) -> float | None:
        return self.metrics.critical_path_s if self.metrics is not None else None



@attrs.frozen
class RunResult:
    """Every episode's result (in spec order) and the run's totals."""

    episodes: tuple[EpisodeResult, ...]
    wall_s: float
    ledger_peak_bytes: int
    counters: dict[str, int]
    summary: str  # the scheduler's summary line at the end
    directories: dict[str, Path] = attrs.Factory(dict)  # episode id → its result directory
    success_rule: str = OSWORLD_RULE  # what ended the episodes (``runtime.run.success``)

    @property
    def errors(self) -> tuple[EpisodeResult, ...]:
        return tuple(e for e in self.episodes if e.status == "error")


async def run_agents(engine: Engine, config: RunConfig, layout: ResultLayout | None, *,
                     specs: Sequence[EpisodeSpec] | None = None,
                     make_env: Callable[[EpisodeSpec], Env] | None = None,
                     teacher: Callable[[EpisodeSpec], Teacher | None] | None = None,
                     sequential: bool = False,
                     on_event: Callable[[EpisodeEvent], None] | None = None) -> RunResult:
    """Run ``specs`` (default: ``simdesk_specs(config)``); record into ``layout`` (None:
    record nothing).  ``teacher(spec)`` gives an episode's teacher forcing (replays).
    Configuration errors (a policy the model cannot run, an unsafe task id) raise before
    any episode starts or any file is written."""
    specs = tuple(specs if specs is not None else simdesk_specs(config))
    make_env = make_env or simdesk_env(config)
    factory = SegmentFactory(engine)
    # refuses a policy this model cannot run, up front
    policy = config.agent.make_policy(factory, config.screen)
    if layout is not None:
        for spec in specs:
            layout.task_dir(spec.task_id)
    options = config.agent.step_options(config.screen)
    ledger = MemoryLedger(config.memory_budget)
    t0 = time.perf_counter()
    async with Scheduler(engine, ledger, factory, options=options, wait_s=config.wait_s,
                         spare_sequence=policy.manifest.needs_scratch_sequence) as sched:
        results, directories = await run_on(sched, config, layout, specs, make_env,
                                            teacher=teacher, sequential=sequential,
                                            on_event=on_event)
        summary, counters = sched.summary(), dict(sched.counters)
    return RunResult(results, time.perf_counter() - t0, ledger.snapshot().peak, counters,
                     summary, directories, config.success_rule)


async def run_on(sched: Scheduler, config: RunConfig, layout: ResultLayout | None,
                 specs: Sequence[EpisodeSpec], make_env: Callable[[EpisodeSpec], Env], *,
                 teacher: Callable[[EpisodeSpec], Teacher | None] | None = None,
                 sequential: bool = False,
                 on_event: Callable[[EpisodeEvent], None] | None = None,
                 ) -> tuple[tuple[EpisodeResult, ...], dict[str, Path]]:
    """The episodes of ``specs`` on an existing scheduler (``run_agents`` makes one); their
    results in spec order and where each was recorded."""
    runner = _Runner(sched, sched.factory, config, layout, make_env, teacher, on_event)
    outcomes: dict[int, EpisodeResult] = {}
    directories: dict[str, Path] = {}

    async def one(spec: EpisodeSpec) -> None:
        outcomes[spec.index], directory = await runner.episode(spec)
        if directory is not None:
            directories[spec.episode_id] = directory

    if sequential:
        for spec in specs:
            await one(spec)
    else:
        async with anyio.create_task_group() as tg:
            for spec in specs:
                tg.start_soon(one, spec)
    return tuple(outcomes[s.index] for s in specs), directories


def _while_closing(exc: BaseException) -> str:
    return f"while closing the episode: {describe_error(exc)}"


@attrs.define
class _Runner:
    """What every episode of one run shares; ``episode`` runs one of them."""

    sched: Scheduler
    factory: SegmentFactory
    config: RunConfig
    layout: ResultLayout | None
    make_env: Callable[[EpisodeSpec], Env]
    teacher: Callable[[EpisodeSpec], Teacher | None] | None
    on_event: Callable[[EpisodeEvent], None] | None
    io: anyio.CapacityLimiter = attrs.Factory(lambda: anyio.CapacityLimiter(1))  # file I/O

    def emit(self, kind: str, spec: EpisodeSpec, **kw: Any) -> None:
        if self.on_event is not None:
            self.on_event(EpisodeEvent(kind, spec, self.config.max_steps,
                                       summary=self.sched.summary(), **kw))

    async def episode(self, spec: EpisodeSpec) -> tuple[EpisodeResult, Path | None]:
        config, bound = self.config, log.bind(episode_id=spec.episode_id, task=spec.task)
        recorder: EpisodeRecorder | None = None
        env: Env | None = None
        driver: EpisodeDriver | None = None
        steps: list[StepMetrics] = []

        async def disk(method: str, *args: Any, **kw: Any) -> None:
            """A recorder call in a worker thread (nothing when not recording)."""
            if recorder is not None:
                fn = partial(getattr(recorder, method), *args, **kw)
                await anyio.to_thread.run_sync(fn, limiter=self.io)

        async def on_step(t: int, _obs: Observation, step: DriverStep, out: StepOutcome,
                          metrics: StepMetrics) -> None:
            steps.append(metrics)
            started = dt.datetime.now() - dt.timedelta(seconds=metrics.vm_s)
            await disk("record_step", step_num=t + 1, action=to_pyautogui(step.act.action),
                       response=step.act.response, reward=out.reward, done=out.done,
                       info=out.info, screenshot=out.observation.screenshot,
                       metrics=metrics.as_dict(), timestamp=started)
            self.emit("step", spec, step=t + 1, metrics=metrics)

        result: EpisodeResult
        try:
            if self.layout is not None:
                recorder = await anyio.to_thread.run_sync(
                    EpisodeRecorder.create, self.layout, spec.task_id, limiter=self.io)
            env = self.make_env(spec)
            driver = EpisodeDriver.open(
                self.sched, self.factory, config.agent, spec.episode_id, spec.instruction,
                spec.screen or config.screen, seed=spec.index,
                teacher=self.teacher(spec) if self.teacher is not None else None)
            self.emit("start", spec)
            result = await run_episode(driver, env, task=spec.task,
                                       max_steps=config.max_steps, on_step=on_step,
                                       env_timeout_s=config.env_timeout_s)
            last = result.steps[-1] if result.steps else None
            if last is not None and last.status == "failed":  # an explained step failure
                await disk("record_metrics", {"step_num": result.n_steps, **last.as_dict()})
                await disk("record_error", f"{spec.task_id} - {last.reason}")
        except Exception as exc:  # noqa: BLE001  this episode only; cancellation passes
            result = await self._failed(spec, exc, steps, driver, disk, bound)
        finally:
            # Closing happens whatever ended the episode (cancellation included), shielded;
            # what goes wrong while closing is this episode's error, never the run's.
            with anyio.CancelScope(shield=True):
                closing = await self._close(env, driver, bound)
                if closing is not None:  # while the recorder still takes a line
                    await self._record_error(spec, _while_closing(closing), disk, bound)
                if recorder is not None:
                    try:
                        await anyio.to_thread.run_sync(recorder.close, limiter=self.io)
                    except Exception as exc:  # noqa: BLE001  e.g. a flush on a full disk
                        bound.error("episode_close_error", part="recorder",
                                    error=describe_error(exc))
                        closing = closing or exc
        if closing is not None and result.status != "error":
            result = self._error_result(spec, _while_closing(closing), steps, driver)
        if result.status != "error":  # an error leaves no result: a rerun retries it
            try:  # the last file written, once everything else is closed
                await disk("finish", result.reward)
            except Exception as exc:  # noqa: BLE001  e.g. the disk filled at the end
                message = f"while writing its result: {describe_error(exc)}"
                bound.error("episode_error", error=message, steps=len(steps))
                result = self._error_result(spec, message, steps, driver)
        self.emit("end", spec, step=result.n_steps, status=result.status,
                  reward=result.reward, error=result.error)
        return result, recorder.directory if recorder is not None else None

    async def _failed(self, spec: EpisodeSpec, exc: BaseException, steps: list[StepMetrics],
                      driver: EpisodeDriver | None, disk: Any, bound: Any) -> EpisodeResult:
        """The episode's result for an exception: logged with its cause and recorded as an
        ``Error`` traj line."""
        message = describe_error(exc)
        bound.error("episode_error", error=message, steps=len(steps))
        await self._record_error(spec, message, disk, bound)
        return self._error_result(spec, message, steps, driver)

    @staticmethod
    def _error_result(spec: EpisodeSpec, message: str, steps: list[StepMetrics],
                      driver: EpisodeDriver | None) -> EpisodeResult:
        return EpisodeResult(spec.episode_id, spec.task, "error", 0.0, tuple(steps),
                             driver.session.unparsable if driver else 0, message)

    @staticmethod
    async def _record_error(spec: EpisodeSpec, message: str, disk: Any, bound: Any) -> None:
        """An ``Error`` traj line, best effort (the disk may be what failed), shielded."""
        with anyio.CancelScope(shield=True):
            try:
                await disk("record_error", f"{spec.task_id} - {message}")
            except Exception as again:  # noqa: BLE001  e.g. disk full: logged, not raised
                bound.error("recording_error", error=describe_error(again))

    async def _close(self, env: Env | None, driver: EpisodeDriver | None,
                     bound: Any) -> Exception | None:
        """Close the env and the driver (its sequence and ledger holdings); every one is
        closed even if another fails.  The first failure is returned (and logged)."""
        first: Exception | None = None
        for what, close in (("env", env.close if env is not None else None),
                            ("driver", driver.aclose if driver is not None else None)):
            if close is None:
                continue
            try:
                await close()
            except Exception as exc:  # noqa: BLE001  this episode's error, not the run's
                bound.error("episode_close_error", part=what, error=describe_error(exc))
                first = first or exc
        return first
