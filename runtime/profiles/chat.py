"""``chat``: free text in, free text out — the profile of ``kvagent serve``'s chat
completions in terminal mode, where the client owns the prompt's words and the output format.

The client's system message is the system prompt (``AgentConfig.system_prompt``); its first
user text is the instruction, verbatim; each assistant message is one past step's line.
Responses are not parsed into actions (the client parses them; every step is a ``NoOp``
whose reason says so) and there is no grammar.  A past response re-enters the prompt as data:
``history_safe`` (special-token markup removed, whitespace collapsed, bounded).
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from runtime.actions.parsed import Parsed
from runtime.profiles.base import HistoryLayout, Point, Profile, history_safe
from vmenv.actions.coords import CoordConvention, Screen
from vmenv.actions.errors import ActionParseError, InvalidActionError
from vmenv.actions.types import Action

#: A past response keeps at most this many characters in the history.
CHAT_HISTORY_CHARS = 4000

_LAYOUT = HistoryLayout(
    window=5,
    instruction="{instruction}\n",
    step="Step {n}: {text}\n",
    first_step=1,
    trained="whatever the client's model was trained with: terminal mode re-lays the "
            "conversation as [system][first user text][one line per assistant message]"
            "[last K screenshots]",
    unhonoured=("the client's message order (images and answers interleaved)",
                "user text after the first user message"),
)


@attrs.frozen
class ChatProfile(Profile):
    name: ClassVar[str] = "chat"

    @property
    def convention(self) -> CoordConvention:
        return CoordConvention.ABSOLUTE

    @property
    def layout(self) -> HistoryLayout:
        return _LAYOUT

    def system_prompt(self, screen_w: int, screen_h: int) -> str:
        return ""  # the client's own system message comes through AgentConfig.system_prompt

    def grammar(self, screen: Screen) -> str:
        raise ValueError("the chat profile is free text: use grammar=False")

    def max_output_chars(self, screen: Screen) -> int:
        return CHAT_HISTORY_CHARS

    def parse_strict(self, text: str, screen: Screen, *, pointer: Point | None = None) -> Parsed:
        raise ActionParseError("free text: the client parses chat responses")

    def format(self, action: Action, screen: Screen) -> str:
        raise InvalidActionError("the chat profile has no action format")

    def history_text(self, action: Action, response: str, screen: Screen) -> str:
        return history_safe(response, CHAT_HISTORY_CHARS)

    def max_history_chars(self, screen: Screen) -> int:
        return CHAT_HISTORY_CHARS
