"""``Scheduler.shut_down`` on the real engine (forged tiny qwen35): what a server does when its
grace period ends — the step in flight stops at its next boundary and the step waiting for
memory gives up, both with ``ShuttingDownError``, rolled back, the ledger back to what the
published states hold; new steps are refused, closing still works."""

from __future__ import annotations

import threading

import anyio
import pytest

from cachepolicy.policies import make_policy
from cachepolicy.segments import SegmentFactory, model_info
from replay_helpers import OPTIONS, one_episode_peak, step_segments
from runtime.bench.trajectory import trajectory
from scheduler.errors import ShuttingDownError
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler


@pytest.fixture
def engine(forged):
    from cachepolicy.engine import Engine, EngineConfig

    m = forged("qwen35")
    with Engine(m.model_path, m.mmproj_path,
                EngineConfig(n_ctx_per_seq=2048, n_seq_max=4, n_batch=32, n_threads=1,
                             image_cache_bytes=64_000)) as e:
        yield e


async def test_shut_down_stops_the_running_step_and_the_waiting_one(engine) -> None:
    traj = trajectory(2, 96, 64)
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(await one_episode_peak(engine, factory, traj))  # one step at a time
    entered, proceed = threading.Event(), threading.Event()

    def fault(point: str) -> None:  # the first step waits at a piece boundary
        if point == "between_pieces" and not proceed.is_set():
            entered.set()
            proceed.wait(30)

    async with Scheduler(engine, ledger, factory, options=OPTIONS, fault=fault,
                         wait_s=600.0) as sched:
        policy = make_policy("terminal-slot", model_info(engine), factory.kit, window=3,
                             decode_tokens=4)
        a, b = sched.open_episode("a", policy), sched.open_episode("b", policy)
        errors: dict[str, BaseException] = {}

        async def step(ep) -> None:
            try:
                await sched.step(ep, lambda: step_segments(factory, traj, 0))
            except ShuttingDownError as exc:
                errors[ep.episode_id] = exc

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(step, a)
                assert await anyio.to_thread.run_sync(entered.wait, 30)
                tg.start_soon(step, b)
                while not sched.counters["rung2"]:  # b waits for a's memory
                    await anyio.sleep(0.01)
                assert sched.shut_down("test: shutting down") == 1  # a was running
                proceed.set()
        assert sorted(errors) == ["a", "b"], errors
        assert "test: shutting down" in str(errors["b"])
        assert sched.counters["failed"] == 0 and sched.counters["degraded"] == 0
        snap = ledger.snapshot()
        assert snap.reserved == 0 and snap.held == ledger.held_by("image_cache")
        sched.check_integrity()
        with pytest.raises(ShuttingDownError):  # a new step is refused at once
            await sched.step(a, lambda: step_segments(factory, traj, 0))
        assert await sched.prefetch(a, lambda: ()) is None  # a prefetch: discarded
        await sched.close_episode(a)
        await sched.close_episode(b)
    assert ledger.snapshot().held == 0
