"""How the simulated desktop reacts to an action: a pure function of (state, action).

Rules (what a user of a small desktop would expect):
* a left click goes to the top-most widget under the pointer (``widgets``): a launcher opens
  its app (or raises it; a dead decoy's does nothing), a title bar raises its window, the ×
  closes it, a text field takes the keyboard focus, the Save button saves the note; a click
  anywhere that is not a text field drops the focus.  Right / middle clicks only move the
  pointer;
* while a dialog is open only its buttons react (it is modal); a button closes the dialog
  and, if the dialog records answers, sets ``dialog_result`` to its id; a reopenable dialog
  leaves a notification whose Reopen button brings it back.  A *transient* dialog closes at
  the next action whatever it is (a click on it, a key, a wait...), and that is all the
  action does;
* the first screen's launcher mark (``DeskState.mark``) is gone after the next action,
  whatever it is — and, unlike a transient dialog, the action still does what it does;
* ``events`` records each window that opens and each save of Notes, in order;
* the launcher menu: its taskbar button opens it; while it is open a click on an entry opens
  that app, and any other click just closes the menu; keys other than escape do nothing;
* typed text goes to the focused field and nowhere else ("\\n" submits, like enter);
* keys: enter / return submits the focused field, backspace deletes, escape cancels the
  dialog (answer "cancel"), closes the menu, or drops the focus; a printable single key or
  "space" types itself; hotkeys alt+f4 closes the top window, ctrl+alt+t opens the terminal;
* a drag that starts on a title bar moves the window (kept reachable by the layout); scroll,
  wait, done, fail, no-op change nothing but the pointer.
The env advances ``step``; this module never does.
"""

from __future__ import annotations

import attrs

from vmenv.actions import Action, Click, DragTo, Hotkey, MoveTo, Press, Scroll, TypeText
from vmenv.simdesk.apps import APPS
from vmenv.simdesk.geometry import App
from vmenv.simdesk.state import (
    MAX_FIELD_CHARS, MAX_LINES, DeskState, NotesState, TerminalState, Window,
)
from vmenv.simdesk.widgets import hit

_PRINTABLE_KEYS = {"space": " "}


def _clamp_pointer(state: DeskState, x: int, y: int) -> tuple[int, int]:
    m = state.metrics
    return min(max(x, 0), m.width - 1), min(max(y, 0), m.height - 1)


def raise_window(state: DeskState, app: App) -> DeskState:
    """``app``'s window on top (it must be open)."""
    win = state.window(app)
    assert win is not None
    return attrs.evolve(state, windows=(*(w for w in state.windows if w.app != app), win))


def open_app(state: DeskState, app: App) -> DeskState:
    """Open ``app`` (or raise it) where the layout says; a new terminal takes the focus."""
    if state.is_open(app):
        s = raise_window(state, app)
    else:
        win = Window(app, state.layout.opening(app))
        s = attrs.evolve(state, windows=(*state.windows, win),
                         events=(*state.events, ("open", app)))
    # a new terminal is ready for typing; the notes field must be clicked first
    return attrs.evolve(s, focus="terminal" if app == "terminal" else None)


def close_app(state: DeskState, app: App) -> DeskState:
    return attrs.evolve(state, windows=tuple(w for w in state.windows if w.app != app),
                        focus=None if state.focus == app else state.focus)


def answer_dialog(state: DeskState, button_id: str) -> DeskState:
    """Close the open dialog as if ``button_id`` answered it (see the module docstring)."""
    d = state.dialog
    assert d is not None
    return attrs.evolve(state, dialog=None,
                        dialog_result=button_id if d.records else state.dialog_result,
                        recall=d if d.reopenable and state.layout.recall else state.recall)


def _launch(state: DeskState, app: str) -> DeskState:
    spec = APPS.get(app)
    return open_app(state, app) if spec is None or spec.opens else state


def _click_menu(state: DeskState, name: str) -> DeskState:
    s = attrs.evolve(state, menu_open=False)
    kind, _, app = name.partition(".")
    if kind == "menu" and app not in ("panel", "button", "outside"):
        return _launch(s, app)
    return s if name != "menu.panel" else state  # the panel's padding does nothing


def _click(state: DeskState, x: int, y: int) -> DeskState:
    w = hit(state, x, y)
    name = w.name if w else "desktop"
    if state.dialog is not None:
        if name.startswith("dialog."):
            return answer_dialog(state, name.partition(".")[2])
        return state
    if state.menu_open:
        return _click_menu(state, name)
    if name == "menu.button":
        return attrs.evolve(state, menu_open=True)
    if name == "recall.reopen":
        return attrs.evolve(state, dialog=state.recall, recall=None, focus=None)
    kind, _, part = name.partition(".")
    if kind in ("icon", "desk"):
        return _launch(state, part)
    if state.is_open(kind):
        if part == "close":
            return close_app(state, kind)
        s = raise_window(state, kind)
        if name in ("notes.field", "terminal.input"):
            return attrs.evolve(s, focus=kind)
        if name == "notes.save":
            s = _save(s)
        return attrs.evolve(s, focus=None)
    return attrs.evolve(state, focus=None)  # taskbar, notification box or bare desktop


