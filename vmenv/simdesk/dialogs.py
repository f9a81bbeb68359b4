"""Modal dialogs: a title, a message, buttons where the dialog says, maybe a code to remember.

A dialog carries its own geometry (randomized dialogs sit anywhere, with 2-4 buttons in any
order); ``classic_dialog`` builds the fixed centred OK / Cancel one of ``default_tasks``.

Flags (see ``apply``): ``transient`` — the dialog closes at the next action whatever it is, so
what it shows (``code``) appears in exactly one screenshot; ``records`` — answering sets
``DeskState.dialog_result`` (pop-ups that do not matter to the task leave it alone);
``reopenable`` — answering leaves a notification whose button brings the dialog back, so a
wrong answer can be corrected.

Invariants: button ids are unique; buttons lie inside the dialog and do not overlap.
"""

from __future__ import annotations

import attrs

from vmenv.simdesk import geometry as geo
from vmenv.simdesk.geometry import Metrics, Rect


@attrs.frozen
class DialogButton:
    """A button: ``id`` is what answering with it records, ``label`` what it shows."""

    id: str
    label: str
    rect: Rect
    primary: bool = False


@attrs.frozen
class Dialog:
    """A modal dialog (see the module docstring)."""

    title: str
    message: str
    rect: Rect
    buttons: tuple[DialogButton, ...]
    code: str = ""
    transient: bool = False
    records: bool = True
    reopenable: bool = False

    def __attrs_post_init__(self) -> None:
        ids = [b.id for b in self.buttons]
        assert len(ids) == len(set(ids)), ids
        for i, b in enumerate(self.buttons):
            assert b.rect.inside(self.rect), (b, self.rect)
            assert not any(b.rect.overlaps(o.rect) for o in self.buttons[i + 1:]), self.buttons

    def button(self, button_id: str) -> DialogButton | None:
        return next((b for b in self.buttons if b.id == button_id), None)


def classic_dialog(m: Metrics, title: str, message: str) -> Dialog:
    """The fixed dialog: centred above the taskbar, Cancel then OK at the bottom right."""
    box = geo.dialog(m)
    return Dialog(title, message, box, (
        DialogButton("ok", "OK", geo.dialog_button(m, box, "ok"), primary=True),
        DialogButton("cancel", "Cancel", geo.dialog_button(m, box, "cancel"))))
