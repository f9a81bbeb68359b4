"""``kamera@own``'s step after its prefetch keeps what the prefetch placed (issue 48).

The prefetch writes the survivors at the positions the next step gives them; the step used
to cut them out again and write them back unchanged (re-rotated by 0) — one more read and
write of the whole sequence on the critical path, about 0.1 s a step behind ``kvagent
serve`` at bench-peer's N = 4 (docs/benchmarks.md §10).  Now it continues from the
prefetch (``SplicingPolicy._continue``): no KV write, the new screenshot and the generation
prompt prefilled, the step still marked approximate — and the same answer as the old path,
token for token, on the forged llama through the scheduler that ships."""

from __future__ import annotations

from cachepolicy.policies import make_policy
from cachepolicy.segments import SegmentFactory, model_info
from preempt_helpers import step_after_prefetch, tokens_from
from replay_helpers import OPTIONS, past_step, step_segments
from runtime.bench.trajectory import trajectory
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler


async def _after_prefetch(engine, factory, traj, *, continues: bool):
    """The step on ``traj``'s fourth screenshot after the prefetch of its third action: its
    record, its prompt's tokens per piece, and the KV writes the step made."""
    ledger = MemoryLedger(1 << 30)
    writes: list[int] = []
    write = engine.kv_write_attention

    def counted(seq, rows, history):
        writes.append(seq)
        return write(seq, rows, history)

    policy = make_policy("kamera", model_info(engine), factory.kit, window=3,
                         decode_tokens=4, option="own")
    if not continues:  # the path before: the step re-places the survivors
        policy.continues_prefetch = lambda: False
    async with Scheduler(engine, ledger, factory, options=OPTIONS,
                         spare_sequence=True) as sched:
        ep = sched.open_episode("a", policy)
        for i in range(3):
            await sched.step(ep, lambda i=i: step_segments(factory, traj, i))
        pre = await sched.prefetch(ep, lambda: (past_step(factory, traj, 2),))
        assert pre is not None and pre.approximate
        engine.kv_write_attention = counted
        try:
            rec, tokens = await step_after_prefetch(sched, engine, factory, traj, ep)
        finally:
            del engine.kv_write_attention  # the class's method again
        await sched.close_episode(ep)
    assert ledger.snapshot().held == 0
    return rec, tokens, writes


async def test_the_step_after_a_prefetch_keeps_the_survivors_it_placed(engines) -> None:
    engine = engines("llama")
    factory = SegmentFactory(engine)
    traj = trajectory(5, 96, 64)
    rec, tokens, writes = await _after_prefetch(engine, factory, traj, continues=True)
    before, _, writes_before = await _after_prefetch(engine, factory, traj, continues=False)
    assert writes_before, "the old path wrote the survivors back at the step"
    assert writes == []  # nothing read out and written back on the critical path
    assert rec.status == "ok" and rec.approximate and rec.start == "keep"
    assert rec.prefill_tokens == tokens_from(tokens, "screenshot@3:intro")
    assert rec.critical_path_prefill_tokens == rec.prefill_tokens
    assert rec.prefill_tokens == before.prefill_tokens
    assert rec.output_tokens == before.output_tokens  # the same cache, the same answer
