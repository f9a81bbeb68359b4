"""kvagent's own profile: its action language (``runtime.actions``), for any instruction model.

One implementation: the grammar is ``action_grammar``, the parser ``read_action``, the
model's spelling ``format_action``; this module holds the language's system prompt and the
history text of an unparsable step.  It is the default profile and keeps kvagent's language
as it always was: the grammar does not depend on the screen (absolute pixels up to 9999),
so every point is clamped onto the screen rather than rejected — and each clamp is noted in
``Parsed.notes``, which the session records in the step's metrics.  The pointer is not used:
every action of the language names its point.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from runtime.actions.calls import Reader
from runtime.actions.grammar import action_grammar, max_action_chars
from runtime.actions.parsed import Parsed
from runtime.actions.parser import read_action
from runtime.profiles.base import HistoryLayout, Point, Profile
from vmenv.actions.coords import CoordConvention, Screen
from vmenv.actions.format import format_action
from vmenv.actions.types import Action, NoOp

#: What an unparsable step leaves in the history (never the raw text).
NOOP_TEXT = "noop()"

_PROMPT = (
    "You are a GUI agent operating a desktop of {width}x{height} pixels through screenshots. "
    "Reply with exactly one action: click(x, y), double_click(x, y), right_click(x, y), "
    "move_to(x, y), drag(x0, y0, x1, y1), type(\"text\"), hotkey(\"ctrl\", \"c\"), "
    "press(\"enter\"), scroll(dx, dy), wait(seconds), done() or fail(). {coords}")

_COORDS = {
    CoordConvention.ABSOLUTE: "Coordinates are absolute screen pixels.",
    CoordConvention.RELATIVE_999: "Coordinates are on a 0-999 grid over the screen.",
    CoordConvention.RELATIVE_1: "Coordinates are fractions 0-1 of the screen.",
}

_LAYOUT = HistoryLayout(
    window=3,
    instruction="Task: {instruction}\nPrevious actions:\n",
    step="Step {n}: {text}\n",
    first_step=0,
    trained="none: kvagent's own language, explained by the system prompt; the history is "
            "one 'Step i: <action>' line per past step, then the last K screenshots",
    unhonoured=(),
)


@attrs.frozen
class KvAgentProfile(Profile):
    """kvagent's action language with coordinates in ``coords``."""

    name: ClassVar[str] = "kvagent"
    coords: CoordConvention = CoordConvention.ABSOLUTE

    @property
    def convention(self) -> CoordConvention:
        return self.coords

    @property
    def layout(self) -> HistoryLayout:
        return _LAYOUT

    def system_prompt(self, screen_w: int, screen_h: int) -> str:
        return _PROMPT.format(width=screen_w, height=screen_h, coords=_COORDS[self.coords])

    def grammar(self, screen: Screen) -> str:
        return action_grammar(self.coords)

    def max_output_chars(self, screen: Screen) -> int:
        return max_action_chars(self.coords)

    def parse_strict(self, text: str, screen: Screen, *, pointer: Point | None = None) -> Parsed:
        reader = Reader(self.coords, screen)  # clamps every point (and notes it)
        return Parsed(read_action(text, reader), tuple(reader.notes))

    def format(self, action: Action, screen: Screen) -> str:
        return format_action(action, convention=self.coords, screen=screen)

    def history_text(self, action: Action, response: str, screen: Screen) -> str:
        if isinstance(action, NoOp):
            return NOOP_TEXT
        return self.format(action, screen)

    def max_history_chars(self, screen: Screen) -> int:
        return max(self.max_output_chars(screen), len(NOOP_TEXT))
