"""Memory pressure: decide what one admission attempt does next, then do it.

``MemoryPressure.decide`` is synchronous — it reads the ledger and the episodes' bookkeeping,
and either reserves the transaction's bytes (``Admit``, holding the ``Admitted`` handle) or
says what to do instead: cut an idle episode back to its reuse point (``Trim``, free for that
episode), drop an idle episode's checkpoints or recurrent state (``DropCheckpoints``,
``DropRecurrent``: the replay rung), drop an idle episode's cache state (``Evict``), shrink
the image-embedding cache (``Shrink``), ``Wait`` for in-flight work to release, or
``GiveUp``.  ``carry_out`` performs the effect; the caller re-plans and decides again.  The caller carries out a ``Trim`` or
``Evict`` before its next await, and ``carry_out`` claims the victim (``evicting``) before
its first, so no other decision picks it too — the httpcore pool's way: bookkeeping in one
step of the event loop, effects outside it.

Ownership of the episodes' flags: ``evicting`` is set and cleared only by ``_claimed`` here
(around a trim or an eviction); ``pinned`` only by the ``Admitted`` handle.

Order of rung 1: every free trim first; then the replay rung, for episodes that allow
approximation (``EpisodeCache.replay_twin``, ``AgentConfig.replay_rung``): their checkpoints
(``DropCheckpoints``), then their recurrent states (``DropRecurrent``).  Each keeps the
victim's attention KV, and its next step plans with its policy's tail-replay variant: a
trimmed episode whose sequence ends at its dropped checkpoint goes on from there exactly; one
whose recurrent state was dropped replays a tail (approximate, and marked so in its records
until its sequence is cleared).  The rung is taken only when what it can free covers what the
step lacks — else it would only make episodes approximate that the next rung evicts anyway.
Then evictions (least recently used first), then the embedding cache.  A job that is not
first in the memory queue waits (FIFO): nobody jumps the queue — so under pressure the work
serializes instead of failing.  A prefetch (speculative) takes only what fits now.
"""

from __future__ import annotations

import functools
import time
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import attrs
import structlog

from cachepolicy.engine import Engine
from cachepolicy.plan import CacheState
from scheduler.admitted import Admitted
from scheduler.errors import BudgetExceededError
from scheduler.ledger import MemoryLedger
from scheduler.slots import IMAGE_CACHE, Slot
from scheduler.transaction import Transaction
from scheduler.trim import cut_to_reuse_point, drop_recurrent_state

EngineCall = Callable[[Callable[[], Any]], Awaitable[Any]]


@attrs.frozen
class Admit:
    """The transaction's bytes are reserved and its episode pinned, both held by ``handle``."""

    handle: Admitted = attrs.field(eq=False)


@attrs.frozen
class Replan:
    """The episode's published state changed since the plan was made: plan again."""


@attrs.frozen
class Trim:
    victim: Slot


@attrs.frozen
class DropCheckpoints:
    """The replay rung (episodes that allow approximation): drop the victim's checkpoints,
    keep its sequence; its next step plans with its policy's tail-replay variant."""

    victim: Slot


@attrs.frozen
class DropRecurrent:
    """The replay rung, further: keep the victim's attention KV, drop its recurrent state
    (approximate: its next step replays a tail)."""

    victim: Slot


@attrs.frozen
class Evict:
    victim: Slot


@attrs.frozen
class Shrink:
    """Give ``need`` bytes of the embedding cache's capacity back (not below its floor)."""

    need: int


@attrs.frozen
class Wait:
    """Others hold or will release memory: wait for a release."""


@attrs.frozen
class GiveUp:
    """Nothing is in flight and nothing more can be freed: waiting cannot help."""


Decision = Admit | Replan | Trim | DropCheckpoints | DropRecurrent | Evict | Shrink | Wait | GiveUp


