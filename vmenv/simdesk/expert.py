"""The expert: the scripted solver's next action from ANY state, for any ``Goal``.

``next_action(goal, state)`` looks only at the state (what the screen shows) and the goal,
so it labels demonstrations on the start-to-finish path and on off-track states alike.  It
clicks only points where ``hit`` finds the widget it means (never a covered centre),
preferring points with a layout unit of that widget around them, and it works through these
rules, first match wins:

1. the goal holds -> ``Done()``;
2. a dialog is open: the task's dialog (one that records answers) is answered with the goal's
   button; any other (a pop-up, the code notice) is closed with its first button;
3. a dialog goal with no dialog open: close the menu (escape), then click the notification's
   Reopen; a dialog answered for good (the classic click-ok) -> ``Fail()``;
4. a code goal whose code never appeared on screen (not in ``state.revealed``) -> ``Fail()``:
   the code exists only in the first screenshot, and a state that never showed it cannot be
   solved by looking (the expert itself knows the code, but it does not type what the agent
   could not have seen);
4b. a ``then`` goal (``marked-launch``): an open menu -> escape; a window the goal does not
   want (``goals.strays``, top first) -> close it (its × where it shows, alt+f4 on top, else
   raise it); the note not saved yet -> these rules for the note alone; else launch ``then``
   as rule 5 launches (the expert knows the app; an agent must have seen the mark);
5. the goal's app is not open: click a visible launcher of it; else, if the layout's menu has
   it, open the menu, then click its entry; else, if launchers exist but every one is covered,
   close the top window; the terminal as a last resort by ctrl+alt+t;
6. an open menu that is in the way -> escape;
7. the app's window is not on top: click its field where a unit of it shows around the
   point (raises and focuses), else the middle of the widest visible stretch of its title
   bar, else any visible part, else a launcher, else close the top window;
8. the field lacks focus -> click it; the field holds a wrong character -> backspace; a
   prefix of the text -> type the rest (with "\\n" when the goal submits with enter); the
   whole text -> click Save / press enter.

Bound (tested over many seeds): from a state ``perturb`` makes, the goal holds after at most
``RECOVERY_STEPS`` more actions than the task's own solution from the start.
"""

from __future__ import annotations

import attrs

from vmenv.actions import Action, Click, Done, Fail, Hotkey, Press, TypeText
from vmenv.simdesk import geometry as geo
from vmenv.simdesk.goals import Goal, check, field_text, strays
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.widgets import Widget, hit_in, widgets

#: Extra actions a perturbed state may cost beyond the solution from the start.
RECOVERY_STEPS = 20


