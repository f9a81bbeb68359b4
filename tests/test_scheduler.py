"""The scheduler on the real engine: memory pressure, fairness, cancellation, failures."""

from __future__ import annotations

import anyio
import pytest
from structlog.testing import capture_logs

from cachepolicy.policies import make_policy
from cachepolicy.errors import DecodeError
from cachepolicy.segments import SegmentFactory, model_info
from preempt_helpers import PreemptHook, warmed_pair
from replay_helpers import OPTIONS, outputs, replay, step_segments
from runtime.bench.trajectory import trajectory
from scheduler.errors import NoFreeSequenceError
from scheduler.ledger import MemoryLedger
from scheduler.priority_lock import PriorityLock
from scheduler.scheduler import Priority, Scheduler

STEPS = 6
OPTS = OPTIONS


@pytest.fixture
def big_engine(forged):
    """A qwen35 engine with 8 sequences and a small image cache (private to the test)."""
    from cachepolicy.engine import Engine, EngineConfig

    m = forged("qwen35")
    with Engine(m.model_path, m.mmproj_path,
                EngineConfig(n_ctx_per_seq=2048, n_seq_max=8, n_batch=32, n_threads=1,
                             image_cache_bytes=64_000)) as engine:
        yield engine


def _slot_policy(engine, factory):
    return make_policy("terminal-slot", model_info(engine), factory.kit, window=3,
                       decode_tokens=4)


def _sane(ledger: MemoryLedger) -> None:
    snap = ledger.snapshot()
    assert snap.free >= 0 and snap.peak <= snap.budget


async def _one_episode_peak(engine, traj) -> tuple[int, list]:
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(1 << 30)
    async with Scheduler(engine, ledger, factory, options=OPTS) as sched:
        runs = await replay(sched, traj, 1)
    return ledger.snapshot().peak, runs


async def test_eight_episodes_on_a_budget_for_about_three(big_engine) -> None:
    traj = trajectory(STEPS, 96, 64)
    peak_one, reference = await _one_episode_peak(big_engine, traj)
    budget = int(3.2 * peak_one)
    factory = SegmentFactory(big_engine)
    ledger = MemoryLedger(budget)
    summaries: list[str] = []
    with capture_logs() as logs:
        async with Scheduler(big_engine, ledger, factory, options=OPTS, wait_s=5.0) as sched:
            async with anyio.create_task_group() as tg:
                async def watch() -> None:
                    while True:
                        summaries.append(sched.summary())
                        _sane(ledger)
                        await anyio.sleep(0.005)
                tg.start_soon(watch)
                runs = await replay(sched, traj, 8)
                tg.cancel_scope.cancel()
            sched.check_integrity()
    assert all(r.n_steps == STEPS and r.admission in ("ok", "degraded") for r in runs)
    snap = ledger.snapshot()
    assert snap.peak <= budget
    assert snap.held == 0 and snap.reserved == 0  # everything returned
    rungs = {e.get("rung") for e in logs if e["event"] == "fallback"}
    assert 1 in rungs and rungs <= {1, 2, 3}  # evictions (and maybe waits) were logged
    assert any(e["event"] == "evict" for e in logs)
    events = {e["event"] for e in logs}
    assert {"admit", "fallback", "publish", "release", "evict"} <= events
    admits = [e for e in logs if e["event"] == "admit"]
    assert all({"episode_id", "seq_id", "txn_id"} <= set(e) for e in admits)
    # exact whatever the pressure: every non-degraded episode matches the unpressured one
    for r in runs:
        if r.admission == "ok":
            assert outputs(r) == outputs(reference[0])
    assert any(" running, " in s and "budget:" in s and "checkpoints:" in s for s in summaries)


async def test_ledger_invariant_after_every_transaction(big_engine) -> None:
    traj = trajectory(4, 96, 64)
    factory = SegmentFactory(big_engine)
    ledger = MemoryLedger(1 << 30)
    seen = []
    async with Scheduler(big_engine, ledger, factory, options=OPTS, debug=True) as sched:
        def check(event) -> None:
            if event.kind == "step":
                _sane(ledger)
                seen.append(ledger.snapshot())
        await replay(sched, traj, 3, on_event=check)
        assert sched.counters["idle_checks"] >= 1  # debug mode checked integrity at idle
    assert len(seen) == 12 and all(s.reserved + s.held <= s.budget for s in seen)
    assert ledger.snapshot().held == 0 and ledger.snapshot().reserved == 0


