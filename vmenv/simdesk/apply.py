"""How the simulated desktop reacts to an action: a pure function of (state, action).

Rules (what a user of a small desktop would expect):
* a left click goes to the top-most widget under the pointer: an icon opens its app (or
  raises it), a title bar raises its window, the ×  closes it, a text field takes the keyboard
  focus, the Save button saves the note; a click anywhere that is not a text field drops the
  focus.  Right / middle clicks only move the pointer.  While a dialog is open only its
  buttons react (it is modal);
* typed text goes to the focused field and nowhere else ("\\n" submits, like enter);
* keys: enter / return submits the focused field, backspace deletes, escape cancels the
  dialog (or drops the focus), a printable single key or "space" types itself;
  hotkeys alt+f4 closes the top window, ctrl+alt+t opens the terminal;
* a drag that starts on a title bar moves the window; scroll, wait, done, fail, no-op change
  nothing but the pointer.
The env advances ``step``; this module never does.
"""

from __future__ import annotations

import attrs

from vmenv.actions import Action, Click, DragTo, Hotkey, MoveTo, Press, Scroll, TypeText
from vmenv.simdesk import geometry as geo
from vmenv.simdesk.geometry import App
from vmenv.simdesk.state import (
    MAX_FIELD_CHARS, MAX_LINES, DeskState, NotesState, TerminalState, Window,
)
from vmenv.simdesk.widgets import hit

_PRINTABLE_KEYS = {"space": " "}


def _clamp_pointer(state: DeskState, x: int, y: int) -> tuple[int, int]:
    m = state.metrics
    return min(max(x, 0), m.width - 1), min(max(y, 0), m.height - 1)


def _raise(state: DeskState, app: App) -> DeskState:
    win = state.window(app)
    assert win is not None
    return attrs.evolve(state, windows=(*(w for w in state.windows if w.app != app), win))


def _open(state: DeskState, app: App) -> DeskState:
    if state.is_open(app):
        s = _raise(state, app)
    else:
        win = Window(app, geo.default_window(state.metrics, app))
        s = attrs.evolve(state, windows=(*state.windows, win))
    # a new terminal is ready for typing; the notes field must be clicked first
    return attrs.evolve(s, focus="terminal" if app == "terminal" else None)


def _close(state: DeskState, app: App) -> DeskState:
    return attrs.evolve(state, windows=tuple(w for w in state.windows if w.app != app),
                        focus=None if state.focus == app else state.focus)


def _click(state: DeskState, x: int, y: int) -> DeskState:
    w = hit(state, x, y)
    name = w.name if w else "desktop"
    if name == "dialog.ok" or name == "dialog.cancel":
        return attrs.evolve(state, dialog=None, dialog_result=name.split(".")[1])
    if name in ("dialog", "modal"):
        return state
    kind, _, part = name.partition(".")
    if kind == "icon":
        return _open(state, part)  # type: ignore[arg-type]
    if kind in geo.APPS:
        app: App = kind  # type: ignore[assignment]
        if part == "close":
            return _close(state, app)
        s = _raise(state, app)
        if name in ("notes.field", "terminal.input"):
            return attrs.evolve(s, focus=app)
        if name == "notes.save":
            s = attrs.evolve(s, notes=attrs.evolve(s.notes, saved=(*s.notes.saved, s.notes.text)))
        return attrs.evolve(s, focus=None)
    return attrs.evolve(state, focus=None)  # taskbar or bare desktop


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


def _submit(state: DeskState) -> DeskState:
    if state.focus == "notes":
        return attrs.evolve(state, notes=NotesState(state.notes.text,
                                                    (*state.notes.saved, state.notes.text)))
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
            return attrs.evolve(state, dialog=None, dialog_result="cancel")
        return attrs.evolve(state, focus=None)
    if state.dialog is not None:
        return state
    if key in ("enter", "return"):
        return _submit(state)
    if key == "backspace":
        return _backspace(state)
    char = _PRINTABLE_KEYS.get(key, key)
    return _insert(state, char) if len(char) == 1 else state


def _hotkey(state: DeskState, keys: tuple[str, ...]) -> DeskState:
    if state.dialog is not None:
        return state
    chord = frozenset(keys)
    if chord == {"alt", "f4"} and state.top is not None:
        return _close(state, state.top.app)
    if chord == {"ctrl", "alt", "t"}:
        return _open(state, "terminal")
    return state


def _drag(state: DeskState, a: DragTo) -> DeskState:
    w = hit(state, a.x0, a.y0)
    if state.dialog is not None or w is None or not w.name.endswith(".title"):
        return state
    app: App = w.name.split(".")[0]  # type: ignore[assignment]
    s = _raise(state, app)
    win = s.windows[-1]
    moved = geo.clamp_window(s.metrics, win.rect.moved(a.x1 - a.x0, a.y1 - a.y0))
    return attrs.evolve(s, windows=(*s.windows[:-1], Window(app, moved)))


def apply_action(state: DeskState, action: Action) -> DeskState:
    """The desktop after ``action`` (``state.step`` unchanged)."""
    match action:
        case Click(x=x, y=y, button=button):
            s = attrs.evolve(state, pointer=_clamp_pointer(state, x, y))
            return _click(s, *s.pointer) if button == "left" else s
        case MoveTo(x=x, y=y):
            return attrs.evolve(state, pointer=_clamp_pointer(state, x, y))
        case DragTo():
            s = _drag(state, action)
            return attrs.evolve(s, pointer=_clamp_pointer(s, action.x1, action.y1))
        case TypeText(text=text):
            return state if state.dialog is not None else _type(state, text)
        case Press(key=key):
            return _press(state, key)
        case Hotkey(keys=keys):
            return _hotkey(state, keys)
        case Scroll(x=int() as x, y=int() as y):
            return attrs.evolve(state, pointer=_clamp_pointer(state, x, y))
    return state  # Scroll without a position, Wait, Done, Fail, NoOp
