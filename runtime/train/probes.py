"""Grounding probes: after a step's response, where each thing the screenshot shows is clicked.

A step's example trains ~10 response tokens on ~700 rows, and the one skill every task kind
needs — find the thing a word names in the screenshot and write where it is — gets one
coordinate pair per example.  A probe adds what the same screenshot says for free: after the
response's end-of-generation token the example goes on with lines ``"\\n<label> "`` (not
trained) + ``click(x, y)`` (trained, spelled exactly as a response spells a click), one per
labelled widget a click reaches (its centre not covered by anything above it) whose label
is on screen once, in a random order.  About 8x the coordinate targets for ~15 % more rows.

Invariant: the probes come after the response and its end token, so under causal attention
they change no logit the response is trained on, and the runtime never shows them — they are
training signal only, never part of a prompt a policy lays out.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from runtime.train.aim import cell_point
from vmenv.simdesk.apps import APPS, app_title
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.widgets import Widget, hit_in, widgets

__all__ = ["screen_probes", "widget_label"]


def widget_label(state: DeskState, name: str) -> str | None:
    """The words the screen shows on widget ``name`` (None: a widget without its own label:
    a window's body, the taskbar, the area around a menu or a dialog)."""
    head, _, tail = name.partition(".")
    if head in ("desk", "icon", "menu") and tail in APPS:
        return app_title(tail)
    if name == "menu.button" and state.layout.menu is not None:
        return state.layout.menu.label
    if head == "dialog" and tail and state.dialog is not None:
        button = state.dialog.button(tail)
        return button.label if button is not None else None
    if name == "recall.reopen":
        return "Reopen"
    if head in APPS:
        if tail == "title":
            return app_title(head)
        if tail == "close":
            return f"{app_title(head)} Close"
        if name == "notes.field":
            return "Notes field"
        if name == "notes.save":
            return "Save"
    return None


def screen_probes(state: DeskState, rng: random.Random, limit: int,
                  label: Callable[[DeskState, str], str | None] = widget_label,
                  centres: tuple[Sequence[int], Sequence[int]] | None = None,
                  ) -> list[tuple[str, tuple[int, int]]]:
    """Up to ``limit`` ``(label, point)`` pairs of the labelled widgets a click at their
    centre reaches, in an order drawn from ``rng`` (deterministic given its state); the point
    is the centre, or with ``centres`` (the encoder's cell centres) the cell centre an aimed
    expert would click (``runtime.train.aim.cell_point``)."""
    shown: list[Widget] = list(widgets(state))
    out = []
    for w in shown:
        text = label(state, w.name)
        if text is None:
            continue
        x, y = w.rect.center
        if hit_in(shown, x, y) is not w:  # covered: a click there reaches something else
            continue
        out.append((text, (x, y) if centres is None else cell_point(shown, w, x, y, centres)))
    # a label shown twice (an app on the desktop and in the taskbar) names no one place
    once = [p for p in out if sum(q[0] == p[0] for q in out) == 1]
    rng.shuffle(once)
    return once[:limit]
