"""Run N agent episodes concurrently through one engine, scheduler and memory ledger.

Each episode owns an env, an ``AgentSession`` and an ``EpisodeCache`` (its sequence); they
share the engine, the ``Scheduler`` (critical path before prefetch, admission against one
budget) and the ``MemoryLedger``.  Episodes are recorded in OSWorld's layout as they go
(``runtime.recording``) and report ``EpisodeEvent``s to an ``on_event`` callback (progress).

Failure isolation: an exception in one episode is logged, recorded (an ``Error`` traj line)
and reported as that episode's outcome; the others go on.  Cancellation is never swallowed:
the per-episode ``finally`` closes the env, the episode cache and the files, shielded.
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

from cachepolicy.base import make_policy
from cachepolicy.engine import Engine
from cachepolicy.sampling import SamplingParams
from cachepolicy.segments import SegmentFactory, model_info
from runtime.actions import (
    CoordConvention, action_grammar, format_action, max_action_chars, to_pyautogui,
)
from runtime.episode import EpisodeResult, StepResult, run_episode
from runtime.progress import EpisodeEvent
from runtime.recording import EpisodeRecorder, ResultLayout
from runtime.session import SYSTEM_PROMPT, AgentSession
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler
from scheduler.transaction import StepOptions
from vmenv.base import Env, Observation
from vmenv.simdesk import SimDesk, SimDeskConfig
from vmenv.simdesk_tasks import default_tasks

log = structlog.get_logger("kvagent.run")
_pos = attrs.validators.ge(1)


@attrs.frozen
class AgentRunConfig:
    """What to run.  ``tasks`` are cycled over the episodes (episode i gets task i mod n)."""

    episodes: int = attrs.field(default=3, validator=_pos)
    tasks: tuple[str, ...] = attrs.field(default=tuple(default_tasks()), converter=tuple,
                                         validator=attrs.validators.min_len(1))
    policy: str = "terminal-slot"
    overlap: bool = True
    max_steps: int = attrs.field(default=8, validator=_pos)
    window: int = attrs.field(default=3, validator=_pos)
    temperature: float = attrs.field(default=1.0, validator=attrs.validators.ge(0.0))
    seed: int = 0
    screen: tuple[int, int] = (640, 360)
    vm_seconds: float = attrs.field(default=0.3, validator=attrs.validators.ge(0.0))
    memory_budget: int = attrs.field(default=1 << 40, validator=_pos)
    wait_s: float = 2.0  # bound of the scheduler's wait-for-memory rung
    convention: CoordConvention = CoordConvention.ABSOLUTE

    @property
    def decode_tokens(self) -> int:
        # the grammar bounds an action's characters; a token is at least one character
        return max_action_chars(self.convention) + 1

    def step_options(self) -> StepOptions:
        """Grammar-constrained sampling: every decoded action parses."""
        sampling = SamplingParams(temperature=self.temperature, seed=self.seed,
                                  grammar=action_grammar(self.convention))
        scratch = self.episodes if self.policy == "relocate" else None  # drift measurement
        return StepOptions(decode_tokens=self.decode_tokens, stop_at_eog=True,
                           sampling=sampling, scratch_seq=scratch)

    def context_tokens(self, image_tokens: int, *, bounded: bool = True) -> int:
        """Positions one episode's sequence may need (the engine's ``n_ctx_per_seq``):
        the head, every step's action line, the visible screenshots, the decoded action."""
        shots = min(self.window, self.max_steps) if bounded else self.max_steps
        head = len(SYSTEM_PROMPT) + 512  # bytes bound tokens; room for instruction, template
        per_action = max_action_chars(self.convention) + 24  # "Step i: <action>\n"
        per_shot = image_tokens + 64  # "Screenshot i:", projector markers, turn wrappers
        need = head + self.max_steps * per_action + shots * per_shot + self.decode_tokens
        return -(-need // 256) * 256


@attrs.frozen
class EpisodeSpec:
    """One episode to run: its id, env task, result-directory name and instruction."""

    index: int
    episode_id: str
    task: str
    task_id: str  # the directory name in the result layout
    instruction: str


def simdesk_specs(config: AgentRunConfig) -> tuple[EpisodeSpec, ...]:
    """Episode i runs ``config.tasks[i % n]`` of the simulated desktop."""
    known, n = default_tasks(), len(config.tasks)
    return tuple(EpisodeSpec(i, f"ep{i}", t, f"{t}-ep{i}", known[t].instruction)
                 for i, t in ((i, config.tasks[i % n]) for i in range(config.episodes)))


def simdesk_env(config: AgentRunConfig) -> Callable[[EpisodeSpec], Env]:
    """A fresh simulated desktop per episode, ``vm_seconds`` per action."""
    w, h = config.screen
    return lambda spec: SimDesk(SimDeskConfig(width=w, height=h,
                                              action_latency_s=config.vm_seconds))


@attrs.frozen
class EpisodeOutcome:
    """How one episode went; ``metrics`` are its metrics.jsonl rows."""

    spec: EpisodeSpec
    status: str  # done | fail | max_steps | error
    reward: float
    steps: int
    unparsable: int
    error: str
    metrics: tuple[dict[str, Any], ...]
    directory: Path | None

    def mean(self, key: str) -> float | None:
        values = [m[key] for m in self.metrics if isinstance(m.get(key), int | float)]
        return sum(values) / len(values) if values else None


@attrs.frozen
class RunResult:
    """Every episode's outcome (in spec order) and the run's totals."""

    episodes: tuple[EpisodeOutcome, ...]
    wall_s: float
    ledger_peak_bytes: int
    counters: dict[str, int]
    summary: str  # the scheduler's summary line at the end

    @property
    def errors(self) -> tuple[EpisodeOutcome, ...]:
        return tuple(e for e in self.episodes if e.status == "error")


def metrics_row(t: int, step: StepResult) -> dict[str, Any]:
    """kvagent's measurements of one step: the transaction record plus the loop's timings."""
    row: dict[str, Any] = {"step": t}
    prefetch_tokens = 0
    if step.act is not None:
        row.update(step.act.record.as_dict())
        if step.act.prefetch is not None:
            prefetch_tokens = step.act.prefetch.prefill_tokens
        row["parsed"] = step.act.parsed
    else:
        row.update(status="failed", reason=step.error)
    crit = row.get("critical_path_prefill_tokens", 0)
    row.update(critical_path_s=step.critical_path_s, env_s=step.env_s,
               prefetch_s=step.prefetch_s, prefetch_prefill_tokens=prefetch_tokens,
               total_prefill_tokens=crit + prefetch_tokens)
    return row


async def run_agents(engine: Engine, config: AgentRunConfig, layout: ResultLayout | None, *,
                     specs: Sequence[EpisodeSpec] | None = None,
                     make_env: Callable[[EpisodeSpec], Env] | None = None,
                     on_event: Callable[[EpisodeEvent], None] | None = None) -> RunResult:
    """Run ``specs`` (default: ``simdesk_specs(config)``) concurrently; record into
    ``layout`` (None: record nothing).  Configuration errors (unknown or refused policy,
    an unsafe task id) raise before any episode starts or any file is written."""
    specs = tuple(specs if specs is not None else simdesk_specs(config))
    make_env = make_env or simdesk_env(config)
    factory = SegmentFactory(engine)
    info = model_info(engine)

    def policy() -> Any:
        return make_policy(config.policy, info, factory.kit, window=config.window,
                           decode_tokens=config.decode_tokens)

    policy()  # refuses unknown / unsupported policies up front
    if layout is not None:
        for spec in specs:
            layout.task_dir(spec.task_id)
    ledger = MemoryLedger(config.memory_budget)
    outcomes: dict[int, EpisodeOutcome] = {}
    t0 = time.perf_counter()
    async with Scheduler(engine, ledger, factory, options=config.step_options(),
                         wait_s=config.wait_s) as sched:
        runner = _Runner(sched, factory, policy, config, layout, make_env, on_event)

        async def one(spec: EpisodeSpec) -> None:
            outcomes[spec.index] = await runner.episode(spec)

        async with anyio.create_task_group() as tg:
            for spec in specs:
                tg.start_soon(one, spec)
        summary, counters = sched.summary(), dict(sched.counters)
    ledger.check_integrity()
    return RunResult(tuple(outcomes[s.index] for s in specs), time.perf_counter() - t0,
                     ledger.snapshot().peak, counters, summary)


@attrs.define
class _Runner:
    """What every episode of one run shares; ``episode`` runs one of them."""

    sched: Scheduler
    factory: SegmentFactory
    policy: Callable[[], Any]
    config: AgentRunConfig
    layout: ResultLayout | None
    make_env: Callable[[EpisodeSpec], Env]
    on_event: Callable[[EpisodeEvent], None] | None
    io: anyio.CapacityLimiter = attrs.Factory(lambda: anyio.CapacityLimiter(1))  # file I/O

    def emit(self, kind: str, spec: EpisodeSpec, **kw: Any) -> None:
        if self.on_event is not None:
            self.on_event(EpisodeEvent(kind, spec, self.config.max_steps,
                                       summary=self.sched.summary(), **kw))

    async def episode(self, spec: EpisodeSpec) -> EpisodeOutcome:
        config, bound = self.config, log.bind(episode_id=spec.episode_id, task=spec.task)
        recorder: EpisodeRecorder | None = None
        env: Env | None = None
        cache = None
        session: AgentSession | None = None
        rows: list[dict[str, Any]] = []

        async def disk(method: str, *args: Any, **kw: Any) -> None:
            """A recorder call in a worker thread (nothing when not recording)."""
            if recorder is not None:
                fn = partial(getattr(recorder, method), *args, **kw)
                await anyio.to_thread.run_sync(fn, limiter=self.io)

        async def on_step(t: int, _obs: Observation, step: StepResult) -> None:
            assert step.act is not None and step.outcome is not None
            rows.append(row := metrics_row(t, step))
            out, rec = step.outcome, step.act.record
            started = dt.datetime.now() - dt.timedelta(seconds=step.env_s)
            await disk("record_step", step_num=t + 1, action=to_pyautogui(step.act.action),
                       response=step.act.response, reward=out.reward, done=out.done,
                       info=out.info, screenshot=out.observation.screenshot, metrics=row,
                       timestamp=started)
            seen = rec.reused_tokens + rec.prefill_tokens
            self.emit("step", spec, step=t + 1, action=format_action(step.act.action),
                      cache_hit=rec.reused_tokens / seen if seen else None,
                      critical_path_s=step.critical_path_s)

        try:
            if self.layout is not None:
                recorder = await anyio.to_thread.run_sync(
                    EpisodeRecorder.create, self.layout, spec.task_id, limiter=self.io)
            env = self.make_env(spec)
            cache = self.sched.open_episode(spec.episode_id, self.policy(), seed=spec.index)
            session = AgentSession(self.sched, self.factory, cache, spec.instruction,
                                   config.screen, convention=config.convention,
                                   overlap=config.overlap)
            self.emit("start", spec)
            result: EpisodeResult = await run_episode(
                session, env, task=spec.task, max_steps=config.max_steps, on_step=on_step)
            last = result.steps[-1] if result.steps else None
            if last is not None and last.act is None:  # an explained step failure (rung 4)
                rows.append(metrics_row(len(result.steps) - 1, last))
                await disk("record_metrics", {"step_num": len(result.steps), **rows[-1]})
                await disk("record_error", f"{spec.task_id} - {last.error}")
            await disk("finish", result.reward)
            outcome = EpisodeOutcome(spec, result.status, result.reward, result.n_steps,
                                     session.unparsable, last.error if last else "",
                                     tuple(rows), recorder.directory if recorder else None)
        except Exception as exc:  # noqa: BLE001  this episode only; cancellation passes
            message = f"{type(exc).__name__}: {exc}"
            bound.error("episode_error", error=message, steps=len(rows))
            with anyio.CancelScope(shield=True):
                try:
                    await disk("record_error", f"{spec.task_id} - {message}")
                except Exception as again:  # noqa: BLE001  e.g. disk full: logged, not raised
                    bound.error("recording_error", error=f"{type(again).__name__}: {again}")
            outcome = EpisodeOutcome(spec, "error", 0.0, len(rows),
                                     session.unparsable if session else 0, message,
                                     tuple(rows), recorder.directory if recorder else None)
        finally:
            with anyio.CancelScope(shield=True):
                if env is not None:
                    await env.close()
                if cache is not None:
                    await self.sched.close_episode(cache)
                if recorder is not None:
                    recorder.close()
        self.emit("end", spec, step=outcome.steps, status=outcome.status,
                  reward=outcome.reward, error=outcome.error)
        return outcome
