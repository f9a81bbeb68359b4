"""The ``Profile`` interface: what kvagent must know to drive one family of models.

A real GUI model answers in the format it was trained on.  A profile bundles that format's
pieces: the system prompt, the history layout the model was trained with (as data the session
renders), a bounded GBNF grammar for constrained decoding, the parser (text → ``Action``) and
the model's own spelling of an action.  Profiles are immutable values; one may serve any
number of episodes.
"""

from __future__ import annotations

import abc
import re
from typing import ClassVar

import attrs

from runtime.actions.parsed import Parsed
from runtime.actions.parser import check_screen, noop
from vmenv.actions.coords import CoordConvention, Screen
from vmenv.actions.types import Action, Click, DragTo, MoveTo, Scroll

Point = tuple[int, int]

#: Past model text (a thought, an action summary) is cut to this many characters per step.
HISTORY_TEXT_MAX_CHARS = 400
# Markup that would become control tokens when the history is tokenized (the engine tokenizes
# with special tokens on): chat-turn markers, tool-call / think / box tags.
_MARKUP = re.compile(r"<\|[^<>|\n]{0,40}\|>|</?(?:tool_call|tools|think|point|bbox)>",
                     re.IGNORECASE)
_SPACES = re.compile(r"\s+")


def history_safe(text: str, max_chars: int = HISTORY_TEXT_MAX_CHARS) -> str:
    """Model text made fit to re-enter the prompt as data: special-token markup removed,
    whitespace (newlines too) collapsed to single spaces, at most ``max_chars`` characters.
    Model text can never open a chat turn or a tool call in the history this way."""
    s = _SPACES.sub(" ", _MARKUP.sub("", text[: 4 * max_chars])).strip()
    return s if len(s) <= max_chars else s[: max_chars - 3].rstrip() + "..."


@attrs.frozen
class HistoryLayout:
    """How a model was trained to see its past, as far as kvagent's terminal layout
    (``[system][instruction + one text line per past step][<= window screenshots]``) can
    render it.

    ``window``: screenshots visible at a step, the current one included.
    ``instruction``: the text that opens the first user turn (``{instruction}`` is replaced);
    the step lines follow it.
    ``step``: one past step's line (``{n}``: its number, ``{text}``: ``history_text``).
    ``first_step``: the number of the first step (OSWorld's agents count from 1).
    ``trained``: the layout the model was trained / evaluated with, in words.
    ``unhonoured``: what of it the terminal layout cannot reproduce.
    """

    window: int
    instruction: str
    step: str = "Step {n}: {text}\n"
    first_step: int = 0
    trained: str = ""
    unhonoured: tuple[str, ...] = ()

    def instruction_text(self, instruction: str) -> str:
        return self.instruction.replace("{instruction}", instruction)

    def step_text(self, index: int, text: str) -> str:
        """The history line of step ``index`` (0-based) whose text is ``text``."""
        return self.step.replace("{n}", str(index + self.first_step)).replace("{text}", text)


class Profile(abc.ABC):
    """One model family's prompt, history layout, output grammar and parser.

    Coordinates in every ``Action`` are absolute pixels of ``screen`` (width, height): the
    profile converts from and to the model's own units.
    """

    name: ClassVar[str]

    @property
    @abc.abstractmethod
    def convention(self) -> CoordConvention:
        """How the model writes coordinates."""

    @property
    @abc.abstractmethod
    def layout(self) -> HistoryLayout:
        """The history layout to render (see ``HistoryLayout``)."""

    @abc.abstractmethod
    def system_prompt(self, screen_w: int, screen_h: int) -> str:
        """The system prompt for a screen of ``screen_w`` x ``screen_h`` pixels."""

    @abc.abstractmethod
    def grammar(self, screen: Screen) -> str:
        """GBNF (llama.cpp) text constraining one response to the format; its sentences are
        at most ``max_output_chars(screen)`` characters, so decoding always terminates."""

    @abc.abstractmethod
    def max_output_chars(self, screen: Screen) -> int:
        """The longest response ``grammar(screen)`` admits: decode that + 1 tokens."""

    @abc.abstractmethod
    def parse_strict(self, text: str, screen: Screen, *, pointer: Point | None = None) -> Parsed:
        """Parse one response or raise ``ActionError`` (``ActionParseError`` /
        ``InvalidActionError``) with the cause.  ``pointer``: where the mouse is, for actions
        the format defines relative to it (None: unknown)."""

    @abc.abstractmethod
    def format(self, action: Action, screen: Screen) -> str:
        """The response this model would write for ``action`` (the inverse of ``parse``);
        raises ``InvalidActionError`` for an action the format cannot express."""

    @abc.abstractmethod
    def history_text(self, action: Action, response: str, screen: Screen) -> str:
        """The text of a past step in the history (``layout.step``'s ``{text}``), from the
        parsed action and the model's response.  Never the raw response: at most its
        ``history_safe`` summary beside the action's canonical form."""

    @abc.abstractmethod
    def max_history_chars(self, screen: Screen) -> int:
        """The longest ``history_text`` of a response the grammar admits (for context sizing)."""

    def image_tokens(self, screen: Screen) -> int | None:
        """The image tokens the model's own processor makes of a ``screen``-sized screenshot,
        for profiles whose coordinates assume that processing (None: nothing assumed).  The
        session compares it with what the projector it runs made (``AgentSession``)."""
        return None

    def parse(self, text: str, screen: Screen, *, pointer: Point | None = None) -> Parsed:
        """Parse one response; never raises for bad model text (a ``NoOp`` whose reason says
        why).  A bad ``screen`` is the caller's error and raises ``InvalidActionError``."""
        check_screen(screen)
        try:
            return self.parse_strict(text, screen, pointer=pointer)
        except Exception as exc:  # noqa: BLE001 — model text must not end the episode
            return Parsed(noop(text, exc))


def pointer_after(action: Action, pointer: Point | None) -> Point | None:
    """Where the mouse is after ``action`` (``pointer`` before it; None: unknown).  The
    session tracks this for formats whose actions start at the pointer (Qwen3-VL's drag)."""
    match action:
        case Click(x=x, y=y) | MoveTo(x=x, y=y):
            return x, y
        case DragTo(x1=x, y1=y):
            return x, y
        case Scroll(x=int() as x, y=int() as y):
            return x, y
    return pointer
