"""``KvAgent`` deciding in this process: the engine, a one-slot ``EpisodePool`` and the event
loop it lives in (an anyio blocking portal, a background thread), driven from OSWorld's
synchronous runner with ``portal.call``.

``LocalBackend`` starts on first use: it loads the engine sized by the ``ContextPlan``
(reloaded once at the measured size when the projector costs more than its metadata said),
refuses a policy the model cannot run, then runs the pool in the portal's loop.  The pool
owns the scheduler and the task group every overlapped prefetch runs in; the next
``decide`` settles the previous step's prefetch through the driver, ``new_episode`` and
``close`` cancel it.

Close order (the invariant that makes it safe): stop the pool (prefetch cancelled, episode
and scheduler closed, no engine call in flight) → stop the loop and join its thread → free
the engine.  The backend holds no reference to the agent, so ``weakref.finalize`` can close
it when the agent is collected or at interpreter exit.  Nothing it holds outlives its
process — memory and one thread, no child process, no file — so OSWorld's workers, which end
with ``os._exit`` and never call ``close``, leak nothing.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import attrs
import structlog

from cachepolicy.context_log import Segment
from cachepolicy.engine import Engine
from cachepolicy.errors import ContextFullError, KvagentCacheError
from cachepolicy.segments import SegmentFactory
from runtime.context_budget import ContextBudgetError, blank_png, context_need
from runtime.driver import DriverStep
from runtime.engine_setup import load_engine
from runtime.osworld.backend import Decision
from runtime.osworld.config import ContextPlan, KvAgentConfig
from runtime.osworld.errors import AgentClosedError, AgentStepError
from runtime.pool import EpisodePool, PoolClosedError
from scheduler.errors import ContextFullAdmissionError, SchedulerError
from scheduler.ledger import LedgerSnapshot, MemoryLedger
from scheduler.scheduler import IMAGE_CACHE, Scheduler
from scheduler.sizes import UNLIMITED_BYTES
from vmenv.actions import Screen

log = structlog.get_logger("kvagent.osworld")

PORTAL_THREAD_PREFIX = "kvagent-portal"


@attrs.frozen
class RuntimeStatus:
    """A snapshot of an in-process agent, for logs and tests."""

    episode_id: str | None
    steps: int  # decided steps of the current episode
    prefetch_running: bool
    ledger: LedgerSnapshot
    held: dict[str, int]  # ledger holdings of the image cache and the open episode
    seqs_in_use: tuple[int, ...]  # engine sequences holding state
    summary: str
    #: the open episode's log as the model reads it: the head (system prompt, instruction)
    #: and one history line per past step (the profile's text), screenshots left out
    head: str = ""
    history: tuple[str, ...] = ()


class LocalBackend:
    """See the module docstring.  Called from one thread (OSWorld's worker)."""

    def __init__(self, config: KvAgentConfig, plan: ContextPlan) -> None:
        self.config, self.plan = config, plan
        self._running: _Running | None = None
        self._closed = False

    @property
    def started(self) -> bool:
        return self._running is not None

    @property
    def engine(self) -> Engine:
        return self._start().engine

    @property
    def server(self) -> None:
        return None  # decided here

    @property
    def n_ctx(self) -> int:
        if self._running is not None:
            return self._running.engine.config.n_ctx_per_seq
        return self.plan.n_ctx

    def start(self) -> None:
        self._start()

    def ping(self) -> None:
        self._start()  # started is ready: nothing else to ask

    def new_episode(self) -> str:
        running = self._start()
        episode_id: str = running.call(running.new_episode)
        return episode_id

    def decide(self, instruction: str, png: bytes, size: tuple[int, int],
               screen: tuple[int, int], arrived_at: float) -> Decision:
        running = self._start()
        step: DriverStep = running.call(running.decide, instruction, png, size, arrived_at)
        info = step.metrics.as_dict()
        info.pop("output_tokens")
        return Decision(step.metrics.episode_id, step.act.index, step.act.response,
                        step.act.action, info, step.metrics.critical_path_s)

    def status(self) -> RuntimeStatus:
        running = self._start()
        status: RuntimeStatus = running.call(running.status)
        return status

    def close(self) -> None:
        self._closed = True
        running, self._running = self._running, None
        if running is not None:
            running.close()

    def _start(self) -> _Running:
        if self._closed:
            raise AgentClosedError("the agent is closed")
        if self._running is None:
            self._running = _Running(self.config, self.plan)
            a = self.config.agent
            log.info("agent_started", agent=self.config.name, profile=a.profile,
                     policy=a.policy, overlap=a.overlap, window=a.window,
                     n_ctx=self._running.engine.config.n_ctx_per_seq,
                     n_threads=self._running.engine.config.n_threads)
        return self._running


class _Running:
    """The started parts: the engine, the ledger and pool, the loop thread.  Its coroutines
    run in that loop (``call``), which serialises them."""

    def __init__(self, config: KvAgentConfig, plan: ContextPlan) -> None:
        self.config = config
        probe = blank_png(config.screen_size)
        self.engine = load_engine(plan.files, lambda n: plan.engine(config, n),
                                  need=lambda e: config.need(e.image_tokens(probe)[0]),
                                  n_ctx=plan.n_ctx, derived=plan.derived)
        self._sized: set[Screen] = {config.screen_size}  # sizes the context is known to hold
        self._episode: str | None = None  # the open episode's id (its driver is the pool's)
        self._n_episodes = 0
        self._closed = False
        self._lock = threading.Lock()
        try:
            self.factory = SegmentFactory(self.engine)
            policy = config.agent.make_policy(self.factory, config.screen_size)
            self.ledger = MemoryLedger(config.memory_budget or UNLIMITED_BYTES)
            self.pool = EpisodePool(self.factory, self.ledger, max_episodes=1,
                                    options=config.agent.step_options(config.screen_size))
            self.pool.check_policy(policy)  # refuse it now, not at the first predict
            self._portal_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] = (
                anyio.from_thread.start_blocking_portal(
                    name=f"{PORTAL_THREAD_PREFIX}-{config.name}"))
            self.portal = self._portal_cm.__enter__()
        except BaseException:
            self.engine.close()
            raise
        try:
            self.thread: threading.Thread = self.portal.call(threading.current_thread)
            self._served: Future[None]
            self._served, _ = self.portal.start_task(self.pool.run, name="kvagent-pool")
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            self.engine.close()
            raise

    def call(self, fn: Any, *args: Any) -> Any:
        if self._closed:
            raise AgentClosedError("the agent is closed")
        return self.portal.call(fn, *args)

    def close(self) -> None:
        """Stop the pool, the loop, then free the engine (module docstring).  Idempotent;
        from the loop thread itself (a finalizer run by a garbage collection there) it
        cannot wait for its own loop and leaves the daemon thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if threading.current_thread() is self.thread:
            log.warning("agent_close_skipped", reason="called from the portal thread")
            return
        try:
            try:
                self.portal.call(self.pool.stop)
                self._served.result()  # the pool's run returned: prefetch gone, episode closed
            finally:
                self._portal_cm.__exit__(None, None, None)  # stops the loop, joins the thread
        finally:
            self.engine.close()
        log.info("agent_closed")

    # ------------------------------------------------------------------ in the loop

    async def new_episode(self) -> str:
        """Close the current episode's cache (if any) and name a fresh episode (its
        sequence is taken by the first ``decide``)."""
        await self._end_episode()
        self._scheduler()
        self._n_episodes += 1
        return self._episode_id()

    async def decide(self, instruction: str, png: bytes, screen: Screen,
                     arrived_at: float) -> DriverStep:
        """The critical step through the episode's driver; with overlap the next step's
        prefetch starts in the pool's task group before the action is returned."""
        self._scheduler()
        if screen not in self._sized:
            await self._check_context(png, screen)
        if self._episode is None or self._episode not in self.pool.episodes:
            self._n_episodes = max(self._n_episodes, 1)
            pooled = await self.pool.open(self._episode_id(), self.config.agent, instruction,
                                          screen, seed=self._n_episodes)
            self._episode = pooled.episode_id
        driver = self.pool.get(self._episode).driver
        try:
            return await self.pool.step(self._episode, png, arrived_at=arrived_at,
                                        screen=screen)
        except (SchedulerError, KvagentCacheError) as exc:
            hint = "" if not isinstance(exc, ContextFullError | ContextFullAdmissionError) else (
                f" (the context is sized for {self.config.max_steps} steps: raise n_ctx or "
                "max_steps, or lower the window or the screenshot size)")
            raise AgentStepError(f"step {driver.session.steps_decided} of "
                                 f"{driver.episode_id} failed: {exc}{hint}") from exc

    async def status(self) -> RuntimeStatus:
        mem = await anyio.to_thread.run_sync(self.engine.memory)
        scheduler = self._scheduler()
        pooled = self.pool.episodes.get(self._episode) if self._episode else None
        driver = pooled.driver if pooled is not None else None
        owners = [IMAGE_CACHE] + ([driver.episode_id] if driver is not None else [])
        log_ = driver.session.episode.log if driver is not None else None  # immutable

        def texts(segments: tuple[Segment, ...]) -> tuple[str, ...]:
            return tuple(self.engine.detokenize(s.tokens) for s in segments)

        head: tuple[str, ...] = ()
        history: tuple[str, ...] = ()
        if log_ is not None:  # the engine's lock may be busy: not on the loop's thread
            head = await anyio.to_thread.run_sync(texts, log_.head)
            history = await anyio.to_thread.run_sync(texts, log_.actions)
        return RuntimeStatus(
            episode_id=driver.episode_id if driver is not None else None,
            steps=driver.session.steps_decided if driver is not None else 0,
            prefetch_running=driver is not None and driver.prefetch_running,
            ledger=self.ledger.snapshot(), held={o: self.ledger.held_by(o) for o in owners},
            seqs_in_use=tuple(sorted(mem.seq_state_bytes)), summary=scheduler.summary(),
            head="".join(head), history=history)

    async def _end_episode(self) -> None:
        """Cancel the prefetch and free the episode's sequence and ledger holdings."""
        episode, self._episode = self._episode, None
        if episode is not None:
            await self.pool.close(episode)

    async def _check_context(self, png: bytes, screen: Screen) -> None:
        """Screenshots of a size the context was not sized for: do they fit?  (Asks the
        projector for the count; encodes nothing.)"""
        tokens, _ = await anyio.to_thread.run_sync(self.engine.image_tokens, png)
        need = context_need(self.config.agent, screen, tokens, steps=self.config.max_steps)
        try:
            need.check(self.engine.config.n_ctx_per_seq)
        except ContextBudgetError as exc:
            w, h = self.config.screen_size
            raise AgentStepError(f"screenshots of {screen[0]}x{screen[1]}, not the "
                                 f"{w}x{h} the agent was sized for: {exc}") from exc
        self._sized.add(screen)

    def _episode_id(self) -> str:
        return f"{self.config.name}/ep{self._n_episodes}"

    def _scheduler(self) -> Scheduler:
        try:
            return self.pool.scheduler
        except PoolClosedError:
            raise AgentClosedError("the agent's runtime is not running") from None
