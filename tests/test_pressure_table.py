"""The fallback ladder as tables: a situation per row, the decision it must lead to.

No model: the episodes are the scheduler's own ``Slot`` records around synthetic published
states, the ledger is a real ``MemoryLedger``, plans come from the real policies over a
synthetic log (model sizes from a made-up ``ModelInfo``), and the engine is a stand-in that
only keeps each sequence's size.  Every row runs in milliseconds.

* ``DECISIONS`` — one admission attempt, ``MemoryPressure.decide``: admit; re-plan; rung 1
  in its order (cut idle episodes back to their reuse point, least recently used first; then
  evict idle caches, least recently used first; then shrink the embedding cache); rung 2
  (wait, or give up when nothing can be released); what never is a victim.
* ``LADDER`` — a whole admission, ``Admission.admit``: each rung carried out in order until
  the step is admitted, degraded (rung 3) or failed (rung 4), with the rungs it reports.
* The memory queue: first come, first served; the ``wait_s`` bound; a release ends the
  wait; no waiting in vain when every job waits for memory.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import anyio
import attrs
import numpy as np
import pytest
from structlog.testing import capture_logs

from cachepolicy.context_log import ContextLog, Segment, SegmentKind
from cachepolicy.engine.checkpoint import GENESIS, ModelKind
from cachepolicy.engine.images import EmbeddingCache, EmbeddingCacheSnapshot, EncodedImage
from cachepolicy.engine.records import SeqInfo
from cachepolicy.layouts import PromptKit
from cachepolicy.plan import ByteForecast, CacheState, ModelInfo, Plan, Start, StartKind
from cachepolicy.policies import make_policy
from scheduler.admission import Admission
from scheduler.admitted import Admitted
from scheduler.errors import AdmissionError, ContextFullAdmissionError
from scheduler.ledger import MemoryLedger
from scheduler.pressure import (
    Admit, Decision, Evict, GiveUp, MemoryPressure, Replan, Shrink, Trim, Wait,
)
from scheduler.release import ReleaseSignal
from scheduler.slots import IMAGE_CACHE, Priority, Slot
from scheduler.transaction import EpisodeCache, Transaction

#: bytes per token of the made-up model: a plan's forecast is 10 x its tokens (no
#: checkpoints on an attention-only model, no workspace with n_embd = n_vocab = 0)
KV = 10
MODEL = ModelInfo(kind=ModelKind.ATTENTION, kv_bytes_per_token=KV, recurrent_bytes_per_seq=0,
                  state_overhead_bytes=0, n_embd=0, n_vocab=0)
KIT = PromptKit(generation_prompt=(7, 8), turn_break=(9,))
IMAGE_TOKENS = 100
DECODE = 4


def shot(step: int) -> Segment:
    return Segment(SegmentKind.SCREENSHOT, step, image_id=f"img{step}", intro=(5,), outro=(6,),
                   n_image_tokens=IMAGE_TOKENS, n_image_pos=IMAGE_TOKENS)


#: the asking episode's step: a preamble and three screenshots (terminal-slot, window 3)
SEGMENTS = (Segment(SegmentKind.PREAMBLE, -1, tokens=(1, 2, 3)), shot(0), shot(1), shot(2))


def tokens(window: int) -> int:
    """What a terminal plan of SEGMENTS with ``window`` screenshots holds at its end."""
    return 3 + window * (IMAGE_TOKENS + 2) + len(KIT.generation_prompt) + DECODE


def policy(name: str = "terminal-slot", window: int = 3):
    return make_policy(name, MODEL, KIT, window=window, decode_tokens=DECODE)


# ---------------------------------------------------------------------------- the pieces


class FakeEngine:
    """What admission and rung 1 ask of the engine: a sequence's size (10 bytes a token),
    clearing it, cutting it back; the context's size; its embedding cache (a real
    ``EmbeddingCache``)."""

    kind = ModelKind.ATTENTION

    def __init__(self, n_ctx_per_seq: int = 4096, cache: EmbeddingCache | None = None) -> None:
        self.config = SimpleNamespace(n_ctx_per_seq=n_ctx_per_seq)
        self.tokens: dict[int, int] = {}
        self.calls: list[str] = []
        self.embeddings = cache if cache is not None else EmbeddingCache(0)

    def image_cache_stats(self) -> EmbeddingCacheSnapshot:
        return self.embeddings.snapshot()

    def set_image_cache_bytes(self, max_bytes: int) -> int:
        return self.embeddings.resize(max_bytes)

    def shrink_image_cache(self, by: int, *, floor: int = 0) -> int:
        return self.embeddings.shrink(by, floor=floor)

    def seq_info(self, seq: int) -> SeqInfo:
        n = self.tokens.get(seq, 0)
        return SeqInfo(seq, next_pos=n, n_tokens=n, digest=GENESIS, history=())

    def held_bytes(self, seq: int) -> int:
        return KV * self.tokens.get(seq, 0)

    def clear(self, seq: int) -> None:
        self.calls.append(f"clear {seq}")
        self.tokens[seq] = 0

    def truncate(self, seq: int, pos: int, *, via: object = None) -> None:
        self.calls.append(f"truncate {seq} to {pos}")
        self.tokens[seq] = pos


@attrs.frozen
class Ep:
    """Another episode, as the scheduler's bookkeeping shows it."""

    name: str
    held: int = 0  # tokens in its sequence (its published state holds 10 bytes a token)
    trim_pos: int = 0  # where it can be cut back for free (0: nothing to cut back to)
    last_used: int = 0
    trimmed: bool = False  # rung 1 already cut it back
    #: idle | waiting (its job is parked in the memory queue) | planning | pinned (admitted
    #: or running) | evicting (rung 1 is at it) | closed (being closed)
    state: str = "idle"


