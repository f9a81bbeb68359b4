"""Expert demonstrations: the states of an episode, each labelled with the expert's action.

``demonstration(task, width, height)`` plays the expert from the task's start the way
``SimDesk`` would (``apply_action``, then the step counter moves on, so ``render_png`` of each
state is the env's screenshot, byte for byte) until the checker passes.  With ``perturb_at=k``
the state before action k is first knocked off-track (``Task.perturb``): that step is
marked ``perturbed`` — its screen was not caused by the previous action — and the labels
that follow are the expert's recovery.  With ``slip_at=k`` the action at step k is a mistake
(``slips.wrong_action``), executed like any other and marked ``slip``: it is what an agent
did, not a label; the expert's recovery follows.  ``slip_run`` makes steps k..k+run-1 all
mistakes (an agent stuck repeating one), ``early_text`` makes each a premature typing of the
task's text where the expert would click (``wrong_action``), ``word_slips`` off keeps a
typing step's mistake from being a wrong word.  With ``enter_key`` the expert
never types a submitting ``"\\n"``: it types the text, then presses Enter as a step of its
own (the expert's rule once the field holds the whole text), so the choice to submit is a
verb of its own rather than one more character of the typed text.
"""

from __future__ import annotations

import random

import attrs

from vmenv.actions import Action, Done, Fail, Press, TypeText
from vmenv.simdesk.apply import apply_action
from vmenv.simdesk.grid_clicks import ClickGrid, on_grid
from vmenv.simdesk.slips import wrong_action
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.tasks import Task


@attrs.frozen
class DemoStep:
    """One labelled state: the agent sees ``state`` and should answer ``action``."""

    state: DeskState
    action: Action
    perturbed: bool = False
    #: ``action`` is a mistake the agent made here (``slip_at``), not the expert's label
    slip: bool = False


class DemonstrationError(RuntimeError):
    """The expert gave up (``Fail``) or ran past ``max_steps`` (a bug, or a dead end)."""


def demonstration(task: Task, width: int, height: int, *, perturb_at: int | None = None,
                  rng: random.Random | None = None, with_done: bool = False,
                  max_steps: int = 64, slip_at: int | None = None, slip_run: int = 1,
                  early_text: str | None = None, click_grid: int | ClickGrid | None = None,
                  enter_key: bool = False, word_slips: bool = True) -> tuple[DemoStep, ...]:
    """The expert's episode on ``task`` at this screen size (see the module docstring).

    ``with_done`` appends the solved state labelled ``Done()`` (for agents that must say so;
    ``SimDesk`` ends the episode on success without it).  ``rng`` drives the perturbation
    and the slip.  ``click_grid``: the expert's clicks go to the centres of cells of that
    many pixels, or a ``ClickGrid``'s points (``grid_clicks.on_grid``: the same widget, so
    the same effect).
    ``enter_key``: a typed text that ends by submitting (``"\\n"``) is typed without it, and
    the expert presses Enter next (module docstring).
    """
    state = task.setup(DeskState.empty(width, height))
    rng = rng or random.Random(0)
    out: list[DemoStep] = []
    while True:
        perturbed = perturb_at is not None and len(out) == perturb_at
        if perturbed:
            state = task.perturb(state, rng)
        if task.check(state):
            if with_done:
                out.append(DemoStep(state, Done(), perturbed))
            return tuple(out)
        action = task.next_action(state)
        if click_grid is not None:
            action = on_grid(state, action, click_grid)
        if enter_key and isinstance(action, TypeText) and action.text.endswith("\n"):
            action = TypeText(action.text[:-1]) if action.text[:-1] else Press("enter")
        if isinstance(action, Fail | Done) or len(out) >= max_steps:
            raise DemonstrationError(f"{task.name}: expert answered {action} after "
                                     f"{len(out)} steps")
        slip = slip_at is not None and slip_at <= len(out) < slip_at + slip_run
        if slip:
            action = wrong_action(state, action, rng, early_text=early_text,
                                  word_slips=word_slips)
        out.append(DemoStep(state, action, perturbed, slip))
        state = attrs.evolve(apply_action(state, action), step=state.step + 1)
