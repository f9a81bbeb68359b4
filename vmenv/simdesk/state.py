"""The simulated desktop's state: immutable records, changed only by ``simdesk_apply``.

Invariants (checked by ``DeskState.check_integrity``, called by the env after every step):
* at most one window per app; ``windows`` is in stacking order, the last one on top;
* ``focus`` names an app whose window is open (its text field has the keyboard focus);
* while a ``dialog`` is open it is modal: nothing else reacts to the mouse or keyboard;
* text fields never exceed ``MAX_FIELD_CHARS``; the terminal keeps its last ``MAX_LINES``.
"""

from __future__ import annotations

from typing import Literal

import attrs

from vmenv.simdesk.geometry import App, Metrics, Rect

MAX_FIELD_CHARS = 64
MAX_LINES = 40
DialogResult = Literal["ok", "cancel"]


@attrs.frozen
class Window:
    """An open app window."""

    app: App
    rect: Rect


@attrs.frozen
class Dialog:
    """A modal message box with OK and Cancel."""

    title: str
    message: str


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


@attrs.frozen
class DeskState:
    """Everything the screen shows.  ``step`` feeds the taskbar clock."""

    metrics: Metrics
    windows: tuple[Window, ...] = ()
    focus: App | None = None
    dialog: Dialog | None = None
    dialog_result: DialogResult | None = None
    notes: NotesState = NotesState()
    terminal: TerminalState = TerminalState()
    pointer: tuple[int, int] = (0, 0)
    step: int = 0

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
        apps = [w.app for w in self.windows]
        assert len(apps) == len(set(apps)), apps
        assert self.focus is None or self.focus in apps, (self.focus, apps)
        assert len(self.notes.text) <= MAX_FIELD_CHARS
        assert len(self.terminal.command) <= MAX_FIELD_CHARS
        assert len(self.terminal.lines) <= MAX_LINES
        x, y = self.pointer
        assert 0 <= x < self.metrics.width and 0 <= y < self.metrics.height, self.pointer
