"""Slips: the agent's own mistakes in a demonstration — executed like any action, marked,
never the expert's action, and recovered from by the expert on every kind."""

from __future__ import annotations

import itertools
import random

import pytest

from vmenv.actions import Click, TypeText
from vmenv.simdesk import SimDesk, SimDeskConfig, demonstration, sample_task, task_kinds
from vmenv.simdesk import train_seeds
from vmenv.simdesk.apply import apply_action
from vmenv.simdesk.render import render_png
from vmenv.simdesk.slips import wrong_action
from vmenv.simdesk.widgets import hit

SCREEN = (640, 360)


@pytest.mark.parametrize("kind", task_kinds())
def test_the_expert_recovers_from_a_slip_at_any_step(kind: str) -> None:
    for seed in itertools.islice(train_seeds(), 12):
        task = sample_task(kind, seed)
        plain = demonstration(task, *SCREEN)
        for k in range(len(plain)):
            demo = demonstration(task, *SCREEN, slip_at=k, rng=random.Random(seed * 31 + k))
            assert demo[:k] == plain[:k]
            assert [s.slip for s in demo] == [i == k for i in range(len(demo))]
            assert demo[k].action != plain[k].action and demo[k].state == plain[k].state
            last = demo[-1]
            assert task.check(apply_action(last.state, last.action))
            assert len(demo) <= len(plain) + 8


def test_a_wrong_click_hits_another_widget_and_a_wrong_word_is_wrong() -> None:
    task = sample_task("save-note", 3)
    demo = demonstration(task, *SCREEN)
    rng = random.Random(0)
    for step in demo:
        for _ in range(20):
            wrong = wrong_action(step.state, step.action, rng)
            assert wrong != step.action
            if isinstance(step.action, Click) and isinstance(wrong, Click):
                assert hit(step.state, wrong.x, wrong.y) != hit(step.state, step.action.x,
                                                                step.action.y)
            if isinstance(wrong, TypeText) and isinstance(step.action, TypeText):
                assert wrong.text != step.action.text


async def test_a_slip_is_executed_by_the_env_as_demonstrated() -> None:
    task = sample_task("menu-launch", 4)
    demo = demonstration(task, *SCREEN, slip_at=1, rng=random.Random(5))
    env = SimDesk(SimDeskConfig(width=SCREEN[0], height=SCREEN[1]), tasks={task.name: task})
    shots = [(await env.reset(task.name)).screenshot]
    for step in demo:
        out = await env.step(step.action)
        shots.append(out.observation.screenshot)
    assert shots[:-1] == [render_png(s.state) for s in demo] and out.reward == 1.0


@pytest.mark.parametrize("kind", ["save-note", "menu-launch", "switch-window", "type-in-field"])
def test_early_typing_runs_are_recovered_from(kind: str) -> None:
    """The trained agents' commonest error: the task's word typed before its field is ready,
    and typed again.  As slips (``early_text``, ``slip_run``) every such step types the word
    where the expert would click, and the expert still solves the task after them."""
    for seed in itertools.islice(train_seeds(), 8):
        task = sample_task(kind, seed)
        assert task.goal is not None and task.goal.text
        plain = demonstration(task, *SCREEN)
        clicks = [i for i, s in enumerate(plain) if isinstance(s.action, Click)]
        for k in clicks:
            demo = demonstration(task, *SCREEN, slip_at=k, slip_run=2,
                                 early_text=task.goal.text, rng=random.Random(seed + k))
            assert demo[:k] == plain[:k]
            slips = [s for s in demo if s.slip]
            assert 1 <= len(slips) <= 2 and [i for i, s in enumerate(demo) if s.slip][0] == k
            assert slips[0].action == TypeText(task.goal.text)
            for s in slips:  # typed wherever a click was due; otherwise a plain slip
                if isinstance(task.next_action(s.state), Click):
                    assert s.action == TypeText(task.goal.text)
                assert s.action != task.next_action(s.state)
            assert not any(s.slip for s in demo[k + 2:])
            last = demo[-1]
            assert task.check(apply_action(last.state, last.action))


@pytest.mark.parametrize("kind", ["type-in-field", "save-note", "menu-launch"])
def test_without_word_slips_no_demonstration_backspaces_after_typing(kind: str) -> None:
    """``word_slips=False`` (``kvagent train --no-word-slips``): a slip at a typing step is a
    click, and nothing after a typed word presses backspace — where with word slips the same
    rollouts do both (the check reads real wrong words)."""
    from vmenv.actions import Press

    def after_typing(demo) -> list:
        return [b.action for a, b in zip(demo, demo[1:]) if isinstance(a.action, TypeText)]

    wrong_words = backspaced = 0
    for seed in itertools.islice(train_seeds(), 12):
        task = sample_task(kind, seed)
        plain = demonstration(task, *SCREEN)
        for k in [i for i, s in enumerate(plain) if isinstance(s.action, TypeText)]:
            rng_seed = seed * 7 + k
            with_words = demonstration(task, *SCREEN, slip_at=k, rng=random.Random(rng_seed))
            without = demonstration(task, *SCREEN, slip_at=k, rng=random.Random(rng_seed),
                                    word_slips=False)
            wrong_words += isinstance(with_words[k].action, TypeText)
            backspaced += Press("backspace") in after_typing(with_words)
            assert isinstance(without[k].action, Click) and without[k].slip
            assert Press("backspace") not in after_typing(without)
            last = without[-1]
            assert task.check(apply_action(last.state, last.action))
    assert wrong_words >= 4 and backspaced >= 4


def test_the_recipe_passes_word_slips_to_every_rollout() -> None:
    """``RecipeConfig.word_slips`` reaches the dataset's rollouts: with it off no slipped
    episode types a wrong word, where the same episodes with it on do."""
    import attrs

    from runtime.train.dataset import SLIPPED, rollout
    from runtime.train.recipe_config import RecipeConfig

    config = RecipeConfig(kinds=("type-in-field", "save-note"), episodes=48, slipped=0.7,
                          perturbed=0.0)
    wrong = {True: 0, False: 0}
    for word_slips in (True, False):
        data = attrs.evolve(config, word_slips=word_slips).dataset()
        assert data.word_slips is word_slips
        for e in range(data.episodes):
            ep = rollout(data, e)
            wrong[word_slips] += ep.mode == SLIPPED and any(
                s.slip and isinstance(s.action, TypeText) for s in ep.steps)
    assert wrong[True] >= 3 and wrong[False] == 0
