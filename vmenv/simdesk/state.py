"""The simulated desktop's state: immutable records, changed only by ``simdesk_apply``.

Invariants (checked by ``DeskState.check_integrity``, called by the env after every step):
* the layout is for this screen size;
* at most one window per app; ``windows`` is in stacking order, the last one on top;
* ``focus`` names an app whose window is open (its text field has the keyboard focus);
* while a ``dialog`` is open it is modal: nothing else reacts to the mouse or keyboard, and
  the launcher menu is closed;
* ``recall`` (a dismissed dialog that can be reopened) needs the layout's notification place;
* text fields never exceed ``MAX_FIELD_CHARS``; the terminal keeps its last ``MAX_LINES``;
* ``mark`` names an app with a launcher on the layout.
"""

from __future__ import annotations

import attrs

from vmenv.simdesk.dialogs import Dialog
from vmenv.simdesk.geometry import App, Metrics, Rect
from vmenv.simdesk.layout import Layout, classic_layout

MAX_FIELD_CHARS = 64
MAX_LINES = 40
#: The id of the button that answered the last recording dialog ("ok", "cancel", "save", ...).
DialogResult = str
#: Something the desktop did that a checker may need the order of: ``("open", app)`` when an
#: app's window opens (not when it is raised), ``("save", text)`` when Notes saves ``text``.
Event = tuple[str, str]


@attrs.frozen
class Window:
    """An open app window."""

    app: App
    rect: Rect


@attrs.frozen
class NotesState:
    """The notes app: one single-line text field and the texts saved from it."""

    text: str = ""
    saved: tuple[str, ...] = ()


@attrs.frozen
class TerminalState:
    """The terminal: the command line being typed and the scrollback."""

    command: str = ""
    lines: tuple[str, ...] = ()


def _classic(state: DeskState) -> Layout:
    return classic_layout(state.metrics)


@attrs.frozen
class DeskState:
    """Everything the screen shows.  ``step`` feeds the taskbar clock.

    ``revealed`` lists the codes a dialog has put on screen in this episode (a task that asks
    to type a code from memory can tell whether it was ever shown).  ``mark`` is the app whose
    launchers carry the first screen's highlight (``marked-launch``): like a transient
    dialog, the next action removes it, whatever it is.  ``events`` is what happened, in order
    (``Event``: a checker that cares when an app opened, relative to a save, reads it).
    """

    metrics: Metrics
    windows: tuple[Window, ...] = ()
    focus: App | None = None
    dialog: Dialog | None = None
    dialog_result: DialogResult | None = None
    notes: NotesState = NotesState()
    terminal: TerminalState = TerminalState()
    pointer: tuple[int, int] = (0, 0)
    step: int = 0
    layout: Layout = attrs.field(default=attrs.Factory(_classic, takes_self=True))
    menu_open: bool = False
    recall: Dialog | None = None
    revealed: tuple[str, ...] = ()
    mark: App | None = None
    events: tuple[Event, ...] = ()

    @classmethod
    def empty(cls, width: int, height: int) -> DeskState:
        """A desktop with no window open, the pointer in the middle of the screen."""
        m = Metrics(width, height)
        return cls(metrics=m, pointer=(width // 2, height // 2))

    def window(self, app: App) -> Window | None:
        return next((w for w in self.windows if w.app == app), None)

    def is_open(self, app: App) -> bool:
        return self.window(app) is not None

    @property
    def top(self) -> Window | None:
        return self.windows[-1] if self.windows else None

    def check_integrity(self) -> None:
        """Assert the invariants in the module docstring (internal consistency, not input)."""
        lay = self.layout
        assert (lay.width, lay.height) == (self.metrics.width, self.metrics.height), lay
        apps = [w.app for w in self.windows]
        assert len(apps) == len(set(apps)), apps
        assert self.focus is None or self.focus in apps, (self.focus, apps)
        assert not (self.menu_open and (self.dialog is not None or lay.menu is None))
        assert self.recall is None or lay.recall is not None
        assert len(self.notes.text) <= MAX_FIELD_CHARS
        assert len(self.terminal.command) <= MAX_FIELD_CHARS
        assert len(self.terminal.lines) <= MAX_LINES
        assert self.mark is None or lay.launchers_of(self.mark), self.mark
        x, y = self.pointer
        assert 0 <= x < self.metrics.width and 0 <= y < self.metrics.height, self.pointer
