"""Closing an episode on the real engine (forged tiny qwen35) is idempotent, also when two
closes race — as at a server's shutdown, where a request's own close (a conversation it
opened and never answered) and the pool's close of every episode meet on one episode."""

from __future__ import annotations

import threading

import anyio
from structlog.testing import capture_logs

from cachepolicy.policies import make_policy
from cachepolicy.segments import SegmentFactory, model_info
from replay_helpers import OPTIONS, step_segments
from runtime.bench.trajectory import trajectory
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler


async def test_two_concurrent_closes_of_one_episode_both_return_and_close_it_once(
        engines) -> None:
    """A step of the episode is in flight (held at a piece boundary) when two closes of
    it start: both wait for the step, one closes, the other returns once that close has
    ended — no KeyError, one ``episode_close``, the ledger at zero, the sequence free."""
    engine = engines("qwen35")
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(1 << 30)
    traj = trajectory(2, 96, 64)
    entered, proceed = threading.Event(), threading.Event()

    def fault(point: str) -> None:  # the step waits at its first piece boundary
        if point == "between_pieces" and not proceed.is_set():
            entered.set()
            proceed.wait(30)

    with capture_logs() as logs:
        async with Scheduler(engine, ledger, factory, options=OPTIONS, fault=fault) as sched:
            policy = make_policy("terminal-slot", model_info(engine), factory.kit, window=3,
                                 decode_tokens=4)
            ep = sched.open_episode("ep", policy)
            closed: list[str] = []

            async def close(name: str) -> None:
                await sched.close_episode(ep)
                closed.append(name)

            async def step() -> None:
                await sched.step(ep, lambda: step_segments(factory, traj, 0))

            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(step)
                    assert await anyio.to_thread.run_sync(entered.wait, 30)
                    tg.start_soon(close, "first")
                    tg.start_soon(close, "second")
                    await anyio.sleep(0.05)  # both closes are waiting for the step
                    assert not closed
                    proceed.set()
            assert sorted(closed) == ["first", "second"]
            assert ledger.held_by("ep") == 0
            sched.check_integrity()
            # the sequence is free again, exactly once: every sequence can be opened
            again = [sched.open_episode(f"again{i}", policy)
                     for i in range(engine.config.n_seq_max)]
            assert sorted(e.seq for e in again) == list(range(engine.config.n_seq_max))
            for e in again:
                await sched.close_episode(e)
    assert [e["episode_id"] for e in logs if e["event"] == "episode_close"].count("ep") == 1
    snap = ledger.snapshot()
    assert snap.held == 0 and snap.reserved == 0


async def test_a_close_after_the_close_returns_at_once(engines) -> None:
    engine = engines("qwen35")
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(1 << 30)
    async with Scheduler(engine, ledger, factory, options=OPTIONS) as sched:
        policy = make_policy("terminal-slot", model_info(engine), factory.kit, window=3,
                             decode_tokens=4)
        ep = sched.open_episode("ep", policy)
        await sched.close_episode(ep)
        with anyio.fail_after(5):
            await sched.close_episode(ep)
    assert ledger.snapshot().held == 0
