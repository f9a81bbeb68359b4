"""What a task wants, as data: the ``Goal`` record and its checker.

Every task kind is one of four shapes, and one expert (``expert``) and one set of
perturbations (``perturb``) serve them all:
* open an app:                    ``Goal(app=...)`` — its window is open;
* put text in an app:             ``Goal(app, text)`` — the field holds exactly ``text``;
* ... and submit it:              ``submit="save"`` (Notes' Save button: ``text`` was saved) or
                                  ``submit="enter"`` (the terminal ran ``text``);
* answer the task's dialog:       ``Goal(answer=button id)`` — no dialog open and the last
                                  recorded answer is ``answer``.
``code`` marks a text the task never states: the first screen showed it (``remember-code``).
``then`` extends "save a note": afterwards open this app (``marked-launch``, where only the
first screen shows which one).  It holds when the note was saved, ``then``'s window opened
*after* that save (``DeskState.events``; one opened before it must be closed and opened
again) and is open, and no window but Notes' and ``then``'s is open — so a wrong guess, or
opening every candidate, fails.
"""

from __future__ import annotations

from typing import Literal

import attrs

from vmenv.simdesk.state import DeskState

Submit = Literal["save", "enter"]


@attrs.frozen
class Goal:
    """The end state a task asks for (see the module docstring)."""

    app: str | None = None
    text: str | None = None
    submit: Submit | None = None
    answer: str | None = None
    code: bool = False
    then: str | None = None

    def __attrs_post_init__(self) -> None:
        assert self.then is None or (self.submit == "save" and self.then != self.app), self
        assert (self.answer is None) != (self.app is None), self
        assert self.text is not None or (self.submit is None and not self.code), self
        assert self.submit != "save" or self.app == "notes", self
        assert self.submit != "enter" or self.app == "terminal", self


def field_text(state: DeskState, app: str) -> str:
    """What ``app``'s text field holds ("" for an app without one)."""
    if app == "notes":
        return state.notes.text
    if app == "terminal":
        return state.terminal.command
    return ""


def opened_after_save(state: DeskState, app: str, text: str) -> bool:
    """Whether ``app``'s window opened after Notes first saved ``text`` (``state.events``)."""
    saved = next((i for i, e in enumerate(state.events) if e == ("save", text)), None)
    return saved is not None and ("open", app) in state.events[saved + 1:]


def strays(goal: Goal, state: DeskState) -> tuple[str, ...]:
    """The open windows a ``then`` goal does not want, top first: any app but the goal's and
    ``then``'s, and ``then``'s own if it opened before the save."""
    assert goal.then is not None and goal.text is not None
    keep_then = opened_after_save(state, goal.then, goal.text)
    return tuple(w.app for w in reversed(state.windows)
                 if w.app != goal.app and not (w.app == goal.then and keep_then))


def check(goal: Goal, state: DeskState) -> bool:
    """Whether ``state`` is what ``goal`` asks for (a pure predicate)."""
    if goal.then is not None:
        return (check(attrs.evolve(goal, then=None), state) and state.is_open(goal.then)
                and not strays(goal, state))
    if goal.answer is not None:
        return state.dialog is None and state.dialog_result == goal.answer
    assert goal.app is not None
    if goal.text is None:
        return state.is_open(goal.app)
    if goal.submit == "save":
        return goal.text in state.notes.saved
    if goal.submit == "enter":
        return f"$ {goal.text}" in state.terminal.lines
    return field_text(state, goal.app) == goal.text
