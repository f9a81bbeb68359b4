"""A chat conversation: what the host holds of one client's chat, and how a request is read
against it.

A request is matched by identity, never by trust: images by their PNG bytes
(``image_key``), messages by role, text and image keys (``signature``).  A terminal-mode
request is read as agent steps (``terminal_turns``): the system text, the instruction, one
answer per image but the last, and the images; ``Conversation.continues`` says whether it
repeats what the conversation holds and adds one screenshot.
"""

from __future__ import annotations

import hashlib

import attrs

from runtime.profiles import get as get_profile
from runtime.serve.messages import ImagePart, Message

#: How a conversation's prompts are laid out (``runtime/serve/terminal.py``,
#: ``runtime/serve/faithful.py``).
CHAT_MODES = ("terminal", "faithful")

#: Each message of a request: (role, text, image keys).
Signature = list[tuple[str, str, tuple[str, ...]]]


def image_key(image: ImagePart) -> str:
    """Identity of a client's image: its PNG bytes (a client resends retained screenshots
    byte for byte; one that re-encodes them only loses reuse, never exactness)."""
    return hashlib.blake2b(image.png, digest_size=16).hexdigest()


def signature(messages: tuple[Message, ...]) -> Signature:
    """Each message's identity (role, text, image keys): what a later request repeats."""
    return [(m.role, m.text, tuple(image_key(i) for i in m.images)) for m in messages]


@attrs.frozen
class TerminalTurns:
    """A request read as agent steps: the system text, the instruction, one answer per
    image but the last, and the images."""

    system: str
    instruction: str
    answers: tuple[str, ...]  # history_safe texts, as the history holds them
    images: tuple[ImagePart, ...]
    keys: tuple[str, ...]


def terminal_turns(messages: tuple[Message, ...]) -> TerminalTurns | None:
    """The request as steps, or None when it does not have that shape."""
    system = "\n".join(m.text for m in messages if m.role == "system")
    convo = [m for m in messages if m.role != "system"]
    if not convo or convo[-1].role != "user" or not convo[-1].images:
        return None
    first_text = next((m.text for m in convo if m.role == "user" and m.text.strip()), "")
    chat = get_profile("chat")
    answers = tuple(chat.history_text(None, m.text, (1, 1))  # type: ignore[arg-type]
                    for m in convo if m.role == "assistant")
    images = tuple(i for m in convo for i in m.images)
    if len(images) != len(answers) + 1:
        return None
    return TerminalTurns(system, first_text, answers, images,
                         tuple(image_key(i) for i in images))


@attrs.define(eq=False)
class Conversation:
    """One chat conversation; its episode in the pool has the same id (``chat-…``, the
    host's).  ``name``: what the client called it (its conversation header or ``user``),
    scoped to its ``owner``; None when it was matched by content."""

    conversation_id: str
    owner: str
    name: str | None
    system: str
    instruction: str
    answers: list[str] = attrs.Factory(list)  # the history lines, the last one predicted
    keys: list[str] = attrs.Factory(list)  # the log's screenshots, in order
    mode: str = attrs.field(default="terminal", validator=attrs.validators.in_(CHAT_MODES))
    #: faithful mode: each message of the last request
    signature: Signature = attrs.Factory(list)
    #: its first step was decided: until then it cannot give its slot away (a request that
    #: just opened it is still telling it the earlier turns)
    stepped: bool = False

    @property
    def explicit(self) -> bool:
        """The client named it."""
        return self.name is not None

    def continues(self, turns: TerminalTurns) -> bool:
        """Whether ``turns`` repeats what this conversation holds and adds one screenshot."""
        n_old = len(turns.keys) - 1
        if self.mode != "terminal" or turns.system != self.system or n_old > len(self.keys):
            return False
        if list(turns.keys[:-1]) != self.keys[len(self.keys) - n_old:]:
            return False
        m = len(turns.answers)
        return m <= len(self.answers) and list(turns.answers) == self.answers[
            len(self.answers) - m:] and len(self.keys) == len(self.answers)

    def shared_messages(self, sig: Signature) -> int:
        """How many leading messages a request with signature ``sig`` shares with this
        conversation's last request."""
        n = 0
        while n < min(len(sig), len(self.signature)) and sig[n] == self.signature[n]:
            n += 1
        return n
