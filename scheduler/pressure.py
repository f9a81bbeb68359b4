"""Rungs 1 and 2 of the fallback ladder: evict idle state, wait (fairly) for releases."""

from __future__ import annotations

import functools
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from cachepolicy.checkpoint import CheckpointKind
from cachepolicy.context_log import Segment
from cachepolicy.engine import Engine
from cachepolicy.errors import UnsafeEditError
from cachepolicy.plan import CacheState
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
        # First the free part: cut idle sequences back to what their next step reuses anyway
        # (terminal-slot: the region checkpoint), which costs those episodes nothing.
        for victim in victims:
            if not victim.evictable:
                continue
            freed = await self._trim_to_reuse_point(victim)
            if freed > 0:
                yield (f"trimmed idle episode {victim.cache.episode_id}'s sequence back to its "
                       f"reuse point ({freed} bytes)")
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
                                            layout_keys=(), trim_pos=0)
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

    async def _evict_until_admitted(self: Scheduler, slot: Slot, segments: tuple[Segment, ...],
                                    priority: Priority,
                                    txn: Transaction) -> Transaction | None:
        """Rung 1: evict idle state one victim at a time, re-planning and retrying after each;
        the admitted transaction, or None when nothing more can be evicted."""
        async with aclosing(self._evict_idle(exclude=slot)) as evictions:
            async for reason in evictions:
                self._fallback(slot.cache, 1, reason, txn.need_bytes)
                txn = await self._begin(slot, segments, priority)
                if self._try_admit(slot, txn):
                    return txn
        return None

    async def _trim_to_reuse_point(self: Scheduler, victim: Slot) -> int:
        """Cut an idle episode's sequence back to its state's ``trim_pos``; bytes freed."""
        ep = victim.cache
        state = ep.state
        victim.evicting = True
        try:
            new_bytes = await self._engine_call(
                functools.partial(_trim_sequence, self.engine, ep.seq, state),
                Priority.CRITICAL)
            if new_bytes is None or new_bytes >= state.seq_bytes:
                return 0
            with ep.publish_lock:
                ep.state = attrs.evolve(state, seq_bytes=new_bytes)
                self.ledger.publish(ep.episode_id, ep.state.held_bytes, None)
        finally:
            victim.evicting = False
            self._notify_release()
        freed = state.seq_bytes - new_bytes
        self.counters["trimmed_episodes"] += 1
        self._log.info("evict", episode_id=ep.episode_id, seq_id=ep.seq, freed=freed,
                       kind="trim", trim_pos=state.trim_pos)
        return freed

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
                        admitted = await self._evict_until_admitted(slot, segments, priority,
                                                                    txn)
                        if admitted is not None:
                            return admitted
                    others_busy = any(s.jobs for s in self._slots.values() if s is not slot)
                    if not others_busy:
                        return None  # nothing will be released: waiting cannot help
                    await self._released.wait()
            return None
        finally:
            self._mem_queue.remove(ticket)
            self._notify_release()


def _trim_sequence(engine: Engine, seq: int, state: CacheState) -> int | None:
    """In the engine thread: cut ``seq`` back to ``state.trim_pos`` if that is safe; returns
    the sequence's new size, or None when there is nothing (safe) to cut."""
    info = engine.seq_info(seq)
    if state.trim_pos >= info.next_pos:
        return None
    if state.trim_pos == 0:
        engine.clear(seq)
    elif not engine.kind.has_recurrent_state:
        engine.truncate(seq, state.trim_pos)
    else:
        via = next((c.checkpoint for c in state.checkpoints
                    if c.checkpoint.kind is CheckpointKind.PARTIAL_ONLY
                    and c.checkpoint.pos == state.trim_pos), None)
        if via is None:
            return None
        try:
            engine.truncate(seq, state.trim_pos, via=via)
        except UnsafeEditError:  # the checkpoint is not of this sequence's history: leave it
            return None
    return engine.state_bytes(seq)
