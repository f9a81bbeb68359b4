"""Success as OSWorld counts it (the default) and the old stop-on-success rule, through
``run_agents`` — the loop ``kvagent run`` and ``bench-eval`` ship — on a real simdesk.

The forged model's actions are aimless, so a scripted hand executes a fixed script whatever
the agent decided (as ``tests/train_helpers.ExpertHand`` does): solve ``type-in-field``, then
undo it, or say done() in between.  The env is the one ``simdesk_env`` builds from the run's
config, so the rule reaches it the way it reaches every episode the runtime drives."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from runtime.config import AgentConfig
from runtime.run.agents import EpisodeSpec, RunConfig, run_agents, simdesk_env
from runtime.run.success import (
    OSWORLD_RULE, STOP_ON_SUCCESS_RULE, ended_by_done, rule_label, succeeded, success_rule,
)
from vmenv.actions import Action, Done, Press
from vmenv.base import Observation, StepOutcome
from vmenv.simdesk import SimDesk, SimDeskConfig

TASK = "type-in-field@9"  # the instance issue 47 saw undone under OSWorld's run.py


class ScriptedHand:
    """The run's simdesk, on which step i executes ``script(solution)[i]`` whatever the agent
    decided (``solution``: the task's scripted solution from its first state)."""

    def __init__(self, desk: SimDesk, script) -> None:
        self.desk, self.script, self.actions = desk, script, ()

    async def reset(self, task: str | None = None) -> Observation:
        obs = await self.desk.reset(task)
        self.actions = tuple(self.script(self.desk.solution()))
        return obs

    async def step(self, action: Action) -> StepOutcome:
        return await self.desk.step(self.actions[self.desk.state.step])

    async def close(self) -> None:
        await self.desk.close()


#: without the grammar the forged model's few tokens never parse (NoOps): the agent itself
#: never ends the episode, so only the script's done() and the rule do
AIMLESS = AgentConfig(grammar=False, decode_tokens=2, stop_at_eog=False, temperature=1.0,
                      seed=1)


def _config(stop_on_success: bool, max_steps: int) -> RunConfig:
    return RunConfig(agent=AIMLESS, episodes=1, tasks=(TASK,),
                     max_steps=max_steps, screen=(320, 240), vm_seconds=0.0,
                     stop_on_success=stop_on_success)


async def _run(engine, stop_on_success: bool, max_steps: int, script):
    config = _config(stop_on_success, max_steps)
    desks = simdesk_env(config)

    def make_env(spec: EpisodeSpec) -> ScriptedHand:
        desk = desks(spec)
        assert isinstance(desk, SimDesk) and desk.config.done_on_success is stop_on_success
        return ScriptedHand(desk, script)

    result = await run_agents(engine, config, None, make_env=make_env)
    (episode,) = result.episodes
    assert episode.unparsable == episode.n_steps  # what ended it was not the agent's choice
    return result, episode


def _undo(solution: Sequence[Action]) -> list[Action]:
    return [*solution, *[Press("backspace")] * 6]  # "jackal", typed and then deleted


async def test_undoing_a_solved_task_scores_zero_by_default_and_one_when_stopped(
        engines) -> None:
    engine = engines("qwen35")
    n_solve = len(await _solution())
    # OSWorld's rule: the episode runs to max_steps; the final state is unsolved
    result, ep = await _run(engine, False, 8, _undo)
    assert result.success_rule == OSWORLD_RULE
    assert (ep.status, ep.n_steps, ep.reward) == ("max_steps", 8, 0.0)
    assert not succeeded(ep.reward, ep.status)
    # stop-on-success: the same script ends at the solving step, counted a success
    result, ep = await _run(engine, True, 8, _undo)
    assert result.success_rule == STOP_ON_SUCCESS_RULE
    assert ep.status == "done" and ep.reward == 1.0 and succeeded(ep.reward, ep.status)
    assert ep.n_steps == n_solve < 8


@pytest.mark.parametrize("stop_on_success", [False, True])
async def test_done_ends_the_episode_at_once_and_the_final_state_is_scored(
        engines, stop_on_success: bool) -> None:
    """A done() right after solving: the episode ends on that step (nothing after it runs)
    and succeeds under either rule; a done() before solving ends it as a failure."""
    engine = engines("qwen35")
    n_solve = len(await _solution())
    _, ep = await _run(engine, stop_on_success, 8,
                       lambda s: [*s, Done(), *[Press("backspace")] * 6])
    # stop-on-success ends at the solving step already, before the done()
    assert ep.n_steps == n_solve + (0 if stop_on_success else 1)
    assert (ep.status, ep.reward) == ("done", 1.0)
    _, ep = await _run(engine, stop_on_success, 8, lambda s: [*s[:-1], Done(), *s[-1:]])
    assert (ep.status, ep.n_steps, ep.reward) == ("done", n_solve, 0.0)


async def _solution() -> tuple[Action, ...]:
    desk = SimDesk(SimDeskConfig(width=320, height=240))
    await desk.reset(TASK)
    return desk.solution()


def test_the_rules_are_named_and_done_is_read_from_the_last_action() -> None:
    assert success_rule(False) == "osworld" and success_rule(True) == "stop-on-success"
    assert "OSWorld" in rule_label(OSWORLD_RULE)
    assert "checker passes" in rule_label(STOP_ON_SUCCESS_RULE)
    assert ended_by_done(["click(1, 2)", "done()"])
    assert not ended_by_done(["done()", "click(1, 2)"]) and not ended_by_done([])
    assert not ended_by_done(["click(1, 2)", None])
    assert RunConfig().success_rule == OSWORLD_RULE  # the default everywhere
