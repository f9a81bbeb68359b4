"""The fallback ladder's wait for releases (rung 2) on the real engine (forged tiny qwen35):
it ends when no release can come, or — its safety bound — when no job made progress for the
stall timeout (``wait_s``; ``STALL_TIMEOUT_S`` by default), never merely because the jobs
holding the memory are slow.  The timeouts here are scaled down (a test knob): the holders'
steps take several times the stall timeout while progressing piece by piece."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from cachepolicy.policies import make_policy
from cachepolicy.segments import SegmentFactory, model_info
from replay_helpers import OPTIONS, one_episode_peak, replay, step_segments
from runtime.bench.trajectory import trajectory
from scheduler.errors import AdmissionError
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler

#: The stall timeout the tests give the scheduler (seconds).
STALL_S = 0.3
#: What a slowed job sleeps at each piece boundary: a step takes several of them, so
#: several times ``STALL_S``, while it progresses more often than every ``STALL_S``.
PIECE_S = 0.1


@pytest.fixture
def engine(forged):
    from cachepolicy.engine import Engine, EngineConfig

    m = forged("qwen35")
    with Engine(m.model_path, m.mmproj_path,
                EngineConfig(n_ctx_per_seq=2048, n_seq_max=4, n_batch=32, n_threads=1,
                             image_cache_bytes=64_000)) as e:
        yield e


async def test_waiters_do_not_give_up_while_slow_holders_progress(engine) -> None:
    """Three episodes on a budget of one episode's peak: every step but one waits for
    another's release, and every step takes longer than the stall timeout (a slow machine:
    ``PIECE_S`` at each piece boundary).  No step fails or is downgraded — each waits for
    its turn, however long the holder's step takes — and the ledger returns to zero."""
    traj = trajectory(3, 96, 64)
    factory = SegmentFactory(engine)
    budget = await one_episode_peak(engine, factory, traj)
    boundaries: list[float] = []

    def slow(point: str) -> None:  # in the worker thread, like an engine call
        if point == "between_pieces":
            boundaries.append(time.monotonic())
            time.sleep(PIECE_S)

    ledger = MemoryLedger(budget)
    async with Scheduler(engine, ledger, factory, options=OPTIONS, fault=slow,
                         wait_s=STALL_S) as sched:
        with anyio.fail_after(120):
            runs = await replay(sched, traj, 3)
        counters = dict(sched.counters)
        sched.check_integrity()
    steps = [s for r in runs for s in r.steps]
    assert [r.n_steps for r in runs] == [3, 3, 3]
    assert counters.get("rung2", 0) >= 2, counters  # the steps did wait for each other
    # a step of one episode took longer than the stall timeout: waiting "STALL_S with no
    # release" would have given up
    assert max(s.prefill_s + s.decode_s for s in steps) > STALL_S
    assert all(s.status == "ok" for s in steps), [(s.status, s.reason) for s in steps]
    assert counters.get("rung3", 0) == 0 and counters.get("failed", 0) == 0, counters
    snap = ledger.snapshot()
    assert snap.peak <= budget and snap.held == 0 and snap.reserved == 0


async def test_a_wait_ends_at_once_when_no_release_can_come(engine) -> None:
    """``me`` waits for memory while ``other``'s job is under way (it may release); that
    job then fails before it ever reserved anything: no release can come, so ``me`` goes
    down the ladder at once — not after the stall timeout (10 minutes here)."""
    factory = SegmentFactory(engine)
    traj = trajectory(1, 96, 64)
    ledger = MemoryLedger(100_000)  # less than any plan of a first step needs
    entered, go = threading.Event(), threading.Event()

    def failing_build():
        entered.set()
        go.wait(30)
        raise ValueError("injected: the screenshot does not decode")

    async with Scheduler(engine, ledger, factory, options=OPTIONS, wait_s=600.0) as sched:
        policy = make_policy("terminal-slot", model_info(engine), factory.kit, window=3,
                             decode_tokens=4)
        me, other = sched.open_episode("me", policy), sched.open_episode("other", policy)
        outcome: dict[str, BaseException] = {}

        async def other_step() -> None:
            with pytest.raises(ValueError):
                await sched.step(other, failing_build)

        async def my_step() -> None:
            try:
                await sched.step(me, lambda: step_segments(factory, traj, 0))
            except AdmissionError as exc:
                outcome["me"] = exc

        with anyio.fail_after(60):  # (the stall timeout is 600 s)
            async with anyio.create_task_group() as tg:
                tg.start_soon(other_step)
                assert await anyio.to_thread.run_sync(entered.wait, 30)
                tg.start_soon(my_step)
                while not sched.counters["rung2"]:  # me waits: other's job may release
                    await anyio.sleep(0.01)
                go.set()  # other's job fails, releasing nothing
        assert "wait" in outcome["me"].rungs and "fail" in outcome["me"].rungs, outcome
        await sched.close_episode(me)
        await sched.close_episode(other)
    snap = ledger.snapshot()
    assert snap.held == 0 and snap.reserved == 0
