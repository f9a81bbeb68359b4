"""Fault injection on the real engine (forged tiny qwen35), the model's and the scheduler's
side: output that does not parse or never stops, llama_decode failing mid-prefill, a
checkpoint that cannot be restored, a full context, a budget too small for one step,
cancellation mid-prefill and mid-decode, and 8 episodes squeezed onto one episode's peak.

Each fault has its defined outcome (docs/reliability.md); ``run_three`` checks for every one
that the other concurrent episodes are unaffected, the ledger returns to zero and every
completed step is on disk.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Awaitable
from typing import Any

import anyio
import attrs
import pytest

from cachepolicy.errors import DecodeError
from cachepolicy.segments import SegmentFactory
from fault_helpers import STEPS, TRAJ, assert_on_disk, engine, failed_at, run_three  # noqa: F401
from replay_helpers import AGENT, SCREEN, one_episode_peak
from runtime.run.replay import replay_run_config, replay_specs, replay_teacher
from runtime.bench.trajectory import trajectory
from runtime.config import AgentConfig
from runtime.driver import EpisodeDriver
from runtime.env_loop import run_episode
from runtime.metrics import EpisodeResult
from runtime.run.recording import METRICS_FILE, ResultLayout
from runtime.run.agents import run_on
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler
from vmenv.replay import ReplayEnv
from vmenv.trajectory_writer import TRAJ_FILE


# ----------------------------------------------------------------------------- the model


async def test_output_that_never_stops_and_does_not_parse(engine, tmp_path) -> None:
    """No grammar, end-of-generation ignored (random weights babble): a step decodes exactly
    its bound; text that does not parse becomes a recorded NoOp — 'WAIT' sent to the VM, the
    model's text kept as the response, counted as unparsable — and the episode goes on."""
    babble = AgentConfig(grammar=False, decode_tokens=7, stop_at_eog=False)
    results, dirs = await run_three(engine, tmp_path, None, agent=babble)
    for r in results:
        assert r.status == "done" and all(s.decode_tokens == 7 for s in r.steps)
        assert r.unparsable == sum(not s.parsed for s in r.steps)
    assert sum(r.unparsable for r in results) > 0
    lines = [json.loads(x) for x in (dirs["ep0"] / TRAJ_FILE).read_text().splitlines()]
    metrics = [json.loads(x) for x in (dirs["ep0"] / METRICS_FILE).read_text().splitlines()]
    for line, m in zip(lines, metrics, strict=True):
        assert isinstance(line["response"], str)
        if not m["parsed"]:
            assert line["action"] == "WAIT" and m["action"] is None


async def test_llama_decode_failure_mid_prefill(engine, tmp_path) -> None:
    calls: list[int] = []

    def fault(point: str) -> None:  # fails the third piece boundary of the run, once
        if point == "between_pieces":
            calls.append(1)
            if len(calls) == 3:
                raise DecodeError("injected: llama_decode returned -3", -3)

    results, _ = await run_three(engine, tmp_path, None, fault=fault)
    degraded = [s for r in results for s in r.steps if s.status == "degraded"]
    assert len(degraded) == 1 and "decode failure" in degraded[0].reason
    assert all(r.status == "done" and r.n_steps == STEPS for r in results)


async def test_checkpoint_restore_failure(engine, tmp_path) -> None:
    """ep0's checkpoints become unrestorable (as if taken on another model): its next step
    falls back to a plan from scratch, recorded degraded with the cause; it goes on."""
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(1 << 30)
    agent = attrs.evolve(AGENT, overlap=False)
    config = replay_run_config(agent, TRAJ, episodes=2)
    spoiled: list[int] = []
    async with Scheduler(engine, ledger, factory, options=agent.step_options(SCREEN)) as sched:
        def spoil(event) -> None:
            if event.kind == "step" and event.spec.index == 0 and event.step == 1:
                for c in sched._slots["ep0"].cache.state.checkpoints:  # noqa: SLF001
                    # the same object (the engine tracks it), now from "another model"
                    object.__setattr__(c.checkpoint, "model_id", "another-model")
                    spoiled.append(1)

        results, dirs = await run_on(sched, config, ResultLayout(tmp_path, "forged", "faults"),
                                     replay_specs(TRAJ, 2, "ep"), lambda s: ReplayEnv(TRAJ),
                                     teacher=replay_teacher(TRAJ), on_event=spoil)
        sched.check_integrity()
    assert spoiled
    ep0, ep1 = results
    assert ep0.status == "done" and ep0.n_steps == STEPS
    assert ep0.steps[1].status == "degraded" and "restore failure" in ep0.steps[1].reason
    assert ep1.admission == "ok"
    assert ledger.snapshot().held == 0
    for r in results:
        assert_on_disk(r, dirs[r.episode_id])