def _insert(state: DeskState, text: str) -> DeskState:
    """Append printable characters to the focused field (silently cut at its capacity)."""
    text = "".join(c for c in text if c.isprintable())
    if state.focus == "notes":
        new = (state.notes.text + text)[:MAX_FIELD_CHARS]
        return attrs.evolve(state, notes=attrs.evolve(state.notes, text=new))
    if state.focus == "terminal":
        new = (state.terminal.command + text)[:MAX_FIELD_CHARS]
        return attrs.evolve(state, terminal=attrs.evolve(state.terminal, command=new))
    return state


def _run(command: str) -> tuple[str, ...]:
    """The terminal's only program is echo."""
    cmd = command.strip()
    if not cmd:
        return ()
    if cmd == "echo" or cmd.startswith("echo "):
        return (cmd[5:],)
    return (f"{cmd.split()[0]}: command not found",)


def _save(state: DeskState) -> DeskState:
    """Notes saves its text (the field keeps it)."""
    text = state.notes.text
    return attrs.evolve(state, notes=NotesState(text, (*state.notes.saved, text)),
                        events=(*state.events, ("save", text)))


def _submit(state: DeskState) -> DeskState:
    if state.focus == "notes":
        return _save(state)
    if state.focus == "terminal":
        t = state.terminal
        lines = (*t.lines, f"$ {t.command}", *_run(t.command))[-MAX_LINES:]
        return attrs.evolve(state, terminal=TerminalState("", lines))
    return state


def _backspace(state: DeskState) -> DeskState:
    if state.focus == "notes":
        return attrs.evolve(state, notes=attrs.evolve(state.notes, text=state.notes.text[:-1]))
    if state.focus == "terminal":
        t = state.terminal
        return attrs.evolve(state, terminal=attrs.evolve(t, command=t.command[:-1]))
    return state


def _type(state: DeskState, text: str) -> DeskState:
    first, *rest = text.split("\n")
    s = _insert(state, first)
    for segment in rest:
        s = _insert(_submit(s), segment)
    return s


def _press(state: DeskState, key: str) -> DeskState:
    if key in ("escape", "esc"):
        if state.dialog is not None:
            return answer_dialog(state, "cancel")
        if state.menu_open:
            return attrs.evolve(state, menu_open=False)
        return attrs.evolve(state, focus=None)
    if state.dialog is not None or state.menu_open:
        return state
    if key in ("enter", "return"):
        return _submit(state)
    if key == "backspace":
        return _backspace(state)
    char = _PRINTABLE_KEYS.get(key, key)
    return _insert(state, char) if len(char) == 1 else state


def _hotkey(state: DeskState, keys: tuple[str, ...]) -> DeskState:
    if state.dialog is not None or state.menu_open:
        return state
    chord = frozenset(keys)
    if chord == {"alt", "f4"} and state.top is not None:
        return close_app(state, state.top.app)
    if chord == {"ctrl", "alt", "t"}:
        return open_app(state, "terminal")
    return state


def _drag(state: DeskState, a: DragTo) -> DeskState:
    if state.menu_open:
        return attrs.evolve(state, menu_open=False)
    w = hit(state, a.x0, a.y0)
    if state.dialog is not None or w is None or not w.name.endswith(".title"):
        return state
    app: App = w.name.split(".")[0]
    return move_window(state, app, a.x1 - a.x0, a.y1 - a.y0)


def move_window(state: DeskState, app: App, dx: int, dy: int) -> DeskState:
    """Raise ``app``'s window and move it by (dx, dy), kept reachable by the layout."""
    s = raise_window(state, app)
    win = s.windows[-1]
    moved = s.layout.clamp(win.rect.moved(dx, dy))
    return attrs.evolve(s, windows=(*s.windows[:-1], Window(app, moved)))


def _pointer_after(state: DeskState, action: Action) -> tuple[int, int]:
    """Where ``action`` leaves the pointer."""
    match action:
        case Click(x=x, y=y) | MoveTo(x=x, y=y) | Scroll(x=int() as x, y=int() as y):
            return _clamp_pointer(state, x, y)
        case DragTo(x1=x, y1=y):
            return _clamp_pointer(state, x, y)
    return state.pointer


def apply_action(state: DeskState, action: Action) -> DeskState:
    """The desktop after ``action`` (``state.step`` unchanged)."""
    if state.mark is not None:  # see the module docstring
        state = attrs.evolve(state, mark=None)
    if state.dialog is not None and state.dialog.transient:  # see the module docstring
        return attrs.evolve(answer_dialog(state, "dismiss"), pointer=_pointer_after(state, action))
    match action:
        case Click(x=x, y=y, button=button):
            s = attrs.evolve(state, pointer=_clamp_pointer(state, x, y))
            return _click(s, *s.pointer) if button == "left" else s
        case DragTo():
            return attrs.evolve(_drag(state, action), pointer=_pointer_after(state, action))
        case TypeText(text=text):
            return state if state.dialog is not None or state.menu_open else _type(state, text)
        case Press(key=key):
            return _press(state, key)
        case Hotkey(keys=keys):
            return _hotkey(state, keys)
    return attrs.evolve(state, pointer=_pointer_after(state, action))  # move, scroll, wait...