@attrs.frozen
class Situation:
    budget: int
    others: tuple[Ep, ...] = ()
    need: int = 100  # bytes the asking transaction's plan needs (DECISIONS only)
    cache: tuple[int, int] = (0, 0)  # the embedding cache: (capacity, entries of 8 bytes)
    floor: int = 0  # the embedding cache's floor
    reserved: int = 0  # bytes an in-flight transaction holds
    first_in_queue: bool = True
    speculative: bool = False  # a prefetch
    stale: bool = False  # the asker's state changed since its plan was made
    claimed: bool = False  # rung 1 is cutting the asker's own state back
    n_ctx: int = 4096


@attrs.define
class World:
    """A situation made real: slots, ledger, cache, pressure and admission over them."""

    situation: Situation
    engine: FakeEngine
    ledger: MemoryLedger
    cache: EmbeddingCache
    slots: dict[str, Slot]
    released: ReleaseSignal
    pressure: MemoryPressure
    admission: Admission
    counters: Counter[str]
    in_flight: Any = None  # the in-flight transaction's reservation


def entry(i: int) -> EncodedImage:
    """An embedding of 8 bytes."""
    return EncodedImage(f"e{i}", 1, 1, embeddings=np.zeros((1, 1), np.float32),
                        positions0=np.zeros((1, 1), np.int32), pos_step=np.zeros(1, np.int32),
                        n_pos=1, non_causal=False, prefix_tokens=(), suffix_tokens=())


