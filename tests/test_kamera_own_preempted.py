"""``kamera@own`` when another episode's critical work stops its prefetch (issue 48: behind
``kvagent serve`` at bench-peer's N = 4, llama M, a few steps a run prefilled the whole
window again, 1789-1918 tokens against 592).  The prefetch's start cuts the survivors out
of the sequence and writes them back, moved, from rows it read out before — as
window-replay's does (a267ea8) — so a stop in between published the sequence without them
and the next step found nothing to place.  Here a real critical step of another episode
queues behind the prefetch at the first point it reaches — its first piece boundary before
the fix, the end of its plan since (``preempt_helpers.PreemptHook`` at a boundary or before
publication: deterministic) — on the forged llama through the scheduler that ships."""

from __future__ import annotations

import pytest

from cachepolicy.policies import make_policy
from cachepolicy.segments import SegmentFactory, model_info
from preempt_helpers import PreemptHook, step_after_prefetch, tokens_from, warmed_pair
from replay_helpers import OPTIONS, past_step
from runtime.bench.trajectory import trajectory
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler

WINDOW = 3

#: every policy that splices without a store (``Splice.hold_until_placed``)
STORELESS = [("kamera", "own"), ("random-evict", None), ("recency-evict", None)]


@pytest.mark.parametrize(("name", "option"), STORELESS, ids=["kamera@own", "random-evict",
                                                              "recency-evict"])
async def test_a_stopped_prefetch_keeps_the_survivors_it_moved(engines, name, option) -> None:
    """With another episode's critical step queued behind it, the prefetch still writes the
    survivors back (placed, not prefilled: its plan has no piece boundary after them, so it
    runs to its end and is not stopped); the next step prefills the new screenshot and its
    text only — never the whole window again (before: the prefetch stopped at its first
    boundary, prefilled nothing and left the sequence without the survivors) — and the
    ledger matches the engine."""
    engine = engines("llama")
    factory = SegmentFactory(engine)
    traj = trajectory(5, 96, 64)
    ledger = MemoryLedger(1 << 30)
    hook = PreemptHook(points=("between_pieces", "before_publish"))

    def policy():
        return make_policy(name, model_info(engine), factory.kit, window=WINDOW,
                           decode_tokens=4, option=option)

    async with Scheduler(engine, ledger, factory, options=OPTIONS, fault=hook,
                         spare_sequence=True) as sched:
        a, b = await warmed_pair(sched, factory, traj, policy)
        pre, critical = await hook.stop_prefetch(sched, factory, traj, a, b)
        assert critical.status == "ok"
        assert pre is not None and not pre.preempted and pre.approximate
        assert pre.prefill_tokens > 0
        assert sched.counters["prefetch_preempted"] == 0
        rec, tokens = await step_after_prefetch(sched, engine, factory, traj, a)
        assert rec.status == "ok" and rec.approximate
        window = tokens_from(tokens, "screenshot@1:intro")
        assert rec.prefill_tokens == tokens_from(tokens, "screenshot@3:intro") < window
        for ep in (a, b):
            await sched.close_episode(ep)
    assert ledger.snapshot().held == 0
