"""Admission: plan a job against its episode's current state, then reserve its bytes — or
walk the fallback ladder: free idle state (rung 1) → wait for releases (rung 2) → downgrade
the plan (rung 3) → fail with a typed, explained ``AdmissionError`` (rung 4).

Context is checked like memory: a plan whose prompt and decoded tokens would not fit the
sequence's share of the context (``n_ctx_per_seq``) is never executed; it goes straight to
rung 3 (a smaller window fits), the step recorded as degraded with the reason.

Decisions are ``MemoryPressure.decide``'s (synchronous); this module acts on them and keeps
the FIFO queue of jobs waiting for memory.  Each rung is logged with its reason.  An admitted
job gets an ``Admitted`` handle: its reservation and its episode's pin, held until the job's
``with`` block ends.
"""

from __future__ import annotations

import functools
from collections import Counter, deque

import anyio
import structlog

from cachepolicy.base import CachePolicy
from cachepolicy.context_log import Segment
from cachepolicy.engine import Engine
from cachepolicy.layouts import PromptKit
from cachepolicy.policies import make_policy
from scheduler.admitted import Admitted
from scheduler.errors import AdmissionError, ContextFullAdmissionError
from scheduler.ledger import MemoryLedger
from scheduler.pressure import Admit, GiveUp, MemoryPressure, Replan, Wait
from scheduler.release import ReleaseSignal
from scheduler.shutdown import Shutdown
from scheduler.slots import Priority, Slot
from scheduler.transaction import EpisodeCache, Transaction, begin


# Rung 3: smaller plans for the same step, most faithful first.  terminal-slot →
# terminal-scratch with the same window → terminal-scratch with a smaller window, down to one
# screenshot.  Every one of them is exact for what it shows; a smaller window shows less, so
# a step that runs on one is recorded as degraded with the reason.  A policy whose prompt is
# not its own to change (``manifest.may_degrade`` False: faithful serves the client's prompt
# as sent) has no smaller plans.
FALLBACK_POLICY = "terminal-scratch"


def downgrades(policy: CachePolicy, kit: PromptKit) -> list[tuple[CachePolicy, str]]:
    """Rung 3's plans for a step of ``policy``, each with the reason its step records."""
    out: list[tuple[CachePolicy, str]] = []
    if not policy.manifest.may_degrade:
        return out
    k = policy.window
    if policy.name != FALLBACK_POLICY:
        out.append((make_policy(FALLBACK_POLICY, policy.model, kit, window=k,
                                decode_tokens=policy.decode_tokens, pinned=policy.pinned),
                    f"downgraded {policy.name} to {FALLBACK_POLICY} (window {k})"))
    for smaller in range(k - 1, 0, -1):
        # a smaller window keeps the pinned screenshots while the newest still fits
        out.append((make_policy(FALLBACK_POLICY, policy.model, kit, window=smaller,
                                decode_tokens=policy.decode_tokens,
                                pinned=min(policy.pinned, smaller - 1)),
                    f"downgraded {policy.name} to {FALLBACK_POLICY} with window {smaller} "
                    f"(of {k})"))
    return out