def world(s: Situation, *, wait_s: float = 5.0) -> World:
    cache = EmbeddingCache(s.cache[0])
    for i in range(s.cache[1]):
        cache.put(entry(i))
    engine, ledger = FakeEngine(s.n_ctx, cache), MemoryLedger(s.budget)
    if s.cache[0]:
        ledger.publish(IMAGE_CACHE, s.cache[0], None)
    slots: dict[str, Slot] = {}
    for seq, ep in enumerate(s.others, start=1):
        state = CacheState(generation=1, seq_bytes=KV * ep.held, trim_pos=ep.trim_pos)
        slot = Slot(EpisodeCache(ep.name, seq, policy(), state=state), last_used=ep.last_used)
        engine.tokens[seq] = ep.held
        ledger.publish(ep.name, state.held_bytes, None)
        slot.planning, slot.pinned = ep.state == "planning", ep.state == "pinned"
        slot.evicting, slot.closed = ep.state == "evicting", ep.state == "closed"
        slot.jobs = int(ep.state in ("waiting", "planning", "pinned"))
        if ep.trimmed:
            slot.trimmed = weakref.ref(slot.cache.state)
        slots[ep.name] = slot
    slots["me"] = Slot(EpisodeCache("me", 0, policy()), jobs=1, last_used=99)
    in_flight = ledger.reserve("in-flight", s.reserved) if s.reserved else None
    released, counters = ReleaseSignal(), Counter[str]()

    async def engine_call(fn: Callable[[], Any]) -> Any:
        if getattr(fn, "__name__", "") == "evict_lru":
            engine.calls.append("evict an embedding")
        return fn()

    pressure = MemoryPressure(engine, ledger, slots, engine_call=engine_call,
                              notify_release=released.notify, counters=counters,
                              image_cache_floor=s.floor)
    admission = Admission(engine, ledger, KIT, pressure, slots, released, counters,
                          wait_s=wait_s)
    return World(s, engine, ledger, cache, slots, released, pressure, admission, counters,
                  in_flight)


def transaction(slot: Slot, need: int) -> Transaction:
    """A plan of the asking episode that needs ``need`` bytes beyond what it holds."""
    forecast = ByteForecast(parent_bytes=0, parent_seq_bytes=0, successor_seq_bytes=need,
                            new_checkpoint_bytes=0, workspace_bytes=0)
    plan = Plan(policy="terminal-slot", generation=1, visible=(), pieces=(),
                start=Start(StartKind.CLEAR), reused_pieces=0, edits=(), checkpoints=(),
                keep=(), forecast=forecast)
    ep = slot.cache
    return Transaction("me/t1", ep, ep.log, ep.state, ep.log, plan, prefetch=False)


def said(decision: Decision) -> str:
    if isinstance(decision, Trim | Evict):
        return f"{type(decision).__name__.lower()} {decision.victim.cache.episode_id}"
    return {Admit: "admit", Replan: "replan", Shrink: "shrink", Wait: "wait",
            GiveUp: "give up"}[type(decision)]


# ---------------------------------------------------------------- one decision per row

