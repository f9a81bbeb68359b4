"""The result of parsing one model output: the action, and what the parser had to change."""

from __future__ import annotations

import attrs

from vmenv.actions.types import Action, NoOp


@attrs.frozen
class Parsed:
    """``action`` (a ``NoOp`` whose reason says why when the text was not an action) and
    ``notes``: what the parser did to the model's intent on the way, for the step's info —
    coordinates clamped onto the screen, an action mapped onto the nearest one kvagent has
    (a drag that starts at the pointer, a second tool call ignored, ...).  Data only."""

    action: Action
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """The text was an action (not a ``NoOp``)."""
        return not isinstance(self.action, NoOp)
