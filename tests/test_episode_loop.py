"""The async episode loop on simdesk with the real engine: overlap parity and bounds."""

from __future__ import annotations

import pytest

from cachepolicy.base import make_policy
from cachepolicy.sampling import SamplingParams
from cachepolicy.segments import SegmentFactory, model_info
from runtime.actions import ACTION_GRAMMAR, NoOp
from runtime.episode import run_episode
from runtime.session import NOOP_TEXT, AgentSession
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler
from scheduler.transaction import StepOptions
from vmenv.simdesk import SimDesk, SimDeskConfig

GRAMMAR_OPTS = StepOptions(decode_tokens=48, stop_at_eog=True,
                           sampling=SamplingParams(temperature=1.0, seed=3, grammar=ACTION_GRAMMAR))


async def _run(engine, *, overlap: bool, options: StepOptions = GRAMMAR_OPTS, steps: int = 6,
               policy: str = "terminal-slot"):
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(1 << 40)
    async with Scheduler(engine, ledger, factory, options=options) as sched:
        ep = sched.open_episode("e", make_policy(policy, model_info(engine), factory.kit,
                                                 window=3, decode_tokens=options.decode_tokens))
        env = SimDesk(SimDeskConfig(width=320, height=240, action_latency_s=0.01,
                                    done_on_success=False))
        session = AgentSession(sched, factory, ep, "open the terminal", (320, 240),
                               overlap=overlap)
        try:
            result = await run_episode(session, env, task="open-terminal", max_steps=steps)
        finally:
            await env.close()
    assert ledger.snapshot().held == 0 and ledger.snapshot().reserved == 0
    return result, session


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
async def test_overlap_is_token_for_token_identical(engines, arch) -> None:
    e = engines(arch)
    plain, _ = await _run(e, overlap=False)
    over, _ = await _run(e, overlap=True)
    assert [s.act.record.output_tokens for s in plain.steps] == \
        [s.act.record.output_tokens for s in over.steps]
    assert len(over.steps) >= 2
    # with overlap, the action text and retained screenshots left the critical path
    for p, o in zip(plain.steps[1:], over.steps[1:]):
        assert o.act.record.prefill_tokens < p.act.record.prefill_tokens
        assert o.act.prefetch is not None and o.act.prefetch.prefill_tokens > 0


async def test_grammar_constrained_steps_always_parse(engines) -> None:
    result, session = await _run(engines("qwen35"), overlap=True, steps=8)
    assert all(s.act.parsed for s in result.steps)
    assert session.unparsable == 0


async def test_unparsable_output_is_a_recorded_noop(engines) -> None:
    """Without the grammar a random model emits garbage: the step becomes a NoOp (counted,
    explained), the history gets a fixed marker instead of the raw text, and the loop goes on."""
    free = StepOptions(decode_tokens=6, stop_at_eog=False, sampling=SamplingParams())
    result, session = await _run(engines("qwen35"), overlap=True, options=free, steps=3)
    assert len(result.steps) == 3 and result.status == "max_steps"
    noops = [s for s in result.steps if isinstance(s.act.action, NoOp)]
    assert noops and session.unparsable == len(noops)
    assert all(s.act.action.reason for s in noops)
    assert session._history_text == NOOP_TEXT
