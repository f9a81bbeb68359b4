"""The fallback ladder's replay rung on the real engine (forged tiny qwen35), with the
integrity check on (``KVAGENT_DEBUG=1``): episodes that allow approximation lose their
checkpoints, then their recurrent states, before anyone loses a whole cache; their next
steps replay a tail and are marked approximate; the ledger and the engine agree throughout."""

from __future__ import annotations

import anyio
import attrs
import pytest
from structlog.testing import capture_logs

from cachepolicy.engine.checkpoint import is_approximate
from cachepolicy.segments import SegmentFactory
from replay_helpers import AGENT, SCREEN, replay, step_segments
from runtime.bench.trajectory import trajectory
from scheduler.ledger import MemoryLedger
from scheduler.pressure import DropCheckpoints, DropRecurrent, Trim
from scheduler.scheduler import Scheduler
from scheduler.slots import Priority

RUNG = attrs.evolve(AGENT, replay_rung=True, replay_budget="8")


@pytest.fixture
def engine(forged):
    from cachepolicy.engine import Engine, EngineConfig

    m = forged("qwen35")
    with Engine(m.model_path, m.mmproj_path,
                EngineConfig(n_ctx_per_seq=2048, n_seq_max=8, n_batch=32, n_threads=1,
                             image_cache_bytes=64_000)) as e:
        yield e


def _open(sched, factory, name, agent):
    policy = agent.make_policy(factory, SCREEN)
    return sched.open_episode(name, policy, replay_twin=agent.replay_twin(policy))


async def _two_idle_episodes(sched, factory, traj):
    """``exact`` (least recently used), then ``allow`` (replay rung), two steps each."""
    exact = _open(sched, factory, "exact", AGENT)
    allow = _open(sched, factory, "allow", RUNG)
    for ep in (exact, allow):
        for i in range(2):
            await sched.step(ep, lambda i=i: step_segments(factory, traj, i))
    return exact, allow


@pytest.mark.parametrize("covered", [True, False])
async def test_the_ladder_takes_checkpoints_then_recurrent_states_before_caches(
        engine, covered: bool) -> None:
    """A new episode's first step that fits once rung 1 frees the free trims and then either
    (covered) the replay rung's bytes — the checkpoint, then the recurrent state of the
    episode that allows it: no eviction — or (not covered: a byte more than the rung can
    free) an eviction, and then the rung is not taken at all (it would only make an episode
    approximate that is evicted next).  Through the shipping path."""
    factory = SegmentFactory(engine)
    traj = trajectory(4, 96, 64)
    options = AGENT.step_options(SCREEN)
    # measure the scenario on an unlimited ledger
    big = MemoryLedger(1 << 30)
    async with Scheduler(engine, big, factory, options=options) as sched:
        exact, allow = await _two_idle_episodes(sched, factory, traj)
        held = big.snapshot().held
        _open(sched, factory, "new", AGENT)
        need = (await sched.admission.begin(sched._slots["new"], step_segments(factory, traj, 0),
                                            Priority.CRITICAL)).need_bytes
        for name in ("exact", "allow"):
            await sched.pressure.carry_out(Trim(sched._slots[name]))
        trims = held - big.snapshot().held
        slot = sched._slots["allow"]
        estimate = allow.state.checkpoint_bytes + engine.recurrent_bytes_per_seq
        await sched.pressure.carry_out(DropCheckpoints(slot))
        await sched.pressure.carry_out(DropRecurrent(slot))
        rung = held - trims - big.snapshot().held  # what the rung really frees
    # short by what the rung frees less a byte, or by a byte more than it could free
    budget = held + need - trims - (rung - 1 if covered else estimate + 1)
    ledger = MemoryLedger(budget)
    async with Scheduler(engine, ledger, factory, options=options) as sched:
        exact, allow = await _two_idle_episodes(sched, factory, traj)
        new = _open(sched, factory, "new", AGENT)
        with capture_logs() as logs:
            await sched.step(new, lambda: step_segments(factory, traj, 0))
        rungs = [e["reason"].split(" (")[0] for e in logs
                 if e["event"] == "fallback" and e.get("rung") == 1]
        trimmed = ["trimmed idle episode exact's sequence back to its reuse point",
                   "trimmed idle episode allow's sequence back to its reuse point"]
        if not covered:
            assert rungs == trimmed + ["evicted idle episode exact's cache state"]
            assert not allow.state.replay_next
            sched.check_integrity()
            return
        assert rungs == trimmed + ["dropped idle episode allow's checkpoints",
                                   "dropped idle episode allow's recurrent state"]
        assert allow.state.replay_next and not allow.state.checkpoints
        assert is_approximate(engine.seq_info(allow.seq).history)
        assert ledger.snapshot().peak <= budget
        ledger.budget = 1 << 30
        # the struck episode's next step: its policy's tail-replay variant, marked
        record = await sched.step(allow, lambda: step_segments(factory, traj, 2))
        assert record.start == "replay" and record.approximate and record.replay_tokens == 8
        assert not allow.state.replay_next
        # and it goes on approximately (its state is), reusing its (approximate) checkpoint
        record = await sched.step(allow, lambda: step_segments(factory, traj, 3))
        assert record.start == "truncate" and record.approximate and record.replay_tokens == 0
        for ep, i in ((exact, 2), (new, 1)):  # nobody else decodes from an approximate state
            r = await sched.step(ep, lambda i=i: step_segments(factory, traj, i))
            assert not r.approximate
        sched.check_integrity()
    assert ledger.snapshot().held == 0