async def test_context_full(forged) -> None:
    """An episode whose prompt grows past its context (noevict keeps every screenshot) is
    downgraded to smaller windows (recorded degraded, "context full"), then fails with that
    reason when even one screenshot and the text history do not fit; an episode beside it
    runs on undisturbed."""
    from cachepolicy.engine import Engine, EngineConfig

    m = forged("qwen35")
    long = trajectory(16, 192, 128)
    with Engine(m.model_path, m.mmproj_path,
                EngineConfig(n_ctx_per_seq=512, n_seq_max=2, n_batch=32, n_threads=1)) as e:
        factory = SegmentFactory(e)
        ledger = MemoryLedger(1 << 30)
        async with Scheduler(e, ledger, factory, options=AGENT.step_options(SCREEN)) as sched:
            async def episode(name: str, policy: str, steps: int) -> EpisodeResult:
                agent = attrs.evolve(AGENT, policy=policy, window=2)
                driver = EpisodeDriver.open(sched, factory, agent, name, "go", (192, 128))
                try:
                    return await run_episode(driver, ReplayEnv(long), max_steps=steps)
                finally:
                    await driver.aclose()

            out: dict[str, EpisodeResult] = {}
            async with anyio.create_task_group() as tg:
                for name, policy, steps in (("grows", "noevict", 16),
                                            ("steady", "terminal-slot", 6)):
                    tg.start_soon(lambda n=name, p=policy, k=steps: _store(out, n,
                                                                           episode(n, p, k)))
            sched.check_integrity()
        assert ledger.snapshot().held == 0
    grows, steady = out["grows"], out["steady"]
    statuses = [s.status for s in grows.steps]
    assert statuses[0] == "ok" and "degraded" in statuses and statuses[-1] == "failed"
    assert all("context full" in s.reason for s in grows.steps if s.status != "ok")
    assert grows.status == "error" and "context full" in grows.error
    assert steady.admission == "ok" and steady.n_steps == 6


async def _store(out: dict, key: str, coro: Awaitable[Any]) -> None:
    out[key] = await coro


# ----------------------------------------------------------------------------- the scheduler


async def test_budget_too_small_for_one_step(engine, tmp_path) -> None:
    results, _ = await run_three(engine, tmp_path, None, budget=64 << 10)
    for r in results:
        failed_at(r, 0, "AdmissionError", "step needs")


# ----------------------------------------------------------------------------- cancellation


@pytest.mark.parametrize("where", ["prefill_image", "generate"])
async def test_cancel_one_episode_mid_step(engine, monkeypatch, where) -> None:
    """Cancel one episode while its critical step is inside the engine — mid-prefill (its
    screenshot) or mid-decode: the cancellation arrives as cancellation (the scope reports
    it caught, no AssertionError), the step rolls back, the ledger returns to zero and the
    episodes beside it finish every step."""
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(1 << 30)
    victim_agent = attrs.evolve(AGENT, overlap=False)  # its engine work is its critical steps
    entered, proceed = threading.Event(), threading.Event()
    armed: list[int] = []  # the victim's sequence, once its first step is recorded
    original = getattr(engine, where)

    def instrumented(seq: int, *args: Any, **kwargs: Any) -> Any:
        if armed and seq == armed[0] and not entered.is_set():
            entered.set()  # the victim's second step is inside the engine: cancel it now
            proceed.wait(20)
        return original(seq, *args, **kwargs)

    monkeypatch.setattr(engine, where, instrumented)
    scope = anyio.CancelScope()
    victim: list[EpisodeResult] = []
    others: list[EpisodeResult] = []
    async with Scheduler(engine, ledger, factory, options=AGENT.step_options(SCREEN)) as sched:
        async def run_victim() -> None:
            driver = EpisodeDriver.open(sched, factory, victim_agent, "victim", "go", (96, 64))
            try:
                with scope:
                    victim.append(await run_episode(
                        driver, ReplayEnv(TRAJ), max_steps=STEPS,
                        on_step=lambda *_: armed.append(driver.session.episode.seq)))
            finally:
                await driver.aclose()

        async def run_others() -> None:
            from replay_helpers import replay
            others.extend(await replay(sched, TRAJ, 2, prefix="other"))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_victim)
                tg.start_soon(run_others)
                assert await anyio.to_thread.run_sync(entered.wait, 30)
                scope.cancel()
                proceed.set()
        assert scope.cancelled_caught and not victim
        assert ledger.held_by("victim") == 0
        sched.check_integrity()
    assert [r.n_steps for r in others] == [STEPS, STEPS]
    assert all(r.status == "done" and r.admission == "ok" for r in others)
    snap = ledger.snapshot()
    assert snap.held == 0 and snap.reserved == 0


async def test_squeeze_serializes_instead_of_failing(forged) -> None:
    """8 episodes on a budget of ONE episode's peak: the work fits only one at a time, so
    the scheduler serializes it — every step recorded ok or degraded (none failed), the
    ledger's peak within the budget, back to zero at the end."""
    from cachepolicy.engine import Engine, EngineConfig
    from replay_helpers import replay

    m = forged("qwen35")
    traj = trajectory(6, 96, 64)
    with Engine(m.model_path, m.mmproj_path,
                EngineConfig(n_ctx_per_seq=2048, n_seq_max=8, n_batch=32, n_threads=1,
                             image_cache_bytes=64_000)) as e:
        factory = SegmentFactory(e)
        budget = await one_episode_peak(e, factory, traj)  # 1.0x
        ledger = MemoryLedger(budget)
        async with Scheduler(e, ledger, factory, options=AGENT.step_options(SCREEN),
                             wait_s=10.0) as sched:
            with anyio.fail_after(120):
                runs = await replay(sched, traj, 8)
            sched.check_integrity()
    assert [r.n_steps for r in runs] == [6] * 8
    assert all(s.status in ("ok", "degraded") for r in runs for s in r.steps)
    snap = ledger.snapshot()
    assert snap.peak <= budget and snap.held == 0 and snap.reserved == 0
