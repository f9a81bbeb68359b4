"""``Scheduler.check_integrity``: two independent counts — the ledger's accounts against the
engine's own report — that agree after real work and disagree when either side drifts."""

from __future__ import annotations

import pytest

from cachepolicy.errors import ContextFullError
from cachepolicy.segments import SegmentFactory
from replay_helpers import AGENT, OPTIONS, SCREEN, check_accounts, replay, run_step, step_segments
from runtime.bench.trajectory import trajectory
from scheduler.errors import IntegrityError
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler
from scheduler.transaction import EpisodeCache


@pytest.fixture
def engine(forged):
    from cachepolicy.engine import Engine, EngineConfig

    m = forged("qwen35")
    with Engine(m.model_path, m.mmproj_path,
                EngineConfig(n_ctx_per_seq=1024, n_seq_max=3, n_batch=32, n_threads=1)) as e:
        yield e


async def _two_steps(sched: Scheduler, factory: SegmentFactory, traj):
    ep = sched.open_episode("a", AGENT.make_policy(factory, SCREEN))
    for i in range(2):
        await sched.step(ep, lambda i=i: step_segments(factory, traj, i))
    return ep


async def test_integrity_holds_after_real_episodes(engine) -> None:
    factory = SegmentFactory(engine)
    traj = trajectory(4, 96, 64)
    async with Scheduler(engine, MemoryLedger(1 << 30), factory,
                         options=OPTIONS) as sched:
        await replay(sched, traj, 2)
        sched.check_integrity()
        ep = await _two_steps(sched, factory, traj)
        sched.check_integrity()  # an episode holding a sequence and a checkpoint
        assert sched.ledger.held_by(ep.episode_id) > 0
        assert sched.counters["integrity_checks"] >= 2


async def test_a_ledger_that_under_counts_a_sequence_fails_the_check(engine) -> None:
    """The drift once seen after a rollback: the engine's sequence 5.6 KB larger than what
    the ledger holds for it."""
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(1 << 30)
    async with Scheduler(engine, ledger, factory, options=OPTIONS,
                         debug=False) as sched:
        ep = await _two_steps(sched, factory, trajectory(3, 96, 64))
        right = ledger.held_by(ep.episode_id)
        ledger.publish(ep.episode_id, right - 5600, None)
        with pytest.raises(IntegrityError, match="episode a: the ledger holds"):
            sched.check_integrity()
        ledger.publish(ep.episode_id, right, None)
        sched.check_integrity()


async def test_tokens_in_a_sequence_no_episode_owns_fail_the_check(engine) -> None:
    factory = SegmentFactory(engine)
    async with Scheduler(engine, MemoryLedger(1 << 30), factory,
                         options=OPTIONS, debug=False) as sched:
        await _two_steps(sched, factory, trajectory(3, 96, 64))
        stray = sched._free_seqs[0]
        engine.prefill_tokens(stray, [3, 4, 5, 6])
        with pytest.raises(IntegrityError, match=rf"sequences \[{stray}\] hold tokens"):
            sched.check_integrity()
        engine.clear(stray)
        sched.check_integrity()


async def test_a_holding_left_by_a_closed_episode_fails_the_check(engine) -> None:
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(1 << 30)
    async with Scheduler(engine, ledger, factory, options=OPTIONS,
                         debug=False) as sched:
        ledger.publish("ghost", 1234, None)
        with pytest.raises(IntegrityError, match="owners that are not open: \\['ghost'\\]"):
            sched.check_integrity()
        ledger.drop("ghost")


def test_a_context_full_rollback_leaves_the_accounts_right(engine) -> None:
    """A step that runs out of context after prefilling some pieces rolls back; the
    sequence is brought back to what the ledger holds for it (not left larger).  (The
    scheduler's admission refuses such a plan before it runs — test_faults_engine.py — so the
    transactions run here directly, as a plan the admission misjudged would.)"""
    factory = SegmentFactory(engine)
    traj = trajectory(40, 384, 256)
    per_shot = engine.image_tokens(traj.frames[0].screenshot)[0]
    assert 40 * per_shot > 1024  # the context cannot hold them all
    grows = AGENT.make_policy(factory, SCREEN, policy="noevict")  # the prompt grows every step
    ledger = MemoryLedger(1 << 30)
    ep = EpisodeCache("grows", 0, grows)
    done = 0
    with pytest.raises(ContextFullError):
        for i in range(40):
            run_step(engine, ep, step_segments(factory, traj, i), ledger, OPTIONS)
            check_accounts(engine, ep, ledger)
            done += 1
    assert done >= 1 and ep.state.generation == done  # the failed step published nothing
    check_accounts(engine, ep, ledger)  # its partial prefill is accounted for
    assert ledger.snapshot().reserved == 0
    engine.clear(0)


async def test_no_idle_check_runs_while_an_episode_closes(engine, monkeypatch) -> None:
    """Closing clears the engine's sequence before the ledger drops the episode: in between
    the two counts differ, so the close counts as a job and an idle check (another episode's
    job ending then — its decode runs outside the engine gate) does not run.  Seen as a false
    IntegrityError before."""
    factory = SegmentFactory(engine)
    async with Scheduler(engine, MemoryLedger(1 << 30), factory, options=OPTIONS,
                         debug=False) as sched:
        ep = await _two_steps(sched, factory, trajectory(3, 96, 64))
        real_clear, seen = engine.clear, []

        def clear_then_check(seq: int) -> None:
            real_clear(seq)
            with pytest.raises(IntegrityError) as err:  # in the window
                sched.check_integrity()
            seen.append(str(err.value))

        monkeypatch.setattr(engine, "clear", clear_then_check)
        await sched.close_episode(ep)
        monkeypatch.undo()
        assert seen == ["check_integrity needs an idle scheduler (jobs are running)"]
        sched.check_integrity()  # after the close both counts agree again
