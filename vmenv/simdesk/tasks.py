"""Tasks on the simulated desktop: a starting state, an instruction, a checker, a solution.

The checker is a pure predicate over the desktop state (OSWorld's evaluator, in miniature).
The scripted solution is the action sequence a competent agent would take from the task's
starting state; tests use it to show each task is solvable, and ``record_trajectory`` uses it
to record demonstration trajectories.  A task with a ``goal`` also has an expert
(``Task.next_action``: the solver's next action from any state) and recovery states
(``Task.perturb``); the classic tasks below have goals too.  Randomized instances of these
and more kinds come from ``kinds.sample_task``.

* ``open-terminal`` — empty desktop; solved when a terminal window is open;
  solution: click the terminal icon.
* ``type-in-field`` — Notes open, its field unfocused; solved when the field holds exactly the
  word (default "kvagent"); solution: click the field, type the word.
* ``click-ok`` — a modal Confirm dialog; solved when it was answered with OK (Cancel or
  escape answer it for good); solution: click OK.
* ``save-note`` — empty desktop; solved when the word (default "hello") was saved in Notes;
  solution: click the Notes icon, click the field, type the word, click Save.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable

import attrs

from vmenv.actions import Action, Click, Done, Fail, TypeText
from vmenv.simdesk import expert, goals
from vmenv.simdesk.apply import apply_action
from vmenv.simdesk.dialogs import classic_dialog
from vmenv.simdesk.goals import Goal
from vmenv.simdesk.perturb import perturb
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.widgets import locate


@attrs.frozen
class Task:
    """One simulated-desktop task.  ``kind`` and ``seed`` name a sampled instance."""

    name: str
    instruction: str
    setup: Callable[[DeskState], DeskState]  # empty desktop → starting state
    check: Callable[[DeskState], bool]
    solve: Callable[[DeskState], tuple[Action, ...]]  # starting state → solving actions
    goal: Goal | None = None
    kind: str | None = None
    seed: int | None = None

    def next_action(self, state: DeskState) -> Action:
        """The expert's next action from ``state``, on-track or not (see ``expert``)."""
        if self.goal is None:
            raise ValueError(f"task {self.name!r} has no goal, hence no expert")
        return expert.next_action(self.goal, state)

    def perturb(self, state: DeskState, rng: random.Random) -> DeskState:
        """``state`` knocked off-track in ways the expert recovers from (see ``perturb``)."""
        if self.goal is None:
            raise ValueError(f"task {self.name!r} has no goal, hence no perturbations")
        return perturb(self.goal, state, rng)


def check_goal(goal: Goal) -> Callable[[DeskState], bool]:
    """The checker of ``goal`` as a one-argument predicate."""
    return functools.partial(goals.check, goal)


def expert_rollout(goal: Goal, state: DeskState, max_steps: int = 64) -> tuple[Action, ...]:
    """The expert's actions from ``state`` until the goal holds (raises ``RuntimeError`` if it
    gives up with Fail or needs more than ``max_steps``)."""
    out: list[Action] = []
    while not goals.check(goal, state):
        action = expert.next_action(goal, state)
        if len(out) == max_steps or isinstance(action, Done | Fail):
            raise RuntimeError(f"the expert did not reach {goal} (last action {action})")
        out.append(action)
        state = apply_action(state, action)
    return tuple(out)


def _click(state: DeskState, widget: str) -> Click:
    return Click(*locate(state, widget))


def _solve_steps(state: DeskState, *steps: Callable[[DeskState], Action]) -> tuple[Action, ...]:
    """Build a solution step by step, each step seeing the state the previous ones led to."""
    out = []
    for make in steps:
        action = make(state)
        out.append(action)
        state = apply_action(state, action)
    return tuple(out)


def _open_notes(state: DeskState) -> DeskState:
    return apply_action(state, _click(state, "icon.notes"))


OPEN_TERMINAL = Task(
    name="open-terminal",
    instruction="Open the Terminal application.",
    setup=lambda s: s,
    check=lambda s: s.is_open("terminal"),
    solve=lambda s: (_click(s, "icon.terminal"),),
    goal=Goal(app="terminal"),
)


def type_in_field(word: str = "kvagent") -> Task:
    """Type ``word`` into the (already open, unfocused) Notes field."""
    return Task(
        name="type-in-field",
        instruction=f'Type the word "{word}" into the text field of the Notes app.',
        setup=_open_notes,
        check=lambda s: s.notes.text == word,
        solve=lambda s: _solve_steps(s, lambda t: _click(t, "notes.field"),
                                     lambda t: TypeText(word)),
        goal=Goal(app="notes", text=word),
    )


CLICK_OK = Task(
    name="click-ok",
    instruction="A dialog asks whether to discard unsaved changes. Confirm it by clicking OK.",
    setup=lambda s: attrs.evolve(s, dialog=classic_dialog(s.metrics, "Confirm",
                                                          "Discard unsaved changes?")),
    check=lambda s: s.dialog_result == "ok",
    solve=lambda s: (_click(s, "dialog.ok"),),
    goal=Goal(answer="ok"),
)


def save_note(word: str = "hello") -> Task:
    """Open Notes, type ``word`` into its field and press Save (a four-step task)."""
    return Task(
        name="save-note",
        instruction=f'Open the Notes app, write "{word}" in its text field and click Save.',
        setup=lambda s: s,
        check=lambda s: word in s.notes.saved,
        solve=lambda s: _solve_steps(s, lambda t: _click(t, "icon.notes"),
                                     lambda t: _click(t, "notes.field"),
                                     lambda t: TypeText(word),
                                     lambda t: _click(t, "notes.save")),
        goal=Goal(app="notes", text=word, submit="save"),
    )


def default_tasks() -> dict[str, Task]:
    """The built-in tasks by name."""
    tasks = (OPEN_TERMINAL, type_in_field(), CLICK_OK, save_note())
    return {t.name: t for t in tasks}
