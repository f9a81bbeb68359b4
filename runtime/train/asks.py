"""What a click's lookup query *asks* for: the clicked widget's class, or, where one click
only reveals the next one's target, both classes in order of preference.

simdesk has two such chains.  A launcher menu: the expert clicks the menu button, the menu
opens, it clicks the goal app's entry.  A window behind others: the expert clicks the app's
text field where it shows, else the window's title bar, which raises it, then the field.
Trained to ask for ``menu.button`` on the first screen and ``menu.<app>`` on the second, the
agents had to tell the two screens apart from the pixels before asking, and did not
(docs/training.md: menu-launch 0/10; after the menu opened, the hybrid clicked the button
again on every instance).  Asked for both, preferred (entry, field) first, at both steps,
the query is the same on both screens and the lookup decides by what the newest screenshot
shows: the entry's cells outscore the button's when the menu is open (the preferred code
weighs more in the query), the button's outscore every other cell when it is not.

``ask_code`` is that query: the unit vector of the classes' codes weighted 1, ``FALLBACK``,
``FALLBACK²``...  (the codes are pushed apart, so each class's cells score about their weight).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from runtime.train.cell_labels import OTHER, click_class
from vmenv.actions import Action, Click
from vmenv.simdesk.goals import Goal
from vmenv.simdesk.state import DeskState

__all__ = ["FALLBACK", "FIELDS", "SEPARATOR", "ask_code", "asked_classes", "format_asked", "parse_asked"]

#: a fallback class's weight relative to the class before it: with unit codes the lookup's
#: scores are ~0.82 and ~0.57 of a single class's (difference ~11 in the hybrid's q/k-normed
#: logits, ``recogniser.LOOKUP_SHARPNESS``), so the preferred cells win where they are shown
#: and the fallback's still outscore unrelated cells where they are not
FALLBACK = 0.7
SEPARATOR = ">"
#: each app's text field (the widget typing needs focused)
FIELDS = {"notes": "notes.field", "terminal": "terminal.input"}


def asked_classes(state: DeskState, action: Action, goal: Goal | None) -> tuple[str, ...]:
    """The classes the query of ``action`` in ``state`` asks for, preferred first; () for an
    action that is not a click or clicks no known widget."""
    if not isinstance(action, Click):
        return ()
    clicked = click_class(state, action.x, action.y)
    if clicked == OTHER:
        return ()
    for chain in _chains(state, goal):
        if clicked in chain:
            return chain
    return (clicked,)


def _chains(state: DeskState, goal: Goal | None) -> Iterator[tuple[str, ...]]:
    """The goal's click chains: its app's menu entry, else the menu button that shows it; its
    app's text field, else the title bar that raises its window (``expert`` rule 7: the
    field where it shows, else the title)."""
    if goal is None or goal.app is None:
        return
    app, menu = goal.app, state.layout.menu
    if menu is not None and menu.entry(app) is not None:
        yield (f"menu.{app}", "menu.button")
    if goal.text is not None:
        yield (FIELDS[app], f"{app}.title")


def format_asked(classes: Sequence[str]) -> str:
    return SEPARATOR.join(classes)


def parse_asked(text: str) -> tuple[str, ...]:
    return tuple(c for c in text.split(SEPARATOR) if c)


def ask_code(classes: Sequence[str], codes: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """The unit query asking for ``classes`` in order (None when none has a code)."""
    known = [codes[c] for c in classes if c in codes and c != OTHER]
    if not known:
        return None
    q = sum(FALLBACK ** i * np.asarray(c, np.float64) for i, c in enumerate(known))
    return (q / np.linalg.norm(q)).astype(np.float32)
