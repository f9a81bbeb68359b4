"""The scheduler's per-episode bookkeeping, priorities and the engine-holding helper."""

from __future__ import annotations

import enum
import threading
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from cachepolicy.context_log import Segment
from scheduler.transaction import EpisodeCache

if TYPE_CHECKING:
    from scheduler.scheduler import Scheduler

IMAGE_CACHE = "image_cache"  # the ledger owner of the engine's embedding cache


class Priority(enum.IntEnum):
    CRITICAL = 0  # an agent is waiting for this action
    PREFETCH = 1  # speculative work while the VM runs; preempted by critical work


class Phase(enum.Enum):
    IDLE = "idle"
    WAITING = "waiting"  # queued for memory or for the engine
    RUNNING = "running"


@attrs.define(eq=False)
class Slot:
    """The scheduler's bookkeeping for one episode (event-loop state only).

    Eviction (rung 1) may take the published state of an episode that is idle or parked
    waiting for memory, never of one that is planning, admitted or running (``pinned``).
    """

    cache: EpisodeCache
    job_lock: anyio.Lock = attrs.Factory(anyio.Lock)  # one job of an episode at a time
    pending: tuple[Segment, ...] = ()  # segments of a discarded prefetch, for the next step
    jobs: int = 0  # queued or running jobs
    last_used: int = 0
    phase: Phase = Phase.IDLE
    planning: bool = False
    pinned: bool = False  # holds a reservation or runs: its state must not be evicted
    evicting: bool = False
    closed: bool = False

    @property
    def evictable(self) -> bool:
        return (not (self.planning or self.pinned or self.evicting or self.closed)
                and self.cache.state.held_bytes > 0)


async def set_on_cancel(flag: threading.Event) -> None:
    try:
        await anyio.sleep_forever()
    finally:
        flag.set()


class Holding:
    """``async with`` the engine at a priority; counts waiting critical work."""

    def __init__(self, scheduler: Scheduler, priority: Priority) -> None:
        self._s, self._p = scheduler, priority
        self._cm: Any = None

    async def __aenter__(self) -> None:
        critical = self._p is Priority.CRITICAL
        if critical:
            self._s._critical_waiting += 1
        try:
            self._cm = self._s._engine_lock.hold(int(self._p))
            await self._cm.__aenter__()
        finally:
            if critical:
                self._s._critical_waiting -= 1

    async def __aexit__(self, *exc: Any) -> None:
        await self._cm.__aexit__(*exc)
