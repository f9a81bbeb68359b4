"""The episode pool: open / step / close by key, a maximum, the least recently used idle
episode given back when a new one needs its slot, never a busy one; the ledger back to zero
when it stops."""

from __future__ import annotations

import time

import anyio
import pytest

from cachepolicy.segments import SegmentFactory
from runtime.config import AgentConfig
from runtime.pool import EpisodePool, PoolClosedError, PoolFullError, UnknownEpisodeError
from runtime.bench.trajectory import screenshot
from scheduler.ledger import MemoryLedger

AGENT = AgentConfig(window=2, decode_tokens=2, grammar=False, stop_at_eog=False, overlap=False)
SCREEN = (128, 96)


async def test_pool_gives_back_the_least_recently_used_idle_episode(engines) -> None:
    engine = engines("qwen35")
    ledger = MemoryLedger(1 << 30)
    pool = EpisodePool(SegmentFactory(engine), ledger, max_episodes=2)
    with pytest.raises(PoolClosedError):
        pool.scheduler  # noqa: B018  not running yet
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        assert pool.summary() == "Episodes: 0 open (0 busy, 0 idle) of 2"
        for key in ("a", "b"):
            await pool.open(key, AGENT, "Open the terminal.", SCREEN)
            await pool.step(key, screenshot(0, *SCREEN), arrived_at=time.perf_counter())
        await pool.step("a", screenshot(1, *SCREEN), arrived_at=time.perf_counter())  # b: LRU
        assert pool.summary() == "Episodes: 2 open (0 busy, 2 idle) of 2"
        with pytest.raises(PoolFullError):  # nothing may be given back
            await pool.open("c", AGENT, "Open the terminal.", SCREEN, evictable=lambda e: False)
        await pool.open("c", AGENT, "Open the terminal.", SCREEN, evictable=lambda e: True)
        assert sorted(pool.episodes) == ["a", "c"]  # b, the least recently used, went
        with pytest.raises(UnknownEpisodeError):
            pool.get("b")
        with pytest.raises(TypeError):
            pool.episodes["x"] = pool.get("a")  # type: ignore[index]  # a read-only view
        assert ledger.held_by("a") > 0
        pool.stop()
    assert pool.episodes == {} and ledger.snapshot().held == ledger.held_by("image_cache")
    for s in range(3):
        engine.clear(s)


async def test_a_busy_episode_is_never_given_back(engines) -> None:
    engine = engines("qwen35")
    pool = EpisodePool(SegmentFactory(engine), MemoryLedger(1 << 30), max_episodes=1)
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        await pool.open("a", AGENT, "Open the terminal.", SCREEN)
        started, release = anyio.Event(), anyio.Event()

        async def slow(driver):  # a step that holds the episode busy
            started.set()
            await release.wait()
            return await driver.act(screenshot(0, *SCREEN), arrived_at=time.perf_counter())

        tg.start_soon(pool.decide, "a", slow)
        await started.wait()
        assert pool.summary() == "Episodes: 1 open (1 busy, 0 idle) of 1"
        with pytest.raises(PoolFullError):
            await pool.open("b", AGENT, "Open the terminal.", SCREEN, evictable=lambda e: True)
        release.set()
        await anyio.sleep(0)
        while pool.get("a").busy:
            await anyio.sleep(0.01)
        await pool.open("b", AGENT, "Open the terminal.", SCREEN, evictable=lambda e: True)
        assert list(pool.episodes) == ["b"]
        pool.stop()
    for s in range(3):
        engine.clear(s)


async def test_an_open_waits_for_a_slot_being_given_back(engines) -> None:
    """A close in flight (an expired lease, a client's end) has left the open episodes but
    still holds its engine sequence: an open meanwhile waits for it instead of refusing (a
    429 to a client whose slot is free in a moment)."""
    engine = engines("qwen35")
    n = engine.config.n_seq_max  # every sequence is a slot, as ``kvagent serve`` sizes it
    ledger = MemoryLedger(1 << 30)
    pool = EpisodePool(SegmentFactory(engine), ledger, max_episodes=n)
    async with anyio.create_task_group() as tg:
        await tg.start(pool.run)
        keys = [f"e{i}" for i in range(n)]
        for key in keys:
            await pool.open(key, AGENT, "Open the terminal.", SCREEN)
        tg.start_soon(pool.close, keys[0])
        while keys[0] in pool.episodes:  # the close has started, its sequence not yet free
            await anyio.sleep(0)
        pooled = await pool.open("new", AGENT, "Open the terminal.", SCREEN,
                                 evictable=lambda e: False)
        assert sorted(pool.episodes) == sorted(keys[1:] + ["new"])
        with pytest.raises(PoolFullError):  # full, nothing closing: refused as before
            await pool.open("late", AGENT, "Open the terminal.", SCREEN,
                            evictable=lambda e: False)
        step = await pool.step("new", screenshot(0, *SCREEN), arrived_at=time.perf_counter())
        assert step.metrics.prefill_tokens > 0 and pooled.driver.episode_id == "new"
        pool.stop()
    assert pool.episodes == {} and ledger.snapshot().held == ledger.held_by("image_cache")
    for s in range(n):
        engine.clear(s)
