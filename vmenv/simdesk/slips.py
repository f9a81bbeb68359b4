"""Slips: a wrong action an agent could plausibly take instead of the expert's.

A perturbation (``perturb``) changes the desktop behind the agent's back; a slip is the
agent's own mistake — an action, so it is executed like any other and enters the agent's
history as what it did.  ``demonstration(..., slip_at=k)`` puts one at step k (marked
``DemoStep.slip``: a training set keeps it in the history and out of the loss) and lets the
expert recover from what it did.

``wrong_action(state, expert, rng)``: for a click, a click on the centre of another widget
on screen (a decoy icon, another button, a title bar, the bare desktop...); for typing, a
wrong word (a truncated or junk one) — unless ``word_slips`` is off; otherwise a click
somewhere else.  With
``early_text`` (the task's own text) and a click expected, the mistake is typing that text
before its field is ready — the trained agents' commonest error, which they then repeat.
Never the expert's own action.  Randomized kinds have no dead end (any action can be
recovered from: the tests of ``simdesk`` walk random actions), so the expert solves the
task after any slip.
"""

from __future__ import annotations

import random
import string

from vmenv.actions import Action, Click, TypeText
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.widgets import hit_in, widgets


def _junk(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 6)))


def wrong_action(state: DeskState, expert: Action, rng: random.Random, *,
                 early_text: str | None = None, word_slips: bool = True) -> Action:
    """A plausible mistake in ``state`` where the expert would do ``expert`` (typing
    ``early_text`` when given and the expert clicks).  ``word_slips`` off: a typing step's
    mistake is always a click elsewhere, never a wrong word (``kvagent train
    --no-word-slips``: an agent that cannot tell a wrong word from the right one learns from a
    wrong word only to press backspace after typing)."""
    if early_text and isinstance(expert, Click):
        return TypeText(early_text)
    if isinstance(expert, TypeText) and word_slips and rng.random() < 0.7:
        text = expert.text.rstrip("\n")
        wrong = text[: rng.randrange(len(text))] + _junk(rng) if text else _junk(rng)
        if wrong != text:
            return TypeText(wrong + ("\n" if expert.text.endswith("\n") else ""))
    ws = widgets(state)
    target = hit_in(ws, expert.x, expert.y) if isinstance(expert, Click) else None
    centres = [w.rect.center for w in ws]
    others = [(x, y) for x, y in centres if hit_in(ws, x, y) is not target]
    if not others:  # nothing else on screen: the bare desktop's corner
        others = [(1, 1)]
    x, y = rng.choice(others)
    wrong = Click(x, y)
    return wrong if wrong != expert else Click(1, 1)