async def test_cancelled_episode_releases_everything(big_engine) -> None:
    traj = trajectory(STEPS, 96, 64)
    factory = SegmentFactory(big_engine)
    ledger = MemoryLedger(1 << 30)
    async with Scheduler(big_engine, ledger, factory, options=OPTS) as sched:
        victim = sched.open_episode("victim", _slot_policy(big_engine, factory))
        seq = victim.seq
        doomed_scope = anyio.CancelScope()
        other_runs = []

        async def doomed() -> None:
            with doomed_scope:
                try:
                    for i in range(STEPS):
                        await sched.step(victim, lambda i=i: step_segments(factory, traj, i))
                        await anyio.sleep(0)
                finally:
                    await sched.close_episode(victim)

        async def others() -> None:
            other_runs.extend(await replay(sched, traj, 2))

        async with anyio.create_task_group() as tg:
            tg.start_soon(doomed)
            tg.start_soon(others)
            while victim.steps_done < 1:
                await anyio.sleep(0.001)
            doomed_scope.cancel()  # cancel one episode (its task), nothing else
        assert doomed_scope.cancelled_caught
        assert victim.steps_done < STEPS
        assert all(r.n_steps == STEPS and r.admission == "ok" for r in other_runs)
        assert ledger.held_by("victim") == 0 and ledger.snapshot().reserved == 0
        assert big_engine.seq_info(seq).n_tokens == 0 and seq in sched._free_seqs
        sched.check_integrity()


async def test_cancelling_mid_step_rolls_back_and_frees(big_engine) -> None:
    traj = trajectory(STEPS, 96, 64)
    factory = SegmentFactory(big_engine)
    ledger = MemoryLedger(1 << 30)
    async with Scheduler(big_engine, ledger, factory, options=OPTS) as sched:
        ep = sched.open_episode("victim", _slot_policy(big_engine, factory))
        seq = ep.seq
        await sched.step(ep, lambda: step_segments(factory, traj, 0))
        published = ep.state
        with anyio.move_on_after(0.001) as scope:  # cancelled while the step is in flight
            await sched.step(ep, lambda: step_segments(factory, traj, 1))
        if scope.cancelled_caught:
            assert ep.state.generation in (published.generation, 2)
        del published  # (a state held here would keep its checkpoint alive, unaccounted)
        assert ledger.snapshot().reserved == 0
        sched.check_integrity()  # a rolled-back sequence holds no more than the ledger says
        others = await replay(sched, traj, 2)
        assert all(r.n_steps == STEPS for r in others)
        await sched.close_episode(ep)
        assert ledger.held_by("victim") == 0 and big_engine.seq_info(seq).n_tokens == 0
    assert ledger.snapshot().held == 0


async def test_injected_decode_failure_rolls_back_and_retries(big_engine) -> None:
    traj = trajectory(3, 96, 64)
    factory = SegmentFactory(big_engine)
    ledger = MemoryLedger(1 << 30)
    failures = []

    def fault(point: str) -> None:
        if point == "before_publish" and not failures:
            failures.append(point)
            raise DecodeError("injected: could not find a KV slot", 1)

    with capture_logs() as logs:
        async with Scheduler(big_engine, ledger, factory, options=OPTS, fault=fault) as sched:
            runs = await replay(sched, traj, 1)
            sched.check_integrity()
    assert failures == ["before_publish"]
    assert runs[0].n_steps == 3 and runs[0].steps[0].status == "degraded"
    assert any(e["event"] == "fallback" and e.get("rung") == "decode_failure" for e in logs)
    assert ledger.snapshot().held == 0 and ledger.snapshot().reserved == 0


