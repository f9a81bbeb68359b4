"""Rungs 1 and 2 of the fallback ladder: evict idle state, wait (fairly) for releases."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from cachepolicy.context_log import Segment
from scheduler.slots import IMAGE_CACHE, Priority, Slot
from scheduler.transaction import Transaction

if TYPE_CHECKING:
    from scheduler.scheduler import Scheduler


class PressureMixin:
    """Memory-pressure behaviour of the ``Scheduler`` (kept apart to keep files small)."""

    async def _evict_idle(self: Scheduler, exclude: Slot) -> Any:
        """Rung 1: drop the cache state of idle or parked episodes (least recently used
        first), then shrink the image cache.  Yields a reason after each eviction."""
        victims = sorted((s for s in self._slots.values() if s is not exclude and s.evictable),
                         key=lambda s: s.last_used)
        for victim in victims:
            if not victim.evictable:
                continue  # started planning or running meanwhile: pinned
            ep = victim.cache
            freed = ep.state.held_bytes
            victim.evicting = True
            try:
                await self._engine_call(functools.partial(self.engine.clear, ep.seq),
                                        Priority.CRITICAL)
                with ep.publish_lock:  # a smaller published state: nothing but the log
                    ep.state = attrs.evolve(ep.state, checkpoints=(), seq_bytes=0,
                                            layout_keys=())
                    self.ledger.publish(ep.episode_id, 0, None)
            finally:
                victim.evicting = False
                self._notify_release()
            self.counters["evicted_episodes"] += 1
            self._log.info("evict", episode_id=ep.episode_id, seq_id=ep.seq, freed=freed)
            yield f"evicted idle episode {ep.episode_id}'s cache state ({freed} bytes)"
        cache = self.engine.image_cache
        freed = 0
        while cache.max_bytes - freed > self.image_cache_floor and len(cache):
            freed += await self._engine_call(cache.evict_one, Priority.CRITICAL)
        if freed:
            cache.max_bytes = max(self.image_cache_floor, cache.max_bytes - freed)
            self.ledger.publish(IMAGE_CACHE, cache.max_bytes, None)
            self._log.info("evict", owner=IMAGE_CACHE, freed=freed)
            yield f"shrank the image-embedding cache by {freed} bytes"

    async def _wait_for_memory(self: Scheduler, slot: Slot, segments: tuple[Segment, ...],
                               priority: Priority) -> Transaction | None:
        """Rung 2: wait (bounded, first come first served) for other transactions to release
        or other episodes to become evictable; re-plans after every wake-up."""
        ticket = object()
        self._mem_queue.append(ticket)
        try:
            with anyio.move_on_after(self.wait_s):
                while True:
                    if self._mem_queue[0] is ticket:
                        txn = await self._begin(slot, segments, priority)
                        if self._try_admit(slot, txn):
                            return txn
                        async for reason in self._evict_idle(exclude=slot):
                            self._fallback(slot.cache, 1, reason, txn.need_bytes)
                            txn = await self._begin(slot, segments, priority)
                            if self._try_admit(slot, txn):
                                return txn
                    others_busy = any(s.jobs for s in self._slots.values() if s is not slot)
                    if not others_busy:
                        return None  # nothing will be released: waiting cannot help
                    await self._released.wait()
            return None
        finally:
            self._mem_queue.remove(ticket)
            self._notify_release()
