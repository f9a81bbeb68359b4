"""``window-replay`` when other episodes' critical work stops its prefetch (issue 48: behind
``kvagent serve`` at N = 4 a third of the steps re-prefilled the whole window, never at
N = 1).  The prefetch restores the region checkpoint — which cuts the retained screenshots
out of the sequence — and writes them back, moved, from rows it read out before; a stop in
between published the sequence without them, and the next step found nothing to place.
Here a real critical step of another episode stops the prefetch at its first piece boundary
(``preempt_helpers``: deterministic), on the forged qwen35 through the scheduler that
ships."""

from __future__ import annotations

from cachepolicy.policies import make_policy
from cachepolicy.segments import SegmentFactory, model_info
from preempt_helpers import PreemptHook, step_after_prefetch, tokens_from, warmed_pair
from replay_helpers import OPTIONS
from runtime.bench.trajectory import trajectory
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler

WINDOW = 3


async def test_a_stopped_prefetch_keeps_the_window_it_moved(engines) -> None:
    """Stopped by another episode's step, the prefetch has still placed the kept screenshot
    (counted as placed, not prefilled) and stops before the budget's replay; the episode's
    next step continues from there — approximate, the replay and the new screenshot on its
    critical path, never the whole window again — and the ledger matches the engine."""
    engine = engines("qwen35")
    factory = SegmentFactory(engine)
    traj = trajectory(5, 96, 64)
    ledger = MemoryLedger(1 << 30)
    hook = PreemptHook()

    def policy():
        return make_policy("window-replay", model_info(engine), factory.kit, window=WINDOW,
                           decode_tokens=4, option="10%")

    async with Scheduler(engine, ledger, factory, options=OPTIONS, fault=hook,
                         spare_sequence=True) as sched:
        a, b = await warmed_pair(sched, factory, traj, policy)
        pre, critical = await hook.stop_prefetch(sched, factory, traj, a, b)
        assert critical.status == "ok"
        assert pre is not None and pre.preempted and pre.approximate
        assert sched.counters["prefetch_preempted"] == 1
        # the step's prompt (terminal layout): [head][history][window][generation prompt]
        rec, tokens = await step_after_prefetch(sched, engine, factory, traj, a)
        # the prefetch prefilled the history line only: the kept screenshot was placed
        assert pre.prefill_tokens == tokens["action@2"]
        assert rec.status == "ok" and rec.start == "keep" and rec.approximate
        # the budget's replayed screenshot and the new one with their text — not the whole
        # window again (terminal-slot's plan: the fallback before the fix)
        window = tokens_from(tokens, "screenshot@1:intro")
        assert rec.prefill_tokens == tokens_from(tokens, "screenshot@2") < window
        for ep in (a, b):
            await sched.close_episode(ep)
    assert ledger.snapshot().held == 0
