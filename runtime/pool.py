"""A pool of episodes by key on one scheduler: what ``KvAgent``'s in-process backend and
``kvagent serve`` both run (httpcore's connection pool is the model: open / use / close by
key, a maximum, the least recently used idle one given back when a new one needs its slot).

``EpisodePool.run`` owns the ``Scheduler`` and one task group (where every episode's
overlapped prefetch runs) until ``stop``; episodes are opened, stepped and closed by id, each
through its own ``EpisodeDriver``.  One step of an episode runs at a time (a second
concurrent one is refused with ``EpisodeBusyError``: it is a client bug, not load).  When the
pool stops, prefetches are cancelled and every episode is closed: the ledger returns to zero.

Invariants: at most ``max_episodes`` are open; only this class adds to or removes from the
open episodes (``episodes`` is a read-only view); a busy episode is never given back.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType

import anyio
import anyio.abc
import attrs
import structlog

from cachepolicy.base import CachePolicy
from cachepolicy.segments import SegmentFactory
from runtime.config import AgentConfig
from runtime.driver import DriverStep, EpisodeDriver
from runtime.metrics import StepMetrics
from runtime.session import Teacher
from scheduler.errors import NoFreeSequenceError, NoSpareSequenceError
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import STALL_TIMEOUT_S, Scheduler
from scheduler.transaction import StepOptions

log = structlog.get_logger("kvagent.pool")


class PoolError(Exception):
    """Base class of the episode pool's errors."""


class PoolClosedError(PoolError):
    """The pool is not running."""


