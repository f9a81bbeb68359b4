"""The async half of an in-process ``KvAgent``: an ``EpisodePool`` with one episode slot (the
scheduler, the task group the prefetch runs in, the episode's ``EpisodeDriver``), living in
the event loop of a blocking portal (a background thread).  ``KvAgent`` drives it from
OSWorld's synchronous runner with ``portal.call``.

This is ``kvagent serve``'s host reduced to one episode at a time and what OSWorld's agent
contract adds: a new episode per ``reset`` (or per new instruction), a context check for
screenshot sizes the agent was not sized for, and typed errors.  Ownership: ``serve`` runs
the host until ``stop``; the next ``decide`` settles the previous step's prefetch through
the driver; ``new_episode`` / ``end_episode`` and ``stop`` cancel it.
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
from runtime.pool import EpisodePool, PoolClosedError
from scheduler.errors import ContextFullAdmissionError, SchedulerError
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
        self.host = EpisodePool(factory, self.ledger, max_episodes=1,
                                options=config.step_options(screen))
        self._episode: str | None = None  # the open episode's id (its driver is the host's)
        self._n_episodes = 0

    # ------------------------------------------------------------------ lifecycle

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                    ) -> None:
        """Run the host until ``stop``; on the way out the prefetch is cancelled and the
        episode and scheduler close (the ledger returns to 0)."""
        await self.host.run(task_status=task_status)

    def stop(self) -> None:
        """Ask ``serve`` to wind down (call from the loop; returns at once)."""
        self.host.stop()

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
        episode, self._episode = self._episode, None
        if episode is not None:
            await self.host.close(episode)

    # ------------------------------------------------------------------ steps

    async def decide(self, instruction: str, png: bytes, screen: tuple[int, int],
                     arrived_at: float) -> DriverStep:
        """The critical step through the driver; with overlap, the prefetch of the next step
        starts (in the host's task group) before the action is returned."""
        self._running()
        driver = self._driver()
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
            hosted = await self.host.open(self._episode_id(), self.config, instruction,
                                          screen, seed=self._n_episodes)
            self._episode, driver = hosted.episode_id, hosted.driver
        try:
            return await self.host.step(driver.episode_id, png, arrived_at=arrived_at,
                                        screen=screen)
        except (SchedulerError, KvagentCacheError) as exc:
            hint = "" if not isinstance(exc, ContextFullError | ContextFullAdmissionError) else (
                f" (the context is sized for {self.max_steps} steps: raise n_ctx or "
                "max_steps, or lower the window or the screenshot size)")
            raise AgentStepError(f"step {driver.session.steps_decided} of "
                                 f"{driver.episode_id} failed: {exc}{hint}") from exc

    async def status(self) -> RuntimeStatus:
        mem = await anyio.to_thread.run_sync(self.engine.memory)
        scheduler = self._running()
        driver = self._driver()
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
        driver = self._driver()
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

    def _driver(self) -> EpisodeDriver | None:
        hosted = self.host.episodes.get(self._episode) if self._episode is not None else None
        return hosted.driver if hosted is not None else None

    def _episode_id(self) -> str:
        return f"{self.name}/ep{self._n_episodes}"

    def _running(self) -> Scheduler:
        try:
            return self.host.scheduler
        except PoolClosedError:
            raise AgentClosedError("the agent's runtime is not running") from None
