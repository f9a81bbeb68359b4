"""Recovery states: put a desktop off-track in ways the expert can recover from.

``perturb(goal, state, rng)`` applies one to three of the perturbations below that apply to
``state`` (each is a pure function returning None when it does not apply):

* ``wrong_app``    — a decoy (or the other working app) opens on top, maybe over the target;
* ``wrong_text``   — the goal's field holds a wrong, half-typed word (focused);
* ``lose_focus``   — the keyboard focus is dropped;
* ``move_window``  — an open window is dragged somewhere else (and raised);
* ``popup``        — an uninvited pop-up dialog appears (it does not record an answer);
* ``open_menu``    — the launcher menu is left open;
* ``wrong_answer`` — the task's (reopenable) dialog was answered with a wrong button;
* ``close_app``    — the goal's app window was closed (its text stays, as in the app), when
                     a launcher, a menu entry or the hotkey can open it again;
* ``wrong_save``   — Notes saved a wrong text;
* ``pointer``      — the pointer moved.

What is never done, so that every perturbed state stays solvable: answering a dialog that
cannot be reopened, removing the code notice of ``remember-code`` (the code must have been on
a screen the agent saw) or changing what ``state.revealed`` holds; while the first screen's
launcher mark shows (``marked-launch``), nothing is put over it (``COVERING`` perturbations
wait until it is gone).  For a code goal the wrong text never starts with the code (the
screen must not leak it).
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable

import attrs

from vmenv.simdesk.apply import answer_dialog, close_app, move_window, open_app, raise_window
from vmenv.simdesk.apps import APPS, WORKING_APPS
from vmenv.simdesk.goals import Goal, check
from vmenv.simdesk.placement import place_dialog
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.words import POPUPS

Perturbation = Callable[[Goal, DeskState, random.Random], DeskState | None]


def _junk(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 5)))


def _apps_on_screen(state: DeskState) -> list[str]:
    lay = state.layout
    apps = [x.app for x in lay.launchers] + [a for a, _ in (lay.menu.entries if lay.menu else ())]
    return list(dict.fromkeys([*apps, *WORKING_APPS]))


def _reopenable(state: DeskState, app: str) -> bool:
    """Whether the expert can open ``app`` again (a launcher, a menu entry, or the hotkey)."""
    menu = state.layout.menu
    return (bool(state.layout.launchers_of(app)) or app == "terminal"
            or (menu is not None and menu.entry(app) is not None))


def wrong_app(goal: Goal, state: DeskState, rng: random.Random) -> DeskState | None:
    apps = [a for a in _apps_on_screen(state)
            if a != goal.app and not state.is_open(a) and (a not in APPS or APPS[a].opens)]
    if not apps:
        return None
    return attrs.evolve(open_app(state, rng.choice(apps)), menu_open=False)


def wrong_text(goal: Goal, state: DeskState, rng: random.Random) -> DeskState | None:
    if goal.text is None or goal.app is None or not state.is_open(goal.app):
        return None
    keep = 0 if goal.code else rng.randint(0, len(goal.text) - 1)
    text = goal.text[:keep] + _junk(rng)
    if text == goal.text or goal.text.startswith(text):
        return None
    s = attrs.evolve(raise_window(state, goal.app), focus=goal.app)
    if goal.app == "notes":
        return attrs.evolve(s, notes=attrs.evolve(s.notes, text=text))
    return attrs.evolve(s, terminal=attrs.evolve(s.terminal, command=text))


def lose_focus(goal: Goal, state: DeskState, rng: random.Random) -> DeskState | None:
    return attrs.evolve(state, focus=None) if state.focus is not None else None


def move(goal: Goal, state: DeskState, rng: random.Random) -> DeskState | None:
    if not state.windows:
        return None
    win = rng.choice(state.windows)
    d = state.layout.desktop
    dx = rng.randint(-d.width // 3, d.width // 3)
    dy = rng.randint(-d.height // 3, d.height // 3)
    return move_window(state, win.app, dx, dy)


def popup(goal: Goal, state: DeskState, rng: random.Random) -> DeskState | None:
    if state.dialog is not None:
        return None
    title, message, labels = rng.choice(POPUPS)
    d = place_dialog(rng, state.layout, title, message,
                     [(label.lower(), label) for label in labels], records=False)
    return attrs.evolve(state, dialog=d, menu_open=False)


def open_menu(goal: Goal, state: DeskState, rng: random.Random) -> DeskState | None:
    if state.layout.menu is None or state.dialog is not None or state.menu_open:
        return None
    return attrs.evolve(state, menu_open=True)


def wrong_answer(goal: Goal, state: DeskState, rng: random.Random) -> DeskState | None:
    d = state.dialog
    if goal.answer is None or d is None or not (d.records and d.reopenable):
        return None
    if state.layout.recall is None:
        return None
    return answer_dialog(state, rng.choice([b.id for b in d.buttons if b.id != goal.answer]))


def close_goal_app(goal: Goal, state: DeskState, rng: random.Random) -> DeskState | None:
    if goal.app is None or not state.is_open(goal.app) or not _reopenable(state, goal.app):
        return None
    return close_app(state, goal.app)


def wrong_save(goal: Goal, state: DeskState, rng: random.Random) -> DeskState | None:
    if goal.submit != "save":
        return None
    return attrs.evolve(state, notes=attrs.evolve(
        state.notes, saved=(*state.notes.saved, _junk(rng))))


def pointer(goal: Goal, state: DeskState, rng: random.Random) -> DeskState | None:
    m = state.metrics
    return attrs.evolve(state, pointer=(rng.randrange(m.width), rng.randrange(m.height)))


PERTURBATIONS: dict[str, Perturbation] = {
    "wrong_app": wrong_app, "wrong_text": wrong_text, "lose_focus": lose_focus,
    "move_window": move, "popup": popup, "open_menu": open_menu,
    "wrong_answer": wrong_answer, "close_app": close_goal_app, "wrong_save": wrong_save,
    "pointer": pointer,
}


#: Perturbations that may draw something over a launcher.
COVERING: frozenset[str] = frozenset({"wrong_app", "move_window", "popup", "open_menu"})


def perturb(goal: Goal, state: DeskState, rng: random.Random, *,
            max_count: int = 3) -> DeskState:
    """``state`` knocked off-track by 1..``max_count`` applicable perturbations (never into a
    state where the goal already holds, unless it held before)."""
    want = rng.randint(1, max_count)
    names = list(PERTURBATIONS)
    rng.shuffle(names)
    s, done = state, 0
    solved_before = check(goal, state)
    for name in names:
        if done == want:
            break
        if state.mark is not None and name in COVERING:
            continue
        out = PERTURBATIONS[name](goal, s, rng)
        if out is not None and (solved_before or not check(goal, out)):
            s, done = out, done + 1
    s.check_integrity()
    return s
