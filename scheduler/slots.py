"""The scheduler's per-episode bookkeeping and the priorities of engine work."""

from __future__ import annotations

import enum
import threading
import weakref
import anyio
import attrs

from cachepolicy.context_log import Segment
from cachepolicy.plan import CacheState
from scheduler.transaction import EpisodeCache

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
    Only the event loop reads or writes these fields, each flag from one owner, with no await
    between deciding and marking:

    * ``planning`` — ``Admission.begin``, around the policy's ``select``;
    * ``pinned`` — the ``Admitted`` handle, from the reservation to the job's end;
    * ``evicting`` — ``MemoryPressure._claimed``, around a trim or an eviction;
    * ``trimmed``, ``rebased`` — ``MemoryPressure`` (what its last trim / replay rung left);
    * ``jobs``, ``phase``, ``pending``, ``replacing``, ``last_used``, ``closed``,
      ``close_done`` — the ``Scheduler``, around each job and at close.
    """

    cache: EpisodeCache
    job_lock: anyio.Lock = attrs.Factory(anyio.Lock)  # one job of an episode at a time
    pending: tuple[Segment, ...] = ()  # segments of a discarded prefetch, for the next step
    jobs: int = 0  # queued or running jobs
    last_used: int = 0
    phase: Phase = Phase.IDLE
    planning: bool = False
    pinned: bool = False  # holds a reservation or runs: its state must not be evicted
    evicting: bool = False  # being cut back or evicted (rung 1): its next job waits
    closed: bool = False
    #: set once the close that ``closed`` announced has ended: a second close (the pool's and
    #: a request's own, at shutdown) waits for it instead of freeing the sequence twice
    close_done: anyio.Event | None = None
    replacing: bool = False  # the job in flight replaces the log (a whole-prompt request)
    guessing: bool = False  # the job in flight is a guess (its segments are never appended)
    # the published state rung 1 last cut back (cutting it again frees nothing); a weak
    # reference: holding the state would keep its checkpoints alive after it is replaced
    trimmed: weakref.ref[CacheState] | None = None
    # the published state whose recurrent state the replay rung dropped (weak, as above)
    rebased: weakref.ref[CacheState] | None = None

    def was_trimmed(self) -> bool:
        return self.trimmed is not None and self.trimmed() is self.cache.state

    def was_rebased(self) -> bool:
        return self.rebased is not None and self.rebased() is self.cache.state

    @property
    def allows_replay(self) -> bool:
        """The episode allows the replay rung (``AgentConfig.replay_rung``)."""
        return self.cache.replay_twin is not None

    @property
    def evictable(self) -> bool:
        return (not (self.planning or self.pinned or self.evicting or self.closed)
                and self.cache.state.held_bytes > 0)


async def set_on_cancel(flag: threading.Event) -> None:
    try:
        await anyio.sleep_forever()
    finally:
        flag.set()
