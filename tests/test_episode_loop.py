"""The async episode loop on simdesk with the real engine: overlap parity and bounds."""

from __future__ import annotations

import time

import attrs
import pytest

from cachepolicy.segments import SegmentFactory
from runtime.actions import NoOp
from runtime.config import AgentConfig
from runtime.driver import EpisodeDriver
from runtime.env_loop import run_episode
from runtime.profiles.kvagent import NOOP_TEXT
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler
from vmenv.simdesk.env import SimDesk, SimDeskConfig

GRAMMAR = AgentConfig(decode_tokens=48, temperature=1.0, seed=3)


async def _run(engine, *, overlap: bool, agent: AgentConfig = GRAMMAR, steps: int = 6,
               policy: str = "terminal-slot", piece_pause_s: float = 0.0):
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(1 << 40)
    agent = attrs.evolve(agent, overlap=overlap, policy=policy)
    async with Scheduler(engine, ledger, factory, options=agent.step_options((320, 240))) as sched:
        if piece_pause_s:  # every job pauses between its pieces (the outputs cannot change)
            sched.fault = lambda point: time.sleep(piece_pause_s) if point == "between_pieces" \
                else None
        driver = EpisodeDriver.open(sched, factory, agent, "e", "open the terminal", (320, 240))
        env = SimDesk(SimDeskConfig(width=320, height=240, action_latency_s=0.01,
                                    done_on_success=False))
        try:
            result = await run_episode(driver, env, task="open-terminal", max_steps=steps)
        finally:
            await env.close()
            await driver.aclose()
        sched.check_integrity()
    assert ledger.snapshot().held == 0 and ledger.snapshot().reserved == 0
    return result, driver.session


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
async def test_overlap_is_token_for_token_identical(engines, arch) -> None:
    e = engines(arch)
    # pauses between pieces make every prefetch outlast the VM's 10 ms
    plain, _ = await _run(e, overlap=False, piece_pause_s=0.03)
    over, _ = await _run(e, overlap=True, piece_pause_s=0.03)
    waited, _ = await _run(e, overlap=True, piece_pause_s=0.03,
                           agent=attrs.evolve(GRAMMAR, encode_ahead=False))
    assert [s.output_tokens for s in plain.steps] == [s.output_tokens for s in over.steps]
    assert plain.output_sha256 == over.output_sha256 == waited.output_sha256
    # screenshots arrive while prefetches run: encoded ahead when the encoder runs beside the
    # llama context (1 thread here: on 2+ cores), the outputs above unchanged; without
    # encode_ahead, never
    ahead = [s.encode_ahead_s > 0 for s in over.steps[1:]]
    assert ahead == [e.encoder_runs_beside] * len(ahead)
    assert all(s.encode_ahead_s == 0 for s in waited.steps + plain.steps)
    assert len(over.steps) >= 2
    # with overlap, the action text and retained screenshots left the critical path, while
    # the step as a whole prefilled the same tokens
    for p, o in zip(plain.steps[1:], over.steps[1:]):
        assert o.critical_path_prefill_tokens < p.critical_path_prefill_tokens
        assert o.prefetch_prefill_tokens > 0 and p.prefetch_prefill_tokens == 0
        assert o.prefill_tokens == p.prefill_tokens
        assert o.critical_path_prefill_tokens + o.prefetch_prefill_tokens == o.prefill_tokens


async def test_grammar_constrained_steps_always_parse(engines) -> None:
    result, session = await _run(engines("qwen35"), overlap=True, steps=8)
    assert all(s.parsed for s in result.steps)
    assert session.unparsable == 0


async def test_unparsable_output_is_a_recorded_noop(engines) -> None:
    """Without the grammar a random model emits garbage: the step becomes a NoOp (counted,
    explained), the history gets a fixed marker instead of the raw text, and the loop goes on."""
    free = AgentConfig(grammar=False, decode_tokens=6, stop_at_eog=False)
    noops: list[NoOp] = []

    def on_step(t, obs, step, outcome, metrics) -> None:
        if isinstance(step.act.action, NoOp):
            noops.append(step.act.action)
            assert metrics.action is None and not metrics.parsed

    result, session = await _run_with(engines("qwen35"), free, on_step)
    assert len(result.steps) == 3 and result.status == "max_steps"
    assert noops and session.unparsable == len(noops) == result.unparsable
    assert all(a.reason for a in noops)
    assert session.history_text == NOOP_TEXT


async def _run_with(engine, agent: AgentConfig, on_step):
    factory = SegmentFactory(engine)
    async with Scheduler(engine, MemoryLedger(1 << 40), factory,
                         options=agent.step_options((320, 240))) as sched:
        driver = EpisodeDriver.open(sched, factory, agent, "e", "open the terminal", (320, 240))
        env = SimDesk(SimDeskConfig(width=320, height=240, action_latency_s=0.01,
                                    done_on_success=False))
        try:
            result = await run_episode(driver, env, task="open-terminal", max_steps=3,
                                       on_step=on_step)
        finally:
            await env.close()
            await driver.aclose()
    return result, driver.session
