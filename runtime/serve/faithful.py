"""Faithful chat mode: the prompt is exactly the client's messages through the model's chat
format — system, user and assistant turns in the client's order, images where the client put
them (with only the projector's own markers) — and the response its continuation.

Every request replaces the conversation's log (``AgentSession.respond``); the ``faithful``
policy reuses the longest prefix the sequence holds, restoring a checkpoint at a message
boundary on hybrid models.  Segments are rendered per message so that a message renders to
the same tokens in every request: an assistant turn is its opening (which is also the
previous request's generation prompt) and then its text with the closing — so the
predicted next turn (this answer and its closing), prefetched after answering, is what an
appending client's next request holds.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import attrs

from cachepolicy.context_log import Segment
from cachepolicy.policies.faithful import PLACES
from cachepolicy.segments import SegmentFactory
from runtime.config import AgentConfig
from runtime.driver import DriverStep
from runtime.pool import EpisodePool
from runtime.serve.conversation import Conversation, signature
from runtime.serve.conversations import Conversations
from runtime.serve.ids import new_id
from runtime.serve.messages import ImagePart, Message, TextPart
from runtime.serve.owners import Owner
from scheduler.transaction import StepOptions


class FaithfulChat:
    """Answers faithful-mode requests (and terminal-mode ones that are not agent steps);
    ``agent`` is the server's agent configuration conversations are opened with."""

    def __init__(self, pool: EpisodePool, factory: SegmentFactory,
                 conversations: Conversations, agent: AgentConfig) -> None:
        self._pool, self._factory, self._conversations = pool, factory, conversations
        self._agent = agent

    async def complete(self, messages: tuple[Message, ...], key: str | None, owner: Owner,
                       options: StepOptions, *, arrived_at: float) -> tuple[str, DriverStep]:
        """Answer ``messages`` in ``owner``'s conversation ``key`` names (or the one sharing
        the most leading messages); returns the conversation's id and the decided step."""
        conv = (self._conversations.named(owner, key) if key is not None
                else self._find(messages, owner))
        opened = conv is None or conv.mode != "faithful"
        if opened:
            if conv is not None:
                await self._conversations.close(conv.conversation_id)
            conv = await self._open(messages, key, owner)
        assert conv is not None
        factory, n = self._factory, len(messages)
        try:
            step = await self._pool.decide(conv.conversation_id, lambda d: d.respond(
                lambda: render(factory, messages), options=options,
                continuation=continuation(factory, n), arrived_at=arrived_at))
        except BaseException:
            if opened:  # opened here and never answered: its slot must not stay taken
                with anyio.CancelScope(shield=True):
                    await self._conversations.close(conv.conversation_id)
            raise
        conv.stepped = True
        conv.signature = signature(messages)
        return conv.conversation_id, step

    def _find(self, messages: tuple[Message, ...], owner: Owner) -> Conversation | None:
        """``owner``'s idle faithful conversation that shares the most leading messages with
        the request (at least one; ties: the most recently used), else None.  Agents that
        send the same system prompt may share one this way — still exact, only reuse
        suffers; an explicit conversation id keeps them apart."""
        sig = signature(messages)
        best, best_key = None, (0, 0.0)
        for conv in self._conversations.implicit("faithful", owner):
            pooled = self._conversations.pooled(conv.conversation_id)
            if pooled is None or pooled.busy:
                continue
            n = conv.shared_messages(sig)
            if n >= 1 and (n, pooled.last_used) > best_key:
                best, best_key = conv, (n, pooled.last_used)
        return best

    async def _open(self, messages: tuple[Message, ...], key: str | None,
                    owner: Owner) -> Conversation:
        system = "\n".join(m.text for m in messages if m.role == "system")
        config = attrs.evolve(self._agent, profile="chat", grammar=False, policy="faithful",
                              system_prompt=system, decode_tokens=None)
        images = [p for m in messages for p in m.parts if isinstance(p, ImagePart)]
        conv = Conversation(new_id("chat"), owner, key, system, "", mode="faithful")
        await self._conversations.open(conv, config, images[-1].size if images else (1, 1))
        return conv


def render(factory: SegmentFactory, messages: tuple[Message, ...]) -> tuple[Segment, ...]:
    """The messages and the generation prompt as segments (blocking: encodes images)."""
    chat = factory.chat
    out: list[Segment] = []
    for m_index, m in enumerate(messages):
        place = m_index * PLACES
        parts: list[Segment] = []

        def text(t: str) -> None:
            if t:
                parts.append(factory.text(place + len(parts), t))

        if m.role == "assistant":  # opening / text + closing: see the module docstring
            text(chat.assistant_prefix)
            text(m.text + chat.assistant_suffix)
        else:
            prefix, suffix = ((chat.system_prefix, chat.system_suffix) if m.role == "system"
                              else (chat.user_prefix, chat.user_suffix))
            pending = prefix
            for part in m.parts:
                if isinstance(part, TextPart):
                    pending += part.text
                else:
                    text(pending)
                    pending = ""
                    parts.append(factory.image(place + len(parts), part.png))
            text(pending + suffix)
        out += parts
    gen = len(messages) * PLACES
    out.append(factory.text(gen, chat.assistant_prefix))
    return tuple(out)


def continuation(factory: SegmentFactory, n_messages: int) -> Callable[[str], tuple[Segment, ...]]:
    """What an appending client's next request adds after this prompt: the answer and the
    assistant turn's closing, as the next request renders them."""
    def next_turn(answer: str) -> tuple[Segment, ...]:
        return (factory.text(n_messages * PLACES + 1, answer + factory.chat.assistant_suffix),)
    return next_turn
