"""Test your own cache policy and agent with kvagent's pytest plugin: copy this file.

The ``kvagent_*`` fixtures come with kvagent (its ``pytest11`` entry point): no conftest, no
configuration.  Replace ``custom_policy`` with the module that registers your policy
(examples/custom_policy.py shows how one is written) and the names below with its names.

    cd examples && pytest -q test_my_policy.py     # ~20 s on 2 cores

Both async test runners work: the first test runs under pytest-asyncio, the second under
anyio (mark yours with whichever you use).
"""

from __future__ import annotations

import pytest

import custom_policy  # noqa: F401  registers "pinned-first" and "pinned-first-scratch"
from runtime.config import AgentConfig
from runtime.driver import EpisodeDriver

MY_POLICY = "pinned-first"
MY_REFERENCE = "pinned-first-scratch"  # the same prompt, prefilled from scratch every step
SCREEN = (640, 384)  # the shipped agent's screen


@pytest.mark.asyncio
@pytest.mark.parametrize("arch", ["qwen35", "llama"])  # a hybrid and an attention-only model
async def test_my_policy_decodes_what_its_reference_decodes(kvagent_assert_exact, arch):
    # the bench trajectory through both policies on a forged tiny model: the same tokens
    # at every step, or NotExactError names the first step that differs
    mine, ref = await kvagent_assert_exact(MY_POLICY, MY_REFERENCE, engine=arch, steps=6)
    # ... and the policy earned its keep: after the first step it prefilled less
    assert all(m.prefill_tokens < r.prefill_tokens
               for m, r in zip(mine.episode.steps[1:], ref.episode.steps[1:]))


@pytest.mark.anyio
async def test_the_shipped_agent_steps_on_simdesk_with_my_policy(
        kvagent_shipped_engine, kvagent_scheduler, kvagent_simdesk):
    agent = AgentConfig(policy=MY_POLICY)
    env = kvagent_simdesk(*SCREEN)
    # the scheduler's ledger must be back at zero when the block ends
    async with kvagent_scheduler(kvagent_shipped_engine(), agent=agent, screen=SCREEN,
                                 budget=512 << 20) as sched, env:
        obs = await env.reset("open-terminal@1")  # a held-out instance
        driver = EpisodeDriver.open(sched, sched.factory, agent, "ep0", obs.instruction,
                                    obs.size)
        try:
            step = await driver.act(obs.screenshot, screen=obs.size)
            outcome = await env.step(step.act.action)
        finally:
            await driver.aclose()
    assert step.act.parsed, step.act.response
    assert outcome.info["success"], f"{step.act.response!r} did not open the terminal"
