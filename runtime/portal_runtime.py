"""The async half of ``KvAgent``: a Scheduler and the current episode's ``EpisodeDriver``,
living in the event loop of a blocking portal (a background thread).  ``KvAgent`` drives it
from OSWorld's synchronous runner with ``portal.call``.

Ownership: ``serve`` owns the Scheduler (``async with``) and one task group, the one the
driver's prefetch runs in (started by ``decide`` after the action is decided, while OSWorld
executes it).  The next ``decide`` settles it through the driver; ``new_episode`` /
``end_episode`` and ``stop`` cancel it.  Invariant: at most one episode (one driver) is open.
"""

from __future__ import annotations

import anyio
import anyio.abc
import anyio.to_thread
import attrs
import structlog

from cachepolicy.context_log import Segment
from cachepolicy.engine import Engine
from cachepolicy.errors import ContextFullError, KvagentCacheError
from cachepolicy.segments import SegmentFactory
from runtime.actions import Screen
from runtime.config import AgentConfig
from runtime.context_budget import ContextBudgetError, context_need
from runtime.driver import DriverStep, EpisodeDriver
from scheduler.errors import SchedulerError
from scheduler.ledger import LedgerSnapshot, MemoryLedger
from scheduler.scheduler import IMAGE_CACHE, Scheduler

log = structlog.get_logger("kvagent.osworld")


class KvAgentError(Exception):
    """Base class of the OSWorld agent's errors."""


class AgentClosedError(KvAgentError):
    """The agent was closed; it takes no more calls."""


class AgentStepError(KvAgentError):
    """The engine or the scheduler could not decide this step (the episode's cache state is
    rolled back; the next ``predict`` may try again, ``reset`` starts over)."""


@attrs.frozen
class RuntimeStatus:
    """A snapshot for logs and tests."""

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


class AgentRuntime:
    """Lives in one event loop: start ``serve`` with ``portal.start_task``, call the other
    coroutines with ``portal.call``.  Not thread-safe (the loop serialises it)."""

    def __init__(self, factory: SegmentFactory, config: AgentConfig, *, budget_bytes: int,
                 name: str, screen: Screen, max_steps: int) -> None:
        self.factory, self.config, self.name = factory, config, name
        self.screen, self.max_steps = screen, max_steps  # what the context was sized for
        self._sized: set[Screen] = {screen}  # screenshot sizes the context is known to hold
        self.engine: Engine = factory.engine
        self.ledger = MemoryLedger(budget_bytes)
        self._scheduler: Scheduler | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._stopping: anyio.Event | None = None
        self._driver: EpisodeDriver | None = None
        self._n_episodes = 0

    # ------------------------------------------------------------------ lifecycle

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                    ) -> None:
        """Own the scheduler and the task group until ``stop``; on the way out the prefetch
        is cancelled and the episode and scheduler close (the ledger returns to 0)."""
        self._stopping = anyio.Event()
        async with Scheduler(self.engine, self.ledger, self.factory,
                             options=self.config.step_options(self.screen)) as scheduler:
            self._scheduler = scheduler
            try:
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    task_status.started()
                    await self._stopping.wait()
                    await self.end_episode()
            finally:
                self._tg = None
                if self._driver is not None:  # cancelled on the way: still close it
                    await self._driver.aclose()
                    self._driver = None

    def stop(self) -> None:
        """Ask ``serve`` to wind down (call from the loop; returns at once)."""
        if self._stopping is not None:
            self._stopping.set()

    # ------------------------------------------------------------------ episodes

    async def new_episode(self) -> str:
        """Close the current episode's cache (if any) and start a fresh episode id (its
        sequence is taken by the first ``decide``)."""
        await self.end_episode()
        self._running()
        self._n_episodes += 1
        return self._episode_id()

    async def end_episode(self) -> None:
        """Cancel the prefetch and free the episode's sequence and ledger holdings."""
        driver, self._driver = self._driver, None
        if driver is not None:
            await driver.aclose()

    # ------------------------------------------------------------------ steps

    async def decide(self, instruction: str, png: bytes, screen: tuple[int, int],
                     arrived_at: float) -> DriverStep:
        """The critical step through the driver; with overlap, the prefetch of the next step
        starts before the action is returned."""
        scheduler = self._running()
        driver = self._driver
        if driver is not None and driver.session.instruction != instruction:
            # A new task without reset(): its history must not leak into this one.
            log.warning("instruction_changed", episode_id=driver.episode_id)
            await self.end_episode()
            self._n_episodes += 1
            driver = None
        if screen not in self._sized:
            await self._check_context(png, screen)
        if driver is None:
            if self._n_episodes == 0:
                self._n_episodes = 1
            driver = self._driver = EpisodeDriver.open(
                scheduler, self.factory, self.config, self._episode_id(), instruction, screen,
                seed=self._n_episodes)
        elif driver.session.screen != screen:
            log.warning("screen_size_changed", episode_id=driver.episode_id,
                        old=driver.session.screen, new=screen)
            driver.session.resize(screen)  # the model decides in the pixels it sees
        try:
            step = await driver.act(png, arrived_at=arrived_at)
        except (SchedulerError, KvagentCacheError) as exc:
            hint = "" if not isinstance(exc, ContextFullError) else (
                f" (the context is sized for {self.max_steps} steps: raise n_ctx or "
                "max_steps, or lower the window or the screenshot size)")
            raise AgentStepError(f"step {driver.session.steps_decided} of "
                                 f"{driver.episode_id} failed: {exc}{hint}") from exc
        assert self._tg is not None
        driver.start_prefetch(self._tg, step)
        return step

    async def status(self) -> RuntimeStatus:
        mem = await anyio.to_thread.run_sync(self.engine.memory)
        scheduler = self._running()
        driver = self._driver
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

    async def check_integrity(self) -> None:
        """The scheduler's integrity check (ledger vs engine), between steps."""
        scheduler = self._running()
        driver = self._driver
        if driver is not None:
            await driver.cancel_prefetch()
        await anyio.to_thread.run_sync(scheduler.check_integrity)

    # ------------------------------------------------------------------ internals

    async def _check_context(self, png: bytes, screen: Screen) -> None:
        """Screenshots of a size the context was not sized for: do they fit?  (Asks the
        projector for the count; encodes nothing.)"""
        tokens, _ = await anyio.to_thread.run_sync(self.engine.image_tokens, png)
        need = context_need(self.config, screen, tokens, steps=self.max_steps)
        try:
            need.check(self.engine.config.n_ctx_per_seq)
        except ContextBudgetError as exc:
            raise AgentStepError(f"screenshots of {screen[0]}x{screen[1]}, not the "
                                 f"{self.screen[0]}x{self.screen[1]} the agent was sized "
                                 f"for: {exc}") from exc
        self._sized.add(screen)

    def _episode_id(self) -> str:
        return f"{self.name}/ep{self._n_episodes}"

    def _running(self) -> Scheduler:
        if self._scheduler is None or self._tg is None:
            raise AgentClosedError("the agent's runtime is not running")
        return self._scheduler