class Admission:
    def __init__(self, engine: Engine, ledger: MemoryLedger, kit: PromptKit,
                 pressure: MemoryPressure, slots: dict[str, Slot], released: ReleaseSignal,
                 counters: Counter[str], *, wait_s: float,
                 shutdown: Shutdown | None = None) -> None:
        self.engine, self.ledger, self.kit, self.pressure = engine, ledger, kit, pressure
        self._slots, self._released, self.counters = slots, released, counters
        self.wait_s = wait_s
        # once it began, a job on the ladder gives up (``ShuttingDownError``), not down it
        self._shutdown = shutdown or Shutdown()
        # FIFO of the slots whose job waits for memory (one job per slot at a time)
        self._mem_queue: deque[Slot] = deque()
        self._on_ladder = 0  # jobs inside ``_under_pressure``
        self._log = structlog.get_logger("kvagent.scheduler")

    @property
    def settled(self) -> bool:
        """No job is on the fallback ladder or queued for memory: memory released now is
        nobody's in particular (the embedding cache may take capacity back).  While a job
        climbs the ladder, what it freed stays free for it — a regrowing cache would undo
        rung 1 under its feet."""
        return not (self._mem_queue or self._on_ladder)

    async def begin(self, slot: Slot, segments: tuple[Segment, ...], priority: Priority,
                    policy: CachePolicy | None = None, degraded: str = "") -> Transaction:
        """Plan against the episode's current state (re-planned whenever it changed); the
        segments replace the log when the job says so (``slot.replacing``)."""
        while True:
            while slot.evicting:
                await self._released.current.wait()
            slot.planning = True
            try:
                txn = await anyio.to_thread.run_sync(functools.partial(
                    begin, self.engine, slot.cache, segments,
                    prefetch=priority is Priority.PREFETCH, policy=policy, degraded=degraded,
                    replace=slot.replacing, guess=slot.guessing))
            finally:
                slot.planning = False
            if txn.parent is slot.cache.state:
                return txn

    def context_need(self, txn: Transaction) -> int:
        """Tokens the plan's sequence holds at its end: the prompt and what it decodes."""
        plan = txn.plan
        if plan is None:
            return 0
        return plan.context_tokens + (txn.episode.policy.decode_tokens if plan.decode else 0)

    def fits_context(self, txn: Transaction) -> bool:
        return self.context_need(txn) <= self.engine.config.n_ctx_per_seq

    async def admit(self, slot: Slot, segments: tuple[Segment, ...], priority: Priority, *,
                     degrade: bool, cause: str = "") -> Admitted:
        """reserve, or walk the ladder: free idle state → wait for releases → downgrade →
        fail.  Each rung is logged with its reason.  ``degrade``: straight to rung 3
        (``cause``: why, e.g. the engine failed the full plan; it prefixes the reason).
        Returns the handle holding the reservation and the pin: run the transaction inside
        ``with handle as txn:``."""
        ep = slot.cache
        rungs: list[str] = []
        if not degrade:
            handle = await self._under_pressure(slot, segments, priority, rungs)
            if handle is not None:
                return self._admitted(handle, rungs)
            # both walked (whether or not they found anything), or the context is full
            rungs[:] = ["context_full"] if "context_full" in rungs else ["evict", "wait"]
        if priority is Priority.PREFETCH:  # speculative: no downgrade, not a failed step
            self.counters["prefetch_no_memory"] += 1
            raise AdmissionError(f"episode {ep.episode_id}: no room for a prefetch now",
                                 episode_id=ep.episode_id, rungs=tuple(rungs), need=0,
                                 free=self.ledger.snapshot().free)
        n_ctx = self.engine.config.n_ctx_per_seq
        need, shortest = 0, 0  # shortest: the least context of the plans too long for it
        rungs.append("downgrade")
        if "context_full" in rungs:
            cause = f"context full (n_ctx_per_seq {n_ctx})"
        for policy, reason in downgrades(ep.policy, self.kit):
            reason = f"{cause}: {reason}" if cause else reason  # the step records why
            smaller = await self.begin(slot, segments, priority, policy=policy,
                                        degraded=reason)
            if not self.fits_context(smaller):
                shortest = min(shortest or n_ctx << 20, self.context_need(smaller))
                continue
            need = need or smaller.need_bytes
            if (handle := self.pressure.try_admit(slot, smaller)) is not None:
                self._fallback(ep, 3, reason, smaller.need_bytes)
                self.counters["degraded"] += 1
                return self._admitted(handle, rungs)
        rungs.append("fail")
        self.counters["failed"] += 1
        if not need:
            first = await self.begin(slot, segments, priority)
            if not self.fits_context(first):  # no plan fits the context at all
                tokens = min(shortest or n_ctx << 20, self.context_need(first))
                self._fallback(ep, 4, "no plan fits the context", first.need_bytes)
                raise ContextFullAdmissionError(
                    f"episode {ep.episode_id}: context full: the smallest plan needs "
                    f"{tokens} tokens, a sequence holds {n_ctx} (n_ctx_per_seq), after "
                    f"{', '.join(rungs)}", episode_id=ep.episode_id, rungs=tuple(rungs),
                    need=first.need_bytes, free=self.ledger.snapshot().free, tokens=tokens,
                    n_ctx=n_ctx)
            need = first.need_bytes
        snap = self.ledger.snapshot()
        self._fallback(ep, 4, "no plan fits the memory budget", need)
        raise AdmissionError(
            f"episode {ep.episode_id}: step needs {need} bytes, {snap.free} free of "
            f"{snap.budget} after {', '.join(rungs)}", episode_id=ep.episode_id,
            rungs=tuple(rungs), need=need, free=snap.free)

    async def _under_pressure(self, slot: Slot, segments: tuple[Segment, ...],
                              priority: Priority, rungs: list[str]) -> Admitted | None:
        """Rungs 1 and 2: decide (synchronously), act, re-plan — until admitted, out of
        options, or waiting is in vain: (at the head of the queue) no other job could release
        anything — re-checked whenever a job ends or memory comes back — or, the safety
        bound, no holder made progress (no piece, token or release) for ``wait_s`` seconds.
        Slow holders that progress are waited for however long their steps take; while
        others release memory the job keeps its place in the queue (the work serializes)."""
        ep = slot.cache
        ticket: Slot | None = None
        self._on_ladder += 1
        try:
            while True:
                self._shutdown.check(ep.episode_id)  # (woken by the shutdown's notify)
                if ticket is not None and self._mem_queue[0] is not ticket:
                    # Not our turn: wait without re-planning (a job that is not planning
                    # stays evictable, so the head can free what we hold).
                    if not await self._wait(self._released.current):
                        return None
                    continue
                txn = await self.begin(slot, segments, priority)
                if not self.fits_context(txn):  # no memory makes it fit: rung 3
                    rungs.append("context_full")
                    self.counters["context_full"] += 1
                    self._log.warning("fallback", episode_id=ep.episode_id, seq_id=ep.seq,
                                      rung="context_full", need_tokens=self.context_need(txn),
                                      n_ctx_per_seq=self.engine.config.n_ctx_per_seq)
                    return None
                head = (not self._mem_queue) or self._mem_queue[0] is ticket
                decision = self.pressure.decide(slot, txn, first_in_queue=head,
                                                speculative=priority is Priority.PREFETCH)
                if isinstance(decision, Admit):
                    return decision.handle
                if isinstance(decision, Replan):
                    continue
                if isinstance(decision, GiveUp):
                    return None
                if isinstance(decision, Wait):
                    if ticket is None:  # join the queue: first come, first served
                        ticket = slot
                        self._mem_queue.append(ticket)
                        rungs.append("wait")
                        self._fallback(ep, 2, "waiting for in-flight transactions to release",
                                       txn.need_bytes)
                        # a head waiting on this job re-checks: it may wait in vain now
                        self._released.notify()
                    released = self._released.current  # the event this wait is for, taken now
                    if head and not self._others_may_release(slot):
                        return None  # nothing will be released: waiting cannot help
                    if not await self._wait(released):
                        return None
                    continue
                if "evict" not in rungs:
                    rungs.append("evict")
                reason = await self.pressure.carry_out(decision)
                if reason:
                    self._fallback(ep, 1, reason, txn.need_bytes)
        finally:
            self._on_ladder -= 1
            if ticket is not None:
                self._mem_queue.remove(ticket)
                self._released.notify()  # the next in line may be first now

    async def _wait(self, released: anyio.Event) -> bool:
        """Rung 2's wait: for ``released``, while the holders progress; False after
        ``wait_s`` seconds without any progress (a stall: the safety bound)."""
        return await self.pressure.wait_for_release(released, self.wait_s,
                                                    self._released.last_progress)

    def _others_may_release(self, slot: Slot) -> bool:
        """Whether another episode may still give memory back: one whose job runs, holds a
        reservation or is still on its way to admission, or one being closed — not one
        parked in the memory queue itself (the head already evicts what parked episodes
        hold).  When every other job waits for memory too, nothing will ever be released:
        the head goes down the ladder at once instead of stalling for ``wait_s``."""
        return any((s.jobs and s not in self._mem_queue) or s.closed
                   for s in self._slots.values() if s is not slot)

    def _admitted(self, handle: Admitted, rungs: list[str]) -> Admitted:
        txn = handle.txn
        self.counters["admitted"] += 1
        self._log.info("admit", episode_id=txn.episode.episode_id, seq_id=txn.episode.seq,
                       txn_id=txn.txn_id, reserved=txn.need_bytes, prefetch=txn.prefetch,
                       rungs=rungs or None)
        return handle

    def _fallback(self, ep: EpisodeCache, rung: int, reason: str, need: int) -> None:
        self.counters[f"rung{rung}"] += 1
        self._log.warning("fallback", episode_id=ep.episode_id, seq_id=ep.seq, rung=rung,
                          reason=reason, need=need, free=self.ledger.snapshot().free)