async def test_critical_work_overtakes_prefetch() -> None:
    lock = PriorityLock()
    order: list[str] = []

    async def job(name: str, prio: int) -> None:
        async with lock.hold(prio):
            order.append(name)
            await anyio.sleep(0.001)

    async with anyio.create_task_group() as tg:
        async with lock.hold(Priority.CRITICAL):  # the engine is busy
            tg.start_soon(job, "prefetch-a", Priority.PREFETCH)
            tg.start_soon(job, "prefetch-b", Priority.PREFETCH)
            await anyio.sleep(0.001)
            tg.start_soon(job, "critical", Priority.CRITICAL)
            await anyio.sleep(0.001)
            assert lock.waiting(Priority.CRITICAL) == 1 and lock.waiting(Priority.PREFETCH) == 3
    assert order == ["critical", "prefetch-a", "prefetch-b"]


async def test_prefetch_is_preempted_by_critical_work(big_engine) -> None:
    """A prefetch running when critical work arrives stops at the next piece boundary and
    publishes what it did; the critical work runs first; the episode's next step picks up
    from there, and its outputs are those of a run without any prefetch."""
    traj = trajectory(4, 96, 64)
    factory = SegmentFactory(big_engine)
    ledger = MemoryLedger(1 << 30)
    hook = PreemptHook()
    async with Scheduler(big_engine, ledger, factory, options=OPTS, fault=hook) as sched:
        policy = _slot_policy(big_engine, factory)
        a, b = await warmed_pair(sched, factory, traj, lambda: policy)  # one policy, shared
        pre, critical = await hook.stop_prefetch(sched, factory, traj, a, b)
        assert critical.status == "ok"
        assert pre is not None and pre.preempted and pre.prefill_tokens == 0
        assert sched.counters["prefetch_preempted"] == 1
        assert a.log.generation == 4 and a.log.actions[-1].key == "action@2"
        assert ledger.snapshot().reserved == 0
        sched.check_integrity()
        rec = await sched.step(a, lambda: (factory.screenshot(3, traj.frames[3].screenshot),))
        assert rec.status == "ok" and rec.start in ("keep", "truncate")  # no full re-prefill
    # the same episode without any prefetch gives the same tokens
    ledger2 = MemoryLedger(1 << 30)
    async with Scheduler(big_engine, ledger2, factory, options=OPTS) as sched2:
        ref = await replay(sched2, traj, 1)
    assert rec.output_tokens == ref[0].steps[3].output_tokens


async def test_a_step_waits_for_an_in_flight_transaction(big_engine) -> None:
    """Rung 2, deterministically: A's step is in flight (its reservation held) when B asks
    for memory that only A's release can give; B waits, then runs."""
    import threading

    traj = trajectory(2, 96, 64)
    peak_one, _ = await _one_episode_peak(big_engine, traj)
    factory = SegmentFactory(big_engine)
    ledger = MemoryLedger(peak_one)  # room for one step in flight, not two
    release_a, a_running = threading.Event(), threading.Event()

    def fault(point: str) -> None:  # A's first piece boundary blocks until B has waited
        if point == "between_pieces" and not a_running.is_set():
            a_running.set()
            release_a.wait(timeout=10)

    with capture_logs() as logs:
        async with Scheduler(big_engine, ledger, factory, options=OPTS, fault=fault,
                             wait_s=10.0, image_cache_floor=1 << 40) as sched:
            policy = _slot_policy(big_engine, factory)
            a, b = sched.open_episode("a", policy), sched.open_episode("b", policy)
            done = {}
            async with anyio.create_task_group() as tg:
                async def run(ep, name) -> None:
                    done[name] = await sched.step(ep, lambda: step_segments(factory, traj, 0))
                tg.start_soon(run, a, "a")
                await anyio.to_thread.run_sync(a_running.wait, 10)
                tg.start_soon(run, b, "b")
                try:
                    with anyio.fail_after(10):
                        while sched.counters["rung2"] == 0:
                            await anyio.sleep(0.001)
                finally:
                    release_a.set()
            sched.check_integrity()
    assert done["a"].status == done["b"].status == "ok"
    waits = [e for e in logs if e["event"] == "fallback" and e.get("rung") == 2]
    assert waits and waits[0]["episode_id"] == "b"
    assert ledger.snapshot().peak <= ledger.budget


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
async def test_idle_episodes_are_trimmed_to_their_reuse_point_for_free(forged, arch) -> None:
    """Rung 1's first pass: an idle terminal-slot episode's window is cut back to its region
    checkpoint; its next step reuses exactly as much as before and its outputs do not change."""
    from cachepolicy.engine import Engine, EngineConfig

    m = forged(arch)
    traj = trajectory(4, 96, 64)
    with Engine(m.model_path, m.mmproj_path,
                EngineConfig(n_ctx_per_seq=2048, n_seq_max=2, n_batch=32, n_threads=1)) as e:
        factory = SegmentFactory(e)
        ledger = MemoryLedger(1 << 30)
        async with Scheduler(e, ledger, factory, options=OPTS) as sched:
            ref = await replay(sched, traj, 1)
        async with Scheduler(e, ledger, factory, options=OPTS) as sched:
            ep = sched.open_episode("a", _slot_policy(e, factory))
            for i in range(3):
                await sched.step(ep, lambda i=i: step_segments(factory, traj, i))
            before = ep.state
            freed = await sched.pressure.trim_to_reuse_point(sched._slots["a"])
            assert freed > 0 and ep.state.seq_bytes == before.seq_bytes - freed
            assert e.seq_info(ep.seq).next_pos == before.trim_pos > 0
            assert ledger.held_by("a") == ep.state.held_bytes
            del before  # (a state held here would keep its checkpoint alive, unaccounted)
            sched.check_integrity()
            rec = await sched.step(ep, lambda: step_segments(factory, traj, 3))
            assert rec.start == "keep"  # nothing the step needed was lost
            assert rec.output_tokens == ref[0].steps[3].output_tokens


