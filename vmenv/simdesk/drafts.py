"""The randomized task kinds: what each draws for a seed, before a screen size is known.

A kind is a function ``(rng, pool) -> Draft``: the instruction, the goal, the scene to place
(which launchers, menu entries and windows exist) and ``finish``, which adds what depends on
the placed layout (a dialog, windows that cover another).  ``rng`` draws only
size-independent choices here, so an instance says the same thing at every screen size;
``finish`` gets the layout's own rng.  ``pool`` is the word list of the seed's split.

Steps of the expert's solution from the start (what must be read from the screen):
* ``open-terminal`` 1 — the Terminal icon among decoys (taskbar button or desktop icon);
* ``type-in-field`` 2 — the Notes field, then type the word;
* ``click-ok`` 1 — the OK button (the order and placement of OK / Cancel vary);
* ``save-note`` 4 — the Notes icon, its field, type, Save;
* ``menu-launch`` 3-4 — the menu button, the app's entry, (Notes: its field), type;
* ``dialog-button`` 1 — the button whose label the instruction names, among 2-4;
* ``remember-code`` 5-6 — the code on the first screen, close it, open Notes (maybe through
  the menu), its field, type the code from memory, Save;
* ``switch-window`` 4 — the visible part of the covered Notes window, its field, type, Save;
* ``marked-launch`` 5 — the first screen marks one of 4-6 app launchers (gone after the
  first action); the Notes icon, its field, type, Save, then the launcher that was marked:
  what the last click needs is on the first screenshot only, four screens back.
* ``dense-<kind>`` — the kind's draft laid out in half-size cells (``DENSE``, 8 px at
  640x384 as the classic layout's): widgets as small as the classic tasks', most of them
  off the encoder's 32-px grid.
* ``classic-<kind>`` — one of the classic tasks' kinds laid out classic-style (``CLASSIC``,
  ``classic_style``): the classic layout's taskbar tiles, sizes and window places in a
  random theme, windows off their places by less than a unit, the kind's own words.

``LOOK_BACK`` names the kinds whose need is shown only on a screenshot that has left a K = 3
window by the step that needs it.  ``OPT_IN`` kinds are reached by name (or a selector,
``kinds.resolve_kinds``) only: the default mix (``kinds.task_kinds``: training sets, the
episodes of ``kvagent run`` / ``bench-eval`` without ``--task``) stays the eight kinds it was.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import attrs

from vmenv.simdesk import geometry as geo
from vmenv.simdesk.apps import APPS, DECOYS
from vmenv.simdesk.expert import title_stretch, visible_point
from vmenv.simdesk.goals import Goal
from vmenv.simdesk.placement import PlacementError, Scene, place_dialog
from vmenv.simdesk.state import DeskState, Window
from vmenv.simdesk.widgets import widgets
from vmenv.simdesk.words import (
    BUTTON_WORDS, CHOICE_MESSAGES, CHOICE_TITLES, CODE_ALPHABET, CODE_LEN, CONFIRM_MESSAGES,
    CONFIRM_TITLES, MENU_LABELS, NOTICE_BUTTONS, NOTICE_MESSAGES, NOTICE_TITLES,
)

Finish = Callable[[random.Random, DeskState], DeskState]


def _same(rng: random.Random, state: DeskState) -> DeskState:
    return state


@attrs.frozen
class Draft:
    """One instance of a kind, before placement (see the module docstring)."""

    instruction: str
    goal: Goal
    scene: Scene
    finish: Finish = _same


def _opening_decoys(names: Sequence[str]) -> list[str]:
    return [d for d in names if APPS[d].opens]


def _scene(rng: random.Random, target: str | None, *, menu: bool | None = None,
           menu_only: bool = False, windows: int = 2, others: Sequence[str] = (),
           top: Sequence[str] = (), recall: bool = False,
           menu_label: str | None = None) -> Scene:
    """Launchers for ``target`` (taskbar, desktop or both; only the menu if ``menu_only``),
    2-5 decoys (and ``others``) spread over taskbar, desktop and menu, 0..``windows``
    decoy windows open at the start, then ``top`` windows above them."""
    decoys = rng.sample(DECOYS, rng.randint(2, 5))
    taskbar: list[str] = []
    desktop: list[str] = []
    if target is not None and not menu_only:
        where = rng.choice(("taskbar", "desktop", "both"))
        taskbar += [target] if where != "desktop" else []
        desktop += [target] if where != "taskbar" else []
    for app in [*decoys, *others]:
        (taskbar if rng.random() < 0.4 else desktop).append(app)
    rng.shuffle(taskbar)
    rng.shuffle(desktop)
    has_menu = menu_only or (rng.random() < 0.5 if menu is None else menu)
    entries = None
    if has_menu:
        extra = [a for a in [*decoys, *others] if rng.random() < 0.7]
        entries = [*extra, *([target] if target is not None else [])]
        rng.shuffle(entries)
    opened = rng.sample(_opening_decoys(decoys), min(rng.randint(0, windows),
                                                     len(_opening_decoys(decoys))))
    return Scene(taskbar=tuple(taskbar), desktop=tuple(desktop),
                 menu=tuple(entries) if entries is not None else None,
                 windows=(*opened, *top), required=frozenset([target] if target else []),
                 recall=recall, menu_label=menu_label or rng.choice(MENU_LABELS))


def open_terminal(rng: random.Random, pool: Sequence[str]) -> Draft:
    instruction = rng.choice(("Open the Terminal application.", "Launch the Terminal app.",
                              "Start the Terminal."))
    others = ["notes"] if rng.random() < 0.5 else []
    return Draft(instruction, Goal(app="terminal"), _scene(rng, "terminal", others=others))


def type_in_field(rng: random.Random, pool: Sequence[str]) -> Draft:
    word = rng.choice(pool)
    instruction = rng.choice((f'Type the word "{word}" into the text field of the Notes app.',
                              f'In the Notes window, type "{word}" into the text field.'))
    return Draft(instruction, Goal(app="notes", text=word),
                 _scene(rng, "notes", top=["notes"],
                        others=["terminal"] if rng.random() < 0.3 else []))


def _answer_scene(rng: random.Random) -> Scene:
    return _scene(rng, None, windows=3, recall=True)


def click_ok(rng: random.Random, pool: Sequence[str]) -> Draft:
    title, message = rng.choice(CONFIRM_TITLES), rng.choice(CONFIRM_MESSAGES)
    buttons = [("ok", "OK"), ("cancel", "Cancel")]
    rng.shuffle(buttons)
    primary = rng.choice(("ok", "cancel", None))

    def finish(lrng: random.Random, s: DeskState) -> DeskState:
        d = place_dialog(lrng, s.layout, title, message, buttons, primary=primary,
                         reopenable=True)
        return attrs.evolve(s, dialog=d)

    return Draft(f'A dialog asks "{message}" Confirm it by clicking OK.', Goal(answer="ok"),
                 _answer_scene(rng), finish)


def save_note(rng: random.Random, pool: Sequence[str]) -> Draft:
    word = rng.choice(pool)
    instruction = rng.choice((
        f'Open the Notes app, write "{word}" in its text field and click Save.',
        f'Save the note "{word}": open Notes, type it into the text field, then click Save.'))
    return Draft(instruction, Goal(app="notes", text=word, submit="save"),
                 _scene(rng, "notes", others=["terminal"] if rng.random() < 0.4 else []))


def menu_launch(rng: random.Random, pool: Sequence[str]) -> Draft:
    word, label = rng.choice(pool), rng.choice(MENU_LABELS)
    app = rng.choice(("notes", "terminal"))
    other = "terminal" if app == "notes" else "notes"
    scene = _scene(rng, app, menu_only=True, others=[other] if rng.random() < 0.5 else [],
                   menu_label=label)
    if app == "notes":
        return Draft(f'Open Notes from the "{label}" menu in the taskbar, then type '
                     f'"{word}" into its text field.', Goal(app="notes", text=word), scene)
    return Draft(f'Open Terminal from the "{label}" menu in the taskbar, then type '
                 f'"{word}" in it and press Enter.',
                 Goal(app="terminal", text=word, submit="enter"), scene)


def dialog_button(rng: random.Random, pool: Sequence[str]) -> Draft:
    labels = rng.sample(BUTTON_WORDS, rng.randint(2, 4))
    target = rng.choice(labels)
    title, message = rng.choice(CHOICE_TITLES), rng.choice(CHOICE_MESSAGES)
    primary = rng.choice([*labels, None])

    def finish(lrng: random.Random, s: DeskState) -> DeskState:
        d = place_dialog(lrng, s.layout, title, message,
                         [(label.lower(), label) for label in labels],
                         primary=primary.lower() if primary else None, reopenable=True)
        return attrs.evolve(s, dialog=d)

    instruction = rng.choice((f'A dialog is open. Press its "{target}" button.',
                              f'Answer the dialog by clicking "{target}".'))
    return Draft(instruction, Goal(answer=target.lower()), _answer_scene(rng), finish)


def remember_code(rng: random.Random, pool: Sequence[str]) -> Draft:
    code = "".join(rng.choice(CODE_ALPHABET) for _ in range(CODE_LEN))
    title, message = rng.choice(NOTICE_TITLES), rng.choice(NOTICE_MESSAGES)
    button = rng.choice(NOTICE_BUTTONS)
    via_menu = rng.random() < 0.5

    def finish(lrng: random.Random, s: DeskState) -> DeskState:
        d = place_dialog(lrng, s.layout, title, message, [("dismiss", button)], code=code,
                         transient=True, records=False)
        return attrs.evolve(s, dialog=d, revealed=(*s.revealed, code))

    instruction = ("A notice on the first screen shows a code and disappears after your "
                   "first action, so remember it. Close the notice, open Notes, type the code "
                   "into its text field and click Save.")
    return Draft(instruction, Goal(app="notes", text=code, submit="save", code=True),
                 _scene(rng, "notes", menu_only=via_menu, menu=True if via_menu else None),
                 finish)


def _cell_between(rng: random.Random, lo: int, hi: int, u: int) -> int:
    """A multiple of ``u`` in [lo, hi] (clamped at 0; ``hi`` when the range is empty)."""
    a, b = -(-max(lo, 0) // u), max(hi, 0) // u
    return rng.randint(a, b) * u if a <= b else b * u


def _cover_notes(lrng: random.Random, s: DeskState) -> DeskState:
    """1-2 decoy windows over the Notes field (no point of it with a cell of it around shows),
    leaving at least four cells of its title bar and every desktop icon uncovered."""
    notes = s.window("notes")
    assert notes is not None
    sz, desk = s.layout.sizes, s.layout.desktop
    u = sz.unit
    fx, fy = geo.notes_field(sz, notes.rect).center
    icons = [x.rect for x in s.layout.launchers if x.style == "desktop"]
    decoys = [d for d in _opening_decoys(DECOYS) if not s.is_open(d)]
    for _ in range(200):
        covers = []
        for app in lrng.sample(decoys, lrng.randint(1, 2)):
            w, h = lrng.randint(11, 18) * u, lrng.randint(7, 11) * u
            # cells whose window contains the field's centre and stays on the desktop
            x0 = _cell_between(lrng, fx - w + u, min(fx - u, desk.x1 - w), u)
            y0 = _cell_between(lrng, fy - h + u, min(fy - u, desk.y1 - h), u)
            covers.append(Window(app, geo.Rect(x0, y0, x0 + w, y0 + h)))
        t = attrs.evolve(s, windows=(*s.windows, *covers))
        ws = widgets(t)
        hidden = visible_point(ws, "notes.field", u, strict=True) is None
        if (hidden and title_stretch(t, ws, "notes")[0] >= 4 * u
                and all(c.rect.inside(desk) for c in covers)
                and not any(c.rect.overlaps(i) for c in covers for i in icons)):
            return t
    raise PlacementError("could not cover the Notes field")


def switch_window(rng: random.Random, pool: Sequence[str]) -> Draft:
    word = rng.choice(pool)
    instruction = rng.choice((
        f'The Notes window is behind other windows. Bring it to the front, write "{word}" in '
        f'its text field and click Save.',
        f'Switch to the Notes window, type "{word}" into its text field and click Save.'))
    return Draft(instruction, Goal(app="notes", text=word, submit="save"),
                 _scene(rng, "notes", windows=1, top=["notes"]), _cover_notes)


#: How many launchers that open something a ``marked-launch`` screen has, one marked.
MARK_CANDIDATES = (4, 6)
#: At most this many of them in the taskbar (the rest are desktop icons): the taskbar must
#: have room for them and the Notes button at every layout.
MARK_TASKBAR = 2


def marked_launch(rng: random.Random, pool: Sequence[str]) -> Draft:
    word = rng.choice(pool)
    candidates = rng.sample(_opening_decoys(DECOYS), rng.randint(*MARK_CANDIDATES))
    marked = rng.choice(candidates)
    dead = rng.sample([d for d in DECOYS if not APPS[d].opens], rng.randint(0, 2))
    where = rng.choice(("taskbar", "desktop", "both"))
    taskbar = ["notes"] if where != "desktop" else []
    desktop = ["notes"] if where != "taskbar" else []
    in_bar = 0
    for app in [*candidates, *dead]:
        bar = in_bar < MARK_TASKBAR and rng.random() < 0.3
        in_bar += bar
        (taskbar if bar else desktop).append(app)
    rng.shuffle(taskbar)
    rng.shuffle(desktop)
    scene = Scene(taskbar=tuple(taskbar), desktop=tuple(desktop),
                  required=frozenset(["notes", *candidates]), clear_of=("notes",))
    instruction = rng.choice((
        f'One app icon is highlighted on the first screen only: the highlight disappears '
        f'after your first action, so remember which. Open Notes, write "{word}" in its text '
        f'field and click Save, then open the highlighted app.',
        f'Remember the app whose icon is highlighted now (the highlight goes away after your '
        f'first action). First save the note "{word}": open Notes, type it into the text '
        f'field, click Save. Then open that app.'))

    def finish(lrng: random.Random, s: DeskState) -> DeskState:
        return attrs.evolve(s, mark=marked)

    return Draft(instruction, Goal(app="notes", text=word, submit="save", then=marked),
                 scene, finish)


#: The kinds by name, in a fixed order.
KINDS: dict[str, Callable[[random.Random, Sequence[str]], Draft]] = {
    "open-terminal": open_terminal, "type-in-field": type_in_field, "click-ok": click_ok,
    "save-note": save_note, "menu-launch": menu_launch, "dialog-button": dialog_button,
    "remember-code": remember_code, "switch-window": switch_window,
    "marked-launch": marked_launch,
}


def _laid_out(kind: Callable[[random.Random, Sequence[str]], Draft], style: str,
              ) -> Callable[[random.Random, Sequence[str]], Draft]:
    """``kind``'s draft, its scene laid out in ``style`` (a ``Scene`` flag: dense, classic)."""
    def draft(rng: random.Random, pool: Sequence[str]) -> Draft:
        d = kind(rng, pool)
        return attrs.evolve(d, scene=attrs.evolve(d.scene, **{style: True}))
    return draft


#: The kinds laid out dense (``Scene.dense``): the default mix's but remember-code, each
#: the same draft in half-size cells.
DENSE: tuple[str, ...] = tuple(f"dense-{k}" for k in (
    "open-terminal", "type-in-field", "click-ok", "save-note", "menu-launch", "dialog-button",
    "switch-window"))
#: The classic tasks' kinds laid out classic-style (``Scene.classic``, ``classic_style``).
CLASSIC: tuple[str, ...] = tuple(f"classic-{k}" for k in (
    "open-terminal", "type-in-field", "click-ok", "save-note"))
KINDS |= {d: _laid_out(KINDS[d.removeprefix("dense-")], "dense") for d in DENSE}
KINDS |= {c: _laid_out(KINDS[c.removeprefix("classic-")], "classic") for c in CLASSIC}
#: Kinds whose need is on a screenshot a K = 3 window has lost (see the module docstring).
LOOK_BACK: tuple[str, ...] = ("remember-code", "marked-launch")
#: Kinds outside the default mix (see the module docstring).
OPT_IN: frozenset[str] = frozenset({"marked-launch", *DENSE, *CLASSIC})