class MemoryPressure:
    """Rungs 1 and 2 of the fallback ladder over one ledger and the scheduler's episodes."""

    def __init__(self, engine: Engine, ledger: MemoryLedger, slots: dict[str, Slot], *,
                 engine_call: EngineCall, notify_release: Callable[[], None],
                 wake_waiters: Callable[[], None] | None = None,
                 counters: Counter[str],
                 image_cache_floor: int = 0, image_cache_target: int | None = None) -> None:
        self.engine, self.ledger, self.slots = engine, ledger, slots
        # The engine's embedding cache is a ledger owner (``IMAGE_CACHE``) holding its
        # capacity, so encoding never takes the ledger past its budget.  Rung 1 shrinks the
        # capacity (``Shrink``); once memory is free again ``regrow_image_cache`` gives it
        # back, up to ``image_cache_target``.
        # ``notify_release``: what an admitted job's release does (the scheduler's: wake the
        # waiters, maybe regrow the cache); ``wake_waiters``: what rung 1's own effects do
        # (wake the waiters only — a cache regrowing on them would undo the rung)
        self._engine_call, self._notify = engine_call, notify_release
        self._wake = wake_waiters or notify_release
        self.counters = counters
        self.image_cache_floor = image_cache_floor
        self.image_cache_target = (engine.image_cache_stats().max_bytes
                                   if image_cache_target is None else image_cache_target)
        self._log = structlog.get_logger("kvagent.scheduler")

    # ------------------------------------------------------------------ decide (sync)

    def try_admit(self, slot: Slot, txn: Transaction) -> Admitted | None:
        """Reserve iff the plan is still current: the handle holding the reservation and the
        episode's pin, or None (nothing changed)."""
        if txn.parent is not slot.cache.state or slot.evicting:
            return None
        return Admitted.reserve(slot, txn, self.ledger, self._notify)

    def decide(self, slot: Slot, txn: Transaction, *, first_in_queue: bool,
               speculative: bool = False) -> Decision:
        """What this admission attempt does next (see the module docstring).  A
        ``speculative`` job (a prefetch) never waits, never takes a place in the queue and
        never evicts another episode's state: it fits now — after free trims — or gives up
        (its work then joins the episode's next critical step)."""
        if txn.parent is not slot.cache.state or slot.evicting:
            return Replan()
        if not first_in_queue:
            return GiveUp() if speculative else Wait()
        if (handle := self.try_admit(slot, txn)) is not None:
            return Admit(handle)
        victims = sorted((s for s in self.slots.values() if s is not slot and s.evictable),
                         key=lambda s: s.last_used)
        for victim in victims:  # free first: cut idle sequences back to their reuse point
            if not victim.was_trimmed():
                return Trim(victim)
        if speculative:
            return GiveUp()
        # the replay rung, for episodes that allow approximation: their checkpoints, then
        # their recurrent states, before anyone's whole cache — when that covers what the
        # step lacks (else it would only make episodes approximate that are evicted next)
        if self._replay_rung_bytes(victims) >= txn.need_bytes - self.ledger.free:
            for victim in victims:
                if victim.allows_replay and victim.cache.state.checkpoints:
                    return DropCheckpoints(victim)
            for victim in victims:
                if self._recurrent_droppable(victim):
                    return DropRecurrent(victim)
        for victim in victims:  # least recently used first
            return Evict(victim)
        cache = self.engine.image_cache_stats()
        if cache.max_bytes > self.image_cache_floor:
            return Shrink(max(1, txn.need_bytes - self.ledger.free))
        # a job in flight, or an episode being closed, will release what it holds
        others_busy = any(s.jobs or s.closed for s in self.slots.values() if s is not slot)
        return Wait() if others_busy else GiveUp()

    def _recurrent_droppable(self, victim: Slot) -> bool:
        return (victim.allows_replay and victim.cache.state.seq_bytes > 0
                and not victim.was_rebased())

    def _replay_rung_bytes(self, victims: list[Slot]) -> int:
        """What the replay rung could free: the checkpoints and recurrent states of the
        victims that allow it (a recurrent state at the model's size: an upper bound)."""
        return sum(v.cache.state.checkpoint_bytes
                   + (self.engine.recurrent_bytes_per_seq if self._recurrent_droppable(v) else 0)
                   for v in victims if v.allows_replay)

    # ------------------------------------------------------------------ act (async)

    async def carry_out(self, decision: Trim | DropCheckpoints | DropRecurrent | Evict | Shrink,
                        ) -> str:
        """Perform a rung-1 decision; returns the reason to log ("" if nothing was freed).
        Call it right after ``decide`` (no await between): it claims a trim's or an
        eviction's victim before it first waits."""
        if isinstance(decision, Trim):
            freed = await self._trim(decision.victim)
            return (f"trimmed idle episode {decision.victim.cache.episode_id}'s sequence back "
                    f"to its reuse point ({freed} bytes)") if freed else ""
        if isinstance(decision, DropCheckpoints):
            freed = self._drop_checkpoints(decision.victim)
            return (f"dropped idle episode {decision.victim.cache.episode_id}'s checkpoints "
                    f"({freed} bytes; its next step replays a tail)")
        if isinstance(decision, DropRecurrent):
            freed = await self._drop_recurrent(decision.victim)
            return (f"dropped idle episode {decision.victim.cache.episode_id}'s recurrent "
                    f"state ({freed} bytes; its next step replays a tail)")
        if isinstance(decision, Evict):
            freed = await self._evict(decision.victim)
            return f"evicted idle episode {decision.victim.cache.episode_id}'s cache state " \
                   f"({freed} bytes)"
        freed = self._shrink_image_cache(decision.need)
        return f"shrank the image-embedding cache by {freed} bytes" if freed else ""

    async def trim_to_reuse_point(self, victim: Slot) -> int:
        """Cut an idle episode's sequence back to its state's ``trim_pos``; bytes freed."""
        return await self._trim(victim)

    @contextmanager
    def _claimed(self, victim: Slot) -> Iterator[None]:
        """``victim`` is being cut or evicted for the block: no decision picks it, and its
        own next job waits before planning (``Admission.begin``); released memory is
        announced at the end.  The only code that sets or clears ``Slot.evicting``."""
        assert not victim.evicting, f"episode {victim.cache.episode_id} is claimed twice"
        victim.evicting = True
        try:
            yield
        finally:
            victim.evicting = False
            self._wake()

    async def _trim(self, victim: Slot) -> int:
        ep = victim.cache
        state = ep.state
        with self._claimed(victim):
            new_bytes = await self._engine_call(
                functools.partial(cut_to_reuse_point, self.engine, ep.seq, state))
            if new_bytes is None or new_bytes >= state.seq_bytes:
                victim.trimmed = weakref.ref(state)
                return 0
            with ep.publish_lock:
                ep.state = attrs.evolve(state, seq_bytes=new_bytes)
                self.ledger.publish(ep.episode_id, ep.state.held_bytes, None)
            victim.trimmed = weakref.ref(ep.state)
        freed = state.seq_bytes - new_bytes
        self.counters["trimmed_episodes"] += 1
        self._log.info("evict", episode_id=ep.episode_id, seq_id=ep.seq, freed=freed,
                       kind="trim", trim_pos=state.trim_pos)
        return freed

    def _republish(self, victim: Slot, state: CacheState) -> None:
        """Publish a smaller state for an idle victim (the replay rung), keeping what rung 1
        already knows of it: a trimmed state stays trimmed, a rebased one rebased."""
        ep = victim.cache
        trimmed, rebased = victim.was_trimmed(), victim.was_rebased()
        with ep.publish_lock:
            ep.state = state
            self.ledger.publish(ep.episode_id, state.held_bytes, None)
        victim.trimmed = weakref.ref(state) if trimmed else None
        victim.rebased = weakref.ref(state) if rebased else None

    def _drop_checkpoints(self, victim: Slot) -> int:
        """Synchronous: a publication only (the checkpoints die with their last reference)."""
        ep = victim.cache
        with self._claimed(victim):
            freed = ep.state.checkpoint_bytes
            self._republish(victim, attrs.evolve(ep.state, checkpoints=(), replay_next=True))
        self.counters["replay_rung_checkpoints"] += 1
        self._log.info("evict", episode_id=ep.episode_id, seq_id=ep.seq, freed=freed,
                       kind="replay_checkpoints")
        return freed

    async def _drop_recurrent(self, victim: Slot) -> int:
        ep = victim.cache
        state = ep.state
        with self._claimed(victim):
            new_bytes = await self._engine_call(
                functools.partial(drop_recurrent_state, self.engine, ep.seq))
            self._republish(victim, attrs.evolve(state, seq_bytes=new_bytes, replay_next=True))
            victim.rebased = weakref.ref(ep.state)
        freed = state.seq_bytes - new_bytes
        self.counters["replay_rung_recurrent"] += 1
        self._log.info("evict", episode_id=ep.episode_id, seq_id=ep.seq, freed=freed,
                       kind="replay_recurrent")
        return freed

    async def _evict(self, victim: Slot) -> int:
        ep = victim.cache
        freed = ep.state.held_bytes
        with self._claimed(victim):
            await self._engine_call(functools.partial(self.engine.clear, ep.seq))
            with ep.publish_lock:  # a smaller published state: nothing but the log
                ep.state = ep.state.emptied()
                self.ledger.publish(ep.episode_id, 0, None)
        self.counters["evicted_episodes"] += 1
        self._log.info("evict", episode_id=ep.episode_id, seq_id=ep.seq, freed=freed)
        return freed

    def _shrink_image_cache(self, need: int) -> int:
        """Give ``need`` bytes of the cache's capacity back (not below the floor): one atomic
        step of the cache (evictions and the new capacity under its lock, whatever encoders
        do meanwhile), then the ledger's holding follows the capacity.  Synchronous: no other
        decision can interleave."""
        freed = self.engine.shrink_image_cache(need, floor=self.image_cache_floor)
        if freed:
            self.ledger.publish(IMAGE_CACHE, self.engine.image_cache_stats().max_bytes, None)
            self.counters["image_cache_shrinks"] += 1
            self._log.info("evict", owner=IMAGE_CACHE, freed=freed)
            self._wake()
        return freed

    def regrow_image_cache(self) -> int:
        """Rung 1 reversed: once memory is free again, give the embedding cache back the
        capacity it gave up — up to its target, taking at most half of the ledger's free
        bytes (the rest stays for the next step).  The ledger takes the bytes before the
        cache may fill them.  Returns the capacity regained (0: nothing to do, or no room)."""
        cap = self.engine.image_cache_stats().max_bytes
        grow = min(self.image_cache_target - cap, self.ledger.free // 2)
        if grow <= 0:
            return 0
        try:
            self.ledger.publish(IMAGE_CACHE, cap + grow, None)
        except BudgetExceededError:  # another owner took the bytes meanwhile: next time
            return 0
        self.engine.set_image_cache_bytes(cap + grow)
        self.counters["image_cache_regrows"] += 1
        self._log.info("image_cache_regrown", owner=IMAGE_CACHE, capacity=cap + grow)
        return grow

    async def wait_for_release(self, released: anyio.Event, stall_s: float,
                               last_progress: Callable[[], float]) -> bool:
        """Rung 2: wait for a release (``released`` set: True) while the holders make
        progress; False once none came and nothing progressed (``last_progress``: the
        monotonic time of the holders' last piece, token or release) for ``stall_s``
        seconds — a stall timeout, the safety bound of a wait on work that may hang, not a
        deadline: slow holders that still progress are waited for."""
        started = time.monotonic()
        while True:
            quiet = time.monotonic() - max(started, last_progress())
            if quiet >= stall_s:
                return False
            with anyio.move_on_after(stall_s - quiet):
                await released.wait()
                return True