async def test_the_spare_sequence_goes_to_the_policies_that_ask_for_it(engines) -> None:
    """A scheduler asked for a spare sequence holds the engine's last one aside for its whole
    life and hands it to the episodes whose policy's manifest asks for one (relocate's drift
    reference), to no other; without one, nobody gets it and every sequence is free."""
    e = engines("llama")
    factory = SegmentFactory(e)
    relocate = make_policy("relocate", model_info(e), factory.kit, window=2, measure_drift=True)
    slot = make_policy("terminal-slot", model_info(e), factory.kit, window=2)
    assert relocate.manifest.needs_scratch_sequence and not slot.manifest.needs_scratch_sequence
    last = e.config.n_seq_max - 1
    async with Scheduler(e, MemoryLedger(1 << 30), factory, options=OPTS,
                         spare_sequence=True) as sched:
        a, b = sched.open_episode("a", relocate), sched.open_episode("b", slot)
        assert (a.seq, a.scratch_seq) == (0, last) and (b.seq, b.scratch_seq) == (1, None)
        assert last not in sched._free_seqs
        sched.check_integrity()  # free + owned + spare partition the sequences
    async with Scheduler(e, MemoryLedger(1 << 30), factory, options=OPTS) as sched:
        assert sched.open_episode("a", relocate).scratch_seq is None
        assert last in sched._free_seqs


async def test_relocate_without_drift_leaves_every_sequence_to_the_episodes(engines) -> None:
    """Drift is opt-in (``measure_drift``): relocate without it asks for no spare sequence, so
    a scheduler sized from its manifest (``run_agents``) holds none aside and every engine
    sequence can carry an episode; with it, the last one is the drift reference's."""
    e = engines("llama")
    factory = SegmentFactory(e)
    plain = make_policy("relocate", model_info(e), factory.kit, window=2)
    measured = make_policy("relocate", model_info(e), factory.kit, window=2, measure_drift=True)
    assert not plain.manifest.needs_scratch_sequence and measured.manifest.needs_scratch_sequence
    n = e.config.n_seq_max
    for policy, episodes in ((plain, n), (measured, n - 1)):
        async with Scheduler(e, MemoryLedger(1 << 30), factory, options=OPTS,
                             spare_sequence=policy.manifest.needs_scratch_sequence) as sched:
            opened = [sched.open_episode(f"e{i}", policy) for i in range(episodes)]
            assert sorted(ep.seq for ep in opened) == list(range(episodes))
            assert {ep.scratch_seq for ep in opened} == ({None} if policy is plain else {n - 1})
            with pytest.raises(NoFreeSequenceError):
                sched.open_episode("one-more", policy)
            sched.check_integrity()
