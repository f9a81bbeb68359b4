"""The step transaction: rollback before publication, generation fencing, ledger accounting."""

from __future__ import annotations

import pytest

from cachepolicy.policies import make_policy
from cachepolicy.context_log import ContextLog
from cachepolicy.errors import StalePublishError
from cachepolicy.segments import SegmentFactory, model_info
from replay_helpers import check_accounts, run_step, step_segments
from runtime.bench.trajectory import trajectory
from scheduler.errors import BudgetExceededError
from scheduler.ledger import MemoryLedger
from scheduler.transaction import EpisodeCache, StepOptions

OPTS = StepOptions(decode_tokens=4)


class Boom(RuntimeError):
    pass


def _episode(e, name, policy="terminal-slot", seq=0):
    factory = SegmentFactory(e)
    e.clear(seq)
    return factory, EpisodeCache(name, seq, make_policy(policy, model_info(e), factory.kit,
                                                        window=2, decode_tokens=4))


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_failure_before_publish_rolls_back_and_next_step_works(engines, arch) -> None:
    e = engines(arch)
    traj = trajectory(5, 96, 64)
    # reference outputs: the same trajectory with no failure
    factory, ref_ep = _episode(e, "ref")
    ledger = MemoryLedger(1 << 30)
    ref = [run_step(e, ref_ep, step_segments(factory, traj, i), ledger, OPTS).output_tokens
           for i in range(5)]
    ledger.drop("ref")

    factory, ep = _episode(e, "victim")
    ledger = MemoryLedger(1 << 30)
    outs = []
    for i in range(3):
        outs.append(run_step(e, ep, step_segments(factory, traj, i), ledger, OPTS).output_tokens)
    before = (ep.log, ep.state, ledger.snapshot().held, ledger.snapshot().reserved)

    def fail(point: str) -> None:
        raise Boom(point)

    with pytest.raises(Boom):
        run_step(e, ep, step_segments(factory, traj, 3), ledger, OPTS, fault=fail)
    # the parent is still what is published: the same log, generation and checkpoints; the
    # sequence (which the failed plan had already cut back) is accounted as it really is
    assert ep.log is before[0] and ep.state.generation == before[1].generation
    assert ep.state.checkpoints == before[1].checkpoints
    assert ledger.snapshot().reserved == before[3] == 0
    assert ledger.snapshot().held <= before[2]
    check_accounts(e, ep, ledger)
    for i in (3, 4):  # the same step again, then the next: both exact
        outs.append(run_step(e, ep, step_segments(factory, traj, i), ledger, OPTS).output_tokens)
        check_accounts(e, ep, ledger)
    assert outs == ref
    ledger.drop("victim")
    assert ledger.snapshot().held == 0 and ledger.snapshot().reserved == 0


def test_a_stale_generation_cannot_publish(engines) -> None:
    e = engines("qwen35")
    traj = trajectory(3, 96, 64)
    factory, ep = _episode(e, "race")
    ledger = MemoryLedger(1 << 30)
    run_step(e, ep, step_segments(factory, traj, 0), ledger, OPTS)
    winner = []

    def overtake(point: str) -> None:  # another transaction publishes first
        if not winner:
            winner.append(run_step(e, ep, step_segments(factory, traj, 1), ledger, OPTS))

    with pytest.raises(StalePublishError, match="was published after"):
        run_step(e, ep, step_segments(factory, traj, 1), ledger, OPTS, fault=overtake)
    assert ep.state.generation == winner[0].generation == 2
    assert ledger.held_by("race") == ep.state.held_bytes  # the loser changed nothing
    assert ledger.snapshot().reserved == 0


def test_budget_too_small_is_refused_before_any_work(engines) -> None:
    e = engines("qwen35")
    traj = trajectory(2, 96, 64)
    factory, ep = _episode(e, "tight")
    ledger = MemoryLedger(1000)
    with pytest.raises(BudgetExceededError):
        run_step(e, ep, step_segments(factory, traj, 0), ledger, OPTS)
    assert ep.log == ContextLog() and ledger.snapshot().reserved == 0
    assert e.seq_info(0).n_tokens == 0  # nothing was executed


@pytest.mark.parametrize("policy", ["terminal-slot", "terminal-scratch", "noevict", "evict"])
def test_forecast_bounds_what_is_held_and_ledger_tracks_it(engines, policy) -> None:
    e = engines("qwen35")
    traj = trajectory(4, 96, 64)
    factory, ep = _episode(e, policy, policy=policy)
    ledger = MemoryLedger(1 << 30)
    for i in range(4):
        rec = run_step(e, ep, step_segments(factory, traj, i), ledger, OPTS)
        check_accounts(e, ep, ledger)
        assert rec.kv_bytes == e.state_bytes(0)  # what llama.cpp reports for the sequence
        assert ledger.held_by(policy) == rec.kv_bytes + rec.checkpoint_bytes
        assert rec.forecast_peak_bytes >= rec.kv_bytes + rec.checkpoint_bytes
        assert rec.ledger_peak_bytes <= ledger.budget
    ledger.drop(policy)
    assert ledger.snapshot().held == 0


def test_context_log_is_immutable_and_generational(engines) -> None:
    e = engines("llama")
    factory = SegmentFactory(e)
    log0 = ContextLog()
    log1 = log0.append(factory.preamble("sys"), factory.instruction("do it"))
    log2 = log1.append(factory.action(0, "click(1, 2)"))
    assert (log0.generation, log1.generation, log2.generation) == (0, 1, 2)
    assert len(log1.segments) == 2 and log2.new_since(log1)[0].key == "action@0"
    with pytest.raises(ValueError, match="already in the log"):
        log2.append(factory.action(0, "click(3, 4)"))