IDLE_B = Ep("b", held=50, trim_pos=20, last_used=2)  # holds 500 bytes; its reuse point: 20
DECISIONS = [
    ("the step fits: reserve it", Situation(budget=1000), "admit"),
    ("the asker's state changed since it planned", Situation(budget=1000, stale=True),
     "replan"),
    ("rung 1 is cutting the asker's own state back", Situation(budget=1000, claimed=True),
     "replan"),
    # rung 1, first pass: free trims, least recently used first
    ("an idle episode holds more than its reuse point: cut it back",
     Situation(budget=550, others=(IDLE_B,)), "trim b"),
    ("two can be cut back: the least recently used first",
     Situation(budget=1050, others=(IDLE_B, Ep("c", held=50, trim_pos=20, last_used=1))),
     "trim c"),
    ("an episode whose job waits in the memory queue is cut back too",
     Situation(budget=550, others=(attrs.evolve(IDLE_B, state="waiting"),)), "trim b"),
    ("a prefetch may take the free trims", Situation(budget=550, others=(IDLE_B,),
                                                     speculative=True), "trim b"),
    # rung 1, second pass: evictions, least recently used first
    ("every idle episode is cut back already: evict one",
     Situation(budget=550, others=(attrs.evolve(IDLE_B, trimmed=True),)), "evict b"),
    ("two to evict: the least recently used first",
     Situation(budget=1050, others=(attrs.evolve(IDLE_B, trimmed=True),
                                    Ep("c", held=50, last_used=1, trimmed=True))), "evict c"),
    ("a prefetch never evicts another episode's state",
     Situation(budget=550, others=(attrs.evolve(IDLE_B, trimmed=True),), speculative=True),
     "give up"),
    # never a victim (then nothing else frees memory: wait if it will release, else give up)
    ("an episode planning is no victim",
     Situation(budget=550, others=(attrs.evolve(IDLE_B, state="planning"),)), "wait"),
    ("an episode admitted or running is no victim",
     Situation(budget=550, others=(attrs.evolve(IDLE_B, state="pinned"),)), "wait"),
    ("an episode being closed is no victim",
     Situation(budget=550, others=(attrs.evolve(IDLE_B, state="closed"),)), "wait"),
    ("an episode rung 1 is at already is no victim",
     Situation(budget=550, others=(attrs.evolve(IDLE_B, state="evicting"),)), "give up"),
    ("an episode holding nothing is no victim",
     Situation(budget=50, others=(Ep("b", held=0),)), "give up"),
    # rung 1, last: the embedding cache
    ("no episode to evict, the embedding cache holds entries: shrink it",
     Situation(budget=300, cache=(240, 3)), "shrink"),
    ("evictions come before the embedding cache",
     Situation(budget=790, others=(attrs.evolve(IDLE_B, trimmed=True),), cache=(240, 3)),
     "evict b"),
    ("the cache is at its floor: nothing to shrink",
     Situation(budget=300, cache=(240, 3), floor=240), "give up"),
    ("the cache is empty but its capacity is held in the ledger: shrink the capacity",
     Situation(budget=300, cache=(240, 0)), "shrink"),
    # rung 2: wait for a release, or give up when none can come
    ("a transaction in flight will release: wait",
     Situation(budget=150, reserved=100, others=(Ep("c", state="pinned"),)), "wait"),
    ("nothing in flight, nothing to free: give up", Situation(budget=50), "give up"),
    ("not first in the memory queue: wait for your turn",
     Situation(budget=1000, first_in_queue=False), "wait"),
    ("a prefetch never queues", Situation(budget=1000, first_in_queue=False,
                                          speculative=True), "give up"),
]


@pytest.mark.parametrize("title, situation, expected", DECISIONS,
                         ids=[row[0] for row in DECISIONS])
def test_decide(title: str, situation: Situation, expected: str) -> None:
    w = world(situation)
    me = w.slots["me"]
    txn = transaction(me, situation.need)
    if situation.stale:
        me.cache.state = attrs.evolve(me.cache.state, generation=2)
    me.evicting = situation.claimed
    before = w.ledger.snapshot()
    decision = w.pressure.decide(me, txn, first_in_queue=situation.first_in_queue,
                                 speculative=situation.speculative)
    assert said(decision) == expected
    if isinstance(decision, Admit):  # reserved and pinned, until the handle lets go
        assert me.pinned and w.ledger.snapshot().reserved == before.reserved + situation.need
        with decision.handle:
            pass
        assert not me.pinned and w.ledger.snapshot().reserved == before.reserved
    else:  # deciding reserved nothing and claimed no victim: carrying it out does that
        assert w.ledger.snapshot() == before and not me.pinned
        assert [s.evicting for s in w.slots.values()] == [
            s.state == "evicting" for s in situation.others] + [situation.claimed]


# ------------------------------------------------------- a whole admission per row


@attrs.frozen
class Outcome:
    """How an admission ended: the plan it admitted (its policy and window, or the error),
    the rungs it reports and what rung 1 did to the engine, in order."""

    result: str  # "terminal-slot/3", "terminal-scratch/1 degraded", "AdmissionError", ...
    rungs: tuple[str, ...] = ()
    engine: tuple[str, ...] = ()


