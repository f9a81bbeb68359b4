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

from cachepolicy.engine import Engine
from cachepolicy.errors import KvagentCacheError
from cachepolicy.segments import SegmentFactory
from runtime.config import AgentConfig
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


class AgentRuntime:
    """Lives in one event loop: start ``serve`` with ``portal.start_task``, call the other
    coroutines with ``portal.call``.  Not thread-safe (the loop serialises it)."""

    def __init__(self, factory: SegmentFactory, config: AgentConfig, *, budget_bytes: int,
                 name: str) -> None:
        self.factory, self.config, self.name = factory, config, name
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
                             options=self.config.step_options()) as scheduler:
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
        if driver is None:
            if self._n_episodes == 0:
                self._n_episodes = 1
            driver = self._driver = EpisodeDriver.open(
                scheduler, self.factory, self.config, self._episode_id(), instruction, screen,
                seed=self._n_episodes)
        try:
            step = await driver.act(png, arrived_at=arrived_at, screen=screen)
        except (SchedulerError, KvagentCacheError) as exc:
            raise AgentStepError(f"step {driver.session.steps_decided} of "
                                 f"{driver.episode_id} failed: {exc}") from exc
        assert self._tg is not None
        driver.start_prefetch(self._tg, step)
        return step

    async def status(self) -> RuntimeStatus:
        mem = await anyio.to_thread.run_sync(self.engine.memory)
        scheduler = self._running()
        driver = self._driver
        owners = [IMAGE_CACHE] + ([driver.episode_id] if driver is not None else [])
        return RuntimeStatus(
            episode_id=driver.episode_id if driver is not None else None,
            steps=driver.session.steps_decided if driver is not None else 0,
            prefetch_running=driver is not None and driver.prefetch_running,
            ledger=self.ledger.snapshot(), held={o: self.ledger.held_by(o) for o in owners},
            seqs_in_use=tuple(sorted(mem.seq_state_bytes)), summary=scheduler.summary())

    async def check_integrity(self) -> None:
        """The scheduler's integrity check (ledger vs engine), between steps."""
        scheduler = self._running()
        driver = self._driver
        if driver is not None:
            await driver.cancel_prefetch()
        await anyio.to_thread.run_sync(scheduler.check_integrity)

    # ------------------------------------------------------------------ internals

    def _episode_id(self) -> str:
        return f"{self.name}/ep{self._n_episodes}"

    def _running(self) -> Scheduler:
        if self._scheduler is None or self._tg is None:
            raise AgentClosedError("the agent's runtime is not running")
        return self._scheduler