class UnknownEpisodeError(PoolError, KeyError):
    """No open episode has this id."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class EpisodeBusyError(PoolError):
    """A step of this episode is already running."""


class PoolFullError(PoolError):
    """Every episode slot is taken (and none is idle enough to give back)."""


#: Step records kept per pooled episode for inspection (``GET /v1/episodes/{id}``).
RECENT_STEPS = 64


@attrs.define(eq=False)
class PooledEpisode:
    driver: EpisodeDriver
    config: AgentConfig
    busy: bool = False  # a step is running
    #: the client's screen, when it differs from the screenshots (episode API's ``screen``)
    screen: tuple[int, int] | None = None
    last_used: float = attrs.Factory(time.monotonic)
    recent: deque[StepMetrics] = attrs.Factory(lambda: deque(maxlen=RECENT_STEPS))

    @property
    def episode_id(self) -> str:
        return self.driver.episode_id


class EpisodePool:
    def __init__(self, factory: SegmentFactory, ledger: MemoryLedger, *, max_episodes: int,
                 options: StepOptions = StepOptions(),
                 wait_s: float = STALL_TIMEOUT_S) -> None:
        self.factory, self.ledger, self.max_episodes = factory, ledger, max_episodes
        self._options, self._wait_s = options, wait_s
        self._scheduler: Scheduler | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._stopping: anyio.Event | None = None
        self._episodes: dict[str, PooledEpisode] = {}
        #: episodes being closed: gone from ``_episodes`` but still holding their engine
        #: sequence until the close ends (the event is set then)
        self._closing: dict[str, anyio.Event] = {}

    @property
    def episodes(self) -> Mapping[str, PooledEpisode]:
        """The open episodes by id (a read-only view)."""
        return MappingProxyType(self._episodes)

    def check_policy(self, policy: CachePolicy) -> None:
        """Refuse, before an episode opens, a policy the pool's scheduler cannot run: one
        that needs the spare sequence (kamera), which the pool does not keep."""
        if policy.requires_spare_sequence():
            raise NoSpareSequenceError(policy.name)

    def summary(self) -> str:
        """One line for logs and tests: ``Episodes: 2 open (1 busy, 1 idle) of 4``."""
        busy = sum(1 for e in self._episodes.values() if e.busy)
        return (f"Episodes: {len(self._episodes)} open ({busy} busy, "
                f"{len(self._episodes) - busy} idle) of {self.max_episodes}")

    def __repr__(self) -> str:
        return f"<EpisodePool {self.summary()}>"

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                  ) -> None:
        """Own the scheduler and the task group until ``stop``; then every episode closes."""
        self._stopping = anyio.Event()
        async with Scheduler(self.factory.engine, self.ledger, self.factory,
                             options=self._options, wait_s=self._wait_s) as scheduler:
            self._scheduler = scheduler
            try:
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    task_status.started()
                    await self._stopping.wait()
                    tg.cancel_scope.cancel()  # running prefetches are speculative: drop them
            finally:
                self._tg = None
                with anyio.CancelScope(shield=True):
                    for pooled in list(self._episodes.values()):
                        await pooled.driver.aclose()
                    self._episodes.clear()
                self._scheduler = None

    def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    @property
    def scheduler(self) -> Scheduler:
        if self._scheduler is None or self._tg is None:
            raise PoolClosedError("the episode pool is not running")
        return self._scheduler

    # ------------------------------------------------------------------ episodes

    async def open(self, episode_id: str, config: AgentConfig, instruction: str,
                   screen: tuple[int, int], *, seed: int = 0, teacher: Teacher | None = None,
                   evictable: Callable[[PooledEpisode], bool] | None = None) -> PooledEpisode:
        """Open an episode (its own sequence).  When every slot is taken, the least
        recently used idle episode that ``evictable`` allows is closed first (its next
        request starts from scratch); with none, ``PoolFullError``."""
        if episode_id in self._episodes:
            raise ValueError(f"episode {episode_id} is already open")
        while len(self._episodes) + len(self._closing) >= self.max_episodes:
            if len(self._episodes) < self.max_episodes:
                # a slot is being given back (an expired lease, another open's eviction, a
                # client's end): its sequence is free once the close ends — wait for it
                # rather than refuse an open that will fit in a moment
                await next(iter(self._closing.values())).wait()
                continue
            idle = sorted((h for h in self._episodes.values()
                           if not h.busy and evictable is not None and evictable(h)),
                          key=lambda h: h.last_used)
            if not idle:
                raise PoolFullError(f"all {self.max_episodes} episode slots are in use")
            log.info("pool_episode_evicted", episode_id=idle[0].episode_id,
                     reason="slots full: the least recently used idle episode")
            await self.close(idle[0].episode_id)
        try:  # no await from the check above to here: the slot is still free
            driver = EpisodeDriver.open(self.scheduler, self.factory, config, episode_id,
                                        instruction, screen, seed=seed, teacher=teacher)
        except NoFreeSequenceError as exc:
            raise PoolFullError(str(exc)) from exc
        pooled = self._episodes[episode_id] = PooledEpisode(driver, config)
        log.info("pool_episode_open", episode_id=episode_id, policy=config.policy,
                 open=len(self._episodes))
        return pooled

    def get(self, episode_id: str) -> PooledEpisode:
        pooled = self._episodes.get(episode_id)
        if pooled is None:
            raise UnknownEpisodeError(f"no open episode {episode_id!r}")
        return pooled

    async def step(self, episode_id: str, png: bytes, *, arrived_at: float,
                   options: StepOptions | None = None,
                   screen: tuple[int, int] | None = None) -> DriverStep:
        """One step: the driver acts on ``png`` (``screen``: its size, when it may have
        changed), settling the previous prefetch; then — with overlap — the next step's
        prefetch starts in the pool's task group."""
        return await self.decide(episode_id, lambda d: d.act(png, arrived_at=arrived_at,
                                                             options=options, screen=screen))

    async def decide(self, episode_id: str,
                  decide: Callable[[EpisodeDriver], Awaitable[DriverStep]]) -> DriverStep:
        """One step of an episode through ``decide(driver)`` (``act``, ``respond``), one at
        a time per episode, then its overlapped prefetch in the pool's task group."""
        pooled = self.get(episode_id)
        if pooled.busy:
            raise EpisodeBusyError(f"a step of episode {episode_id} is already running")
        pooled.busy = True
        try:
            step = await decide(pooled.driver)
            pooled.recent.append(step.metrics)
            if self._tg is not None:
                pooled.driver.start_prefetch(self._tg, step)
            return step
        finally:
            pooled.busy = False
            pooled.last_used = time.monotonic()

    async def close(self, episode_id: str) -> None:
        pooled = self._episodes.pop(episode_id, None)
        if pooled is None:
            return
        closed = self._closing[episode_id] = anyio.Event()
        try:
            await pooled.driver.aclose()
        finally:
            del self._closing[episode_id]
            closed.set()
        log.info("pool_episode_close", episode_id=episode_id, open=len(self._episodes))

