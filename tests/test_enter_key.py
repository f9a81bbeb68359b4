"""``demonstration(..., enter_key=True)`` (``kvagent train --enter-key``): the expert types a
text that submits without its ``"\\n"`` and presses Enter as a step of its own; a task that
does not submit with Enter is demonstrated as before."""

from __future__ import annotations

from vmenv.actions import Press, TypeText
from vmenv.simdesk.demos import demonstration
from vmenv.simdesk.kinds import sample_task
from vmenv.simdesk.seeds import train_seeds

W, H = 640, 384


def _tasks(kind: str, submit: str | None, n: int) -> list:
    out = []
    for seed in train_seeds(0):
        task = sample_task(kind, seed)
        if task.goal is not None and task.goal.submit == submit:
            out.append(task)
        if len(out) == n:
            return out
    raise AssertionError("unreachable: the seeds are endless")


def test_a_submitting_text_is_typed_then_entered() -> None:
    for task in _tasks("menu-launch", "enter", 5):
        typed = [s.action for s in demonstration(task, W, H)]
        keyed = [s.action for s in demonstration(task, W, H, enter_key=True)]
        submit = [i for i, a in enumerate(typed)
                  if isinstance(a, TypeText) and a.text.endswith("\n")]
        assert len(submit) == 1, typed  # the expert's one submitting text
        i = submit[0]
        # the same episode up to the text, then the text without "\n", then Enter
        assert keyed[:i] == typed[:i]
        assert keyed[i] == TypeText(typed[i].text[:-1]) and keyed[i + 1] == Press("enter")
        assert keyed[i + 2:] == typed[i + 1:]
        assert not any(isinstance(a, TypeText) and "\n" in a.text for a in keyed)


def test_other_texts_are_demonstrated_as_before() -> None:
    for kind, submit in (("menu-launch", None), ("save-note", "save"),
                         ("type-in-field", None)):
        for task in _tasks(kind, submit, 3):
            assert [s.action for s in demonstration(task, W, H, enter_key=True)] == \
                [s.action for s in demonstration(task, W, H)]


def test_the_dataset_passes_it_to_every_demonstration() -> None:
    """``DatasetConfig.enter_key`` reaches the rollouts (clean, perturbed and slipped
    episodes alike): no episode types a "\\n", and each that submits presses Enter."""
    import attrs

    from runtime.train.dataset import CLEAN, DatasetConfig, rollout

    config = DatasetConfig(kinds=("menu-launch",), episodes=24)
    keyed = attrs.evolve(config, enter_key=True)
    submitting = 0
    for e in range(config.episodes):
        before, after = rollout(config, e), rollout(keyed, e)
        typed = [s.action for s in after.steps if isinstance(s.action, TypeText)]
        assert not any("\n" in a.text for a in typed), after
        if after.goal.submit == "enter" and before.mode == CLEAN:
            submitting += 1
            assert Press("enter") in [s.action for s in after.steps]
            assert len(after.steps) == len(before.steps) + 1
    assert submitting >= 3  # the check reads real submitting episodes