LADDER = [
    ("the step fits", Situation(budget=KV * tokens(3)), Outcome("terminal-slot/3")),
    ("rung 1: an idle episode is cut back to its reuse point, for free",
     Situation(budget=KV * (tokens(3) + 60), others=(Ep("b", held=80, trim_pos=20),)),
     Outcome("terminal-slot/3", ("evict",), ("truncate 1 to 20",))),
    ("rung 1: every free cut first, then evictions, least recently used first",
     Situation(budget=KV * (tokens(3) + 20),
               others=(Ep("b", held=50, trim_pos=30, last_used=2),
                       Ep("c", held=40, trim_pos=30, last_used=1))),
     Outcome("terminal-slot/3", ("evict",),
             ("truncate 2 to 30", "truncate 1 to 30", "clear 2", "clear 1"))),
    ("rung 1: the embedding cache shrinks after the episodes are evicted",
     Situation(budget=KV * tokens(3) + 20, others=(Ep("b", held=50, trimmed=True),),
               cache=(40, 5)),
     Outcome("terminal-slot/3", ("evict",), ("clear 1",))),  # the cache shrinks itself
    ("rung 3: nothing to free, no one to wait for: the largest window that fits",
     Situation(budget=KV * tokens(2)),
     Outcome("terminal-scratch/2 degraded", ("evict", "wait", "downgrade"))),
    ("rung 3: down to one screenshot",
     Situation(budget=KV * tokens(1)),
     Outcome("terminal-scratch/1 degraded", ("evict", "wait", "downgrade"))),
    ("rung 4: not even one screenshot fits",
     Situation(budget=KV * tokens(1) - 1),
     Outcome("AdmissionError", ("evict", "wait", "downgrade", "fail"))),
    ("context full: no memory helps, straight to the window that fits the context",
     Situation(budget=1 << 30, n_ctx=tokens(2)),
     Outcome("terminal-scratch/2 degraded", ("context_full", "downgrade"))),
    ("context full and no window fits: a context-full failure",
     Situation(budget=1 << 30, n_ctx=tokens(1) - 1),
     Outcome("ContextFullAdmissionError", ("context_full", "downgrade", "fail"))),
    ("a prefetch takes only what is free now: no eviction, no downgrade",
     Situation(budget=KV * tokens(3), others=(Ep("b", held=150, trimmed=True),),
               speculative=True),
     Outcome("AdmissionError", ("evict", "wait"))),
]


async def admit(w: World, *, priority: Priority = Priority.CRITICAL,
                slot: str = "me") -> Admitted:
    return await w.admission.admit(w.slots[slot], SEGMENTS, priority, degrade=False)


@pytest.mark.parametrize("title, situation, expected", LADDER, ids=[row[0] for row in LADDER])
async def test_ladder(title: str, situation: Situation, expected: Outcome) -> None:
    w = world(situation)
    priority = Priority.PREFETCH if situation.speculative else Priority.CRITICAL
    with capture_logs() as logs:
        try:
            with anyio.fail_after(2):
                handle = await admit(w, priority=priority)
        except AdmissionError as exc:
            got = Outcome(type(exc).__name__, exc.rungs, tuple(w.engine.calls))
            assert w.ledger.snapshot().reserved == 0  # a failure holds nothing
        else:
            txn = handle.txn
            (admitted,) = [e for e in logs if e["event"] == "admit"]
            got = Outcome(f"{txn.plan.policy}/{_window(txn)}"
                          + (" degraded" if txn.degraded else ""),
                          tuple(admitted["rungs"] or ()), tuple(w.engine.calls))
            with handle:  # the step would run here, holding its reservation and its pin
                assert w.ledger.snapshot().reserved == txn.need_bytes and handle.slot.pinned
            assert w.ledger.snapshot().reserved == 0 and not handle.slot.pinned
    assert got == expected
    assert w.ledger.snapshot().peak <= w.ledger.budget
    assert not any(s.evicting for s in w.slots.values())