async def test_dropping_only_the_checkpoints_of_a_trimmed_episode_stays_exact(engine) -> None:
    """terminal-slot cut back to its region checkpoint holds the state at that checkpoint:
    without the checkpoint its next step continues from the sequence's end — exactly."""
    factory = SegmentFactory(engine)
    traj = trajectory(4, 96, 64)
    async with Scheduler(engine, MemoryLedger(1 << 30), factory,
                         options=AGENT.step_options(SCREEN)) as sched:
        ep = _open(sched, factory, "a", RUNG)
        ref = _open(sched, factory, "ref", AGENT)
        for i in range(2):
            await sched.step(ep, lambda i=i: step_segments(factory, traj, i))
            await sched.step(ref, lambda i=i: step_segments(factory, traj, i))
        slot = sched._slots["a"]
        await sched.pressure.carry_out(Trim(slot))
        await sched.pressure.carry_out(DropCheckpoints(slot))
        sched.check_integrity()
        a = await sched.step(ep, lambda: step_segments(factory, traj, 2))
        b = await sched.step(ref, lambda: step_segments(factory, traj, 2))
        assert a.start == "keep" and not a.approximate and a.replay_tokens == 0
        assert a.output_tokens == b.output_tokens


def _marked(steps) -> list[bool]:
    """What the records must say, from the starts alone: a step is approximate iff its
    sequence was not cleared and it replayed a tail (itself or its prefetch), or the step
    before it was approximate (the state carries the approximation until a clear)."""
    out, carried = [], False
    for s in steps:
        carried = s.start != "clear" and (s.replay_tokens > 0 or carried)
        out.append(carried)
    return out


#: The squeeze's budget, in peaks of one episode: the 8 idle episodes' attention KV fits
#: beside the stepping one, their recurrent states and checkpoints do not.  On the tiny
#: model these are 11 KiB each against 280 bytes per token of KV (an idle episode is mostly
#: its 435-token prompt's KV), so the rung frees ~15 % of an idle episode and matters only
#: near this budget; at 1.0x it cannot keep anyone resident (every step is evicted and
#: cleared, with or without it).  On the M model the recurrent state and the checkpoint
#: are 1.2 MiB each: docs/benchmarks.md measures the squeeze at 1.0x there.
SQUEEZE = 4.0
EPISODES, STEPS = 8, 6


async def _reference(engine, factory, traj) -> tuple[int, list[tuple[int, ...]]]:
    """The squeeze's budget and the tokens of each step run alone without memory pressure."""
    calib = MemoryLedger(1 << 30)
    async with Scheduler(engine, calib, factory, options=AGENT.step_options(SCREEN)) as sched:
        (alone,) = await replay(sched, traj, 1)
    return int(calib.snapshot().peak * SQUEEZE), [s.output_tokens for s in alone.steps]