def _clear(ws: tuple[Widget, ...], w: Widget, x: int, y: int, d: int) -> bool:
    """Whether the points ``d`` pixels around (x, y) (less in a small widget) hit ``w`` too."""
    dx, dy = min(d, w.rect.width // 2 - 1), min(d, w.rect.height // 2 - 1)
    return all((got := hit_in(ws, px, py)) is not None and got.name == w.name
               for px, py in ((x - dx, y), (x + dx, y), (x, y - dy), (x, y + dy)))


def visible_point(ws: tuple[Widget, ...], name: str, clear: int = 0,
                  strict: bool = False) -> tuple[int, int] | None:
    """A point where a click reaches widget ``name``: its centre if uncovered, else the first
    uncovered point of a 7x7 grid over it — first one with ``clear`` pixels of the widget
    around it, then (unless ``strict``) any; None if there is none."""
    w = next((w for w in ws if w.name == name), None)
    if w is None:
        return None
    r = w.rect
    points = [r.center, *((r.x0 + r.width * (2 * i + 1) // 14, r.y0 + r.height * (2 * j + 1) // 14)
                          for j in range(7) for i in range(7))]
    reach = [(x, y) for x, y in points if (got := hit_in(ws, x, y)) is not None and got is w]
    fallback = reach[0] if reach and not strict else None
    return next((p for p in reach if _clear(ws, w, *p, clear)), fallback)


@attrs.frozen
class _Screen:
    """The widgets on screen and how much room a click point wants around it."""

    ws: tuple[Widget, ...]
    clear: int

    def point(self, name: str, strict: bool = False) -> tuple[int, int] | None:
        return visible_point(self.ws, name, self.clear, strict)


def _click(point: tuple[int, int]) -> Click:
    return Click(*point)


def _dialog_action(goal: Goal, state: DeskState) -> Action:
    d = state.dialog
    assert d is not None
    if goal.answer is not None and d.records and d.button(goal.answer) is not None:
        b = d.button(goal.answer)
        assert b is not None
        return _click(b.rect.center)
    if d.buttons:
        return _click(d.buttons[0].rect.center)
    return Press("escape")


def title_stretch(state: DeskState, ws: tuple[Widget, ...], app: str) -> tuple[int, int, int]:
    """(length, x, y): the widest run of ``app``'s title bar uncovered from its top to its
    bottom edge, and the middle of that run (length 0: every column is covered)."""
    win = state.window(app)
    assert win is not None
    bar = geo.title_bar(state.layout.sizes, win.rect)
    step = max(state.layout.sizes.unit // 3, 2)
    ys = (bar.y0 + 1, bar.center[1], bar.y1 - 2)
    best, start = (0, 0), None  # best: (length, start)
    for x in [*range(bar.x0, bar.x1, step), None]:
        ok = x is not None and all((w := hit_in(ws, x, y)) is not None
                                   and w.name == f"{app}.title" for y in ys)
        if ok and start is None:
            start = x
        elif not ok and start is not None:
            best = max(best, ((x if x is not None else bar.x1) - start, start))
            start = None
    return best[0], best[1] + best[0] // 2, bar.center[1]


def _title_point(state: DeskState, sc: _Screen, app: str) -> tuple[int, int] | None:
    length, x, y = title_stretch(state, sc.ws, app)
    return (x, y) if length >= 2 * sc.clear else None


def _close_top(state: DeskState, sc: _Screen) -> Action:
    top = state.top
    if top is None:
        return Fail()
    p = sc.point(f"{top.app}.close")
    return _click(p) if p is not None else Hotkey(("alt", "f4"))


def _launch(state: DeskState, sc: _Screen, app: str) -> Action:
    lay = state.layout
    if state.menu_open:
        p = sc.point(f"menu.{app}")
        return _click(p) if p is not None else Press("escape")
    for x in lay.launchers_of(app):
        p = sc.point(x.name)
        if p is not None:
            return _click(p)
    if lay.menu is not None and lay.menu.entry(app) is not None:
        return _click(lay.menu.button.center)
    if lay.launchers_of(app):
        return _close_top(state, sc)
    return Hotkey(("ctrl", "alt", "t")) if app == "terminal" else Fail()


def _field_name(app: str) -> str:
    return "notes.field" if app == "notes" else "terminal.input"


def _raise(state: DeskState, sc: _Screen, app: str) -> Action:
    field, window = _field_name(app), f"{app}.window"
    for find in (lambda: sc.point(field, strict=True), lambda: _title_point(state, sc, app),
                 lambda: sc.point(window, strict=True), lambda: sc.point(field),
                 lambda: sc.point(window)):
        point = find()
        if point is not None:
            return _click(point)
    for x in state.layout.launchers_of(app):
        p = sc.point(x.name)
        if p is not None:
            return _click(p)
    return _close_top(state, sc)


def _edit(goal: Goal, state: DeskState, sc: _Screen, app: str) -> Action:
    assert goal.text is not None
    if state.focus != app:
        p = sc.point(_field_name(app))
        return _click(p) if p is not None else _close_top(state, sc)
    cur = field_text(state, app)
    if cur == goal.text:
        if goal.submit == "save":
            p = sc.point("notes.save")
            return _click(p) if p is not None else Press("enter")
        return Press("enter") if goal.submit == "enter" else Done()
    if goal.text.startswith(cur):
        return TypeText(goal.text[len(cur):] + ("\n" if goal.submit == "enter" else ""))
    return Press("backspace")


def _close(state: DeskState, sc: _Screen, app: str) -> Action:
    """Close ``app``'s window: its × where a click reaches it, alt+f4 when it is on top,
    else raise it first (a visible stretch of its title bar, any visible part of it)."""
    p = sc.point(f"{app}.close")
    if p is not None:
        return _click(p)
    top = state.top
    if top is not None and top.app == app:
        return Hotkey(("alt", "f4"))
    p = _title_point(state, sc, app) or sc.point(f"{app}.window")
    return _click(p) if p is not None else _close_top(state, sc)


def _then_action(goal: Goal, state: DeskState, sc: _Screen) -> Action:
    """Rule 4b (see the module docstring)."""
    assert goal.then is not None
    if state.menu_open:
        return Press("escape")
    unwanted = strays(goal, state)
    if unwanted:
        return _close(state, sc, unwanted[0])
    note = attrs.evolve(goal, then=None)
    if not check(note, state):
        return next_action(note, state)
    return _launch(state, sc, goal.then)


def next_action(goal: Goal, state: DeskState) -> Action:
    """The expert's action in ``state`` (see the module docstring for the rules)."""
    if check(goal, state):
        return Done()
    if state.dialog is not None:
        return _dialog_action(goal, state)
    sc = _Screen(widgets(state), state.layout.sizes.unit)
    if goal.answer is not None:
        if state.menu_open:
            return Press("escape")
        p = sc.point("recall.reopen") if state.recall is not None else None
        return _click(p) if p is not None else Fail()
    app = goal.app
    assert app is not None
    if goal.code and goal.text not in state.revealed:
        return Fail()
    if goal.then is not None:
        return _then_action(goal, state, sc)
    if not state.is_open(app):
        return _launch(state, sc, app)
    if state.menu_open:
        return Press("escape")
    top = state.top
    assert top is not None
    if top.app != app:
        return _raise(state, sc, app)
    if goal.text is None:
        return Done()
    return _edit(goal, state, sc, app)