def _window(txn: Transaction) -> int:
    assert txn.plan is not None
    return sum(s.kind is SegmentKind.SCREENSHOT for s in txn.plan.visible)


# ------------------------------------------------------------------ the memory queue


async def test_the_queue_is_first_come_first_served() -> None:
    """Two steps wait for an in-flight transaction's memory; the release makes room for
    one: the first in line gets it, and the second — smaller, it would fit first — waits
    for the first to finish rather than jump the queue."""
    big = KV * tokens(3)
    w = world(Situation(budget=big + 100, reserved=big, others=(Ep("c", state="pinned"),)))
    w.slots["you"] = Slot(EpisodeCache("you", 9, policy(window=1)), jobs=1, last_used=98)
    order: list[str] = []

    async def step(name: str) -> None:
        handle = await admit(w, slot=name)
        order.append(f"{name} admitted")
        with handle:
            await anyio.sleep(0.01)
        order.append(f"{name} done")

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(step, "me")
            await _until(lambda: w.counters["rung2"] == 1)  # me waits, first in line
            tg.start_soon(step, "you")
            await _until(lambda: w.counters["rung2"] == 2)  # you wait behind me
            w.ledger.release(w.in_flight)  # the in-flight transaction ends
            w.released.notify()
    assert order == ["me admitted", "me done", "you admitted", "you done"]
    assert w.ledger.snapshot().reserved == 0


async def test_a_wait_gives_up_after_wait_s_without_a_release() -> None:
    """Rung 2 is bounded: with a transaction in flight that never releases, the step waits
    ``wait_s`` and goes down the ladder (here: a smaller window that fits)."""
    w = world(Situation(budget=KV * tokens(3), reserved=KV * (tokens(3) - tokens(1)),
                        others=(Ep("c", state="pinned"),)), wait_s=0.05)
    t0 = time.perf_counter()
    handle = await admit(w)
    waited = time.perf_counter() - t0
    assert 0.05 <= waited < 1.0
    assert handle.txn.degraded and _window(handle.txn) == 1
    assert w.counters["rung2"] == 1 and w.counters["rung3"] == 1
    handle.release()


async def test_a_release_ends_the_wait() -> None:
    """The wait ends at the release, not after ``wait_s``."""
    w = world(Situation(budget=KV * tokens(3), reserved=100,
                        others=(Ep("c", state="pinned"),)), wait_s=30)
    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        async def release() -> None:
            await _until(lambda: w.counters["rung2"] == 1)
            w.ledger.release(w.in_flight)
            w.released.notify()
        tg.start_soon(release)
        with anyio.fail_after(2):
            handle = await admit(w)
    assert time.perf_counter() - t0 < 1.0 and not handle.txn.degraded
    handle.release()


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await anyio.sleep(0.001)


async def test_when_every_job_waits_for_memory_the_head_does_not_wait_in_vain() -> None:
    """Nothing is in flight and both jobs wait for memory: no release can come, so the head
    goes down the ladder at once instead of after ``wait_s`` (30 s here); the next one does
    too once the head has finished."""
    w = world(Situation(budget=KV * tokens(3) - 1), wait_s=30)
    w.slots["you"] = Slot(EpisodeCache("you", 9, policy()), jobs=1, last_used=98)
    windows: dict[str, int] = {}

    async def step(name: str) -> None:
        handle = await admit(w, slot=name)
        windows[name] = _window(handle.txn)
        with handle:
            await anyio.sleep(0.01)
        w.slots[name].jobs = 0  # its job ends with the step

    t0 = time.perf_counter()
    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(step, "me")
            await _until(lambda: w.counters["rung2"] == 1)  # me waits: you may release
            tg.start_soon(step, "you")
    assert time.perf_counter() - t0 < 1.0
    assert windows == {"me": 2, "you": 2} and w.counters["degraded"] == 2
    assert w.ledger.snapshot().reserved == 0