def _check_records(runs: list[list], reference: list[tuple[int, ...]]) -> None:
    """Every step decided; the records' marks (the engine's account of each sequence) are what the starts imply
    — approximate from a replay until the next clear — and every unmarked step decodes
    exactly the tokens of the same step run alone without memory pressure."""
    for steps in runs:
        assert all(s.status in ("ok", "degraded") for s in steps)
        assert [s.approximate for s in steps] == _marked(steps)
        assert all(s.start != "replay" or s.approximate for s in steps)
        for s, ref in zip(steps, reference):
            if not s.approximate:
                assert s.output_tokens == ref, s.step


async def test_the_squeeze_with_and_without_the_replay_rung(engine) -> None:
    """8 episodes stepped in lockstep (one step each, round after round: a fixed schedule,
    so the comparison does not hang on timing) at a budget where the rung matters, without
    and with it: nothing fails either way; with it, episodes lose checkpoints or recurrent
    states instead of whole caches, so fewer are evicted and fewer tokens are prefilled.
    (The tiny model's 4 greedy tokens came out the same from the approximate states too;
    test_tail_replay measures that a short replay does change the next-token
    distribution.)"""
    factory = SegmentFactory(engine)
    traj = trajectory(STEPS, 96, 64)
    budget, reference = await _reference(engine, factory, traj)
    seen: dict[bool, tuple[list, dict[str, int]]] = {}
    for rung in (False, True):
        ledger = MemoryLedger(budget)
        async with Scheduler(engine, ledger, factory, options=AGENT.step_options(SCREEN),
                             wait_s=10.0) as sched:
            episodes = [_open(sched, factory, f"ep{k}", RUNG if rung else AGENT)
                        for k in range(EPISODES)]
            runs: list[list] = [[] for _ in episodes]
            for i in range(STEPS):
                for ep, steps in zip(episodes, runs):
                    steps.append(await sched.step(
                        ep, lambda i=i: step_segments(factory, traj, i)))
            sched.check_integrity()
            counters = dict(sched.counters)
        snap = ledger.snapshot()
        assert snap.peak <= budget and snap.held == 0 and snap.reserved == 0
        _check_records(runs, reference)
        seen[rung] = ([s for steps in runs for s in steps], counters)
    (exact, c0), (approx, c1) = seen[False], seen[True]
    assert not any(s.approximate or s.replay_tokens for s in exact)
    assert c0.get("replay_rung_checkpoints", 0) == c0.get("replay_rung_recurrent", 0) == 0
    assert c1.get("replay_rung_recurrent", 0) > 0 and any(s.approximate for s in approx)
    assert c1.get("evicted_episodes", 0) < c0.get("evicted_episodes", 0)
    assert sum(s.prefill_tokens for s in approx) < sum(s.prefill_tokens for s in exact)


async def test_the_squeeze_through_the_shipping_loop_whatever_the_timing(engine) -> None:
    """The same squeeze with the rung on, 8 episodes at once through the shipping loop
    (overlapped prefetches, the memory queue): which episode is struck depends on timing,
    so only what must hold whatever it is: every episode finishes, the ledger returns to
    zero within budget, the marks follow from the starts and unmarked steps are exact."""
    factory = SegmentFactory(engine)
    traj = trajectory(STEPS, 96, 64)
    budget, reference = await _reference(engine, factory, traj)
    ledger = MemoryLedger(budget)
    async with Scheduler(engine, ledger, factory, options=AGENT.step_options(SCREEN),
                         wait_s=10.0) as sched:
        with anyio.fail_after(180):
            results = await replay(sched, traj, EPISODES, agent=RUNG)
        sched.check_integrity()
    assert [r.n_steps for r in results] == [STEPS] * EPISODES
    snap = ledger.snapshot()
    assert snap.peak <= budget and snap.held == 0 and snap.reserved == 0
    _check_records([list(r.steps) for r in results], reference)
