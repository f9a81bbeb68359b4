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
from typing import TYPE_CHECKING

import attrs

from cachepolicy.context_log import Segment
from cachepolicy.policies.faithful import PLACES
from cachepolicy.segments import SegmentFactory
from runtime.serve.messages import ChatRequest, ImagePart, Message, TextPart

if TYPE_CHECKING:
    from runtime.serve.chat import ChatOutcome, ChatService, Conversation


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


async def complete_faithful(service: ChatService, req: ChatRequest, key: str | None, *,
                            arrived: float, on_token: Callable[[int], None] | None,
                            ) -> ChatOutcome:
    from runtime.serve.chat import ChatOutcome, finish_reason

    host = service.host
    conv = service.conversations.get(key) if key is not None else _find(service, req)
    if conv is None or conv.mode != "faithful":
        if conv is not None:
            await service.close(conv.conversation_id)
        conv = await _open(service, req, key)
    factory = host.factory
    options = service.options(req, on_token)
    n = len(req.messages)
    step = await host.episodes.decide(conv.conversation_id, lambda d: d.respond(
        lambda: render(factory, req.messages), options=options,
        continuation=continuation(factory, n), arrived_at=arrived))
    host.metrics.step("chat", step.metrics)
    conv.signature = signature(req.messages)
    return ChatOutcome(conv.conversation_id, "faithful", step, step.act.record.output_text,
                       finish_reason(host, step, options))


def signature(messages: tuple[Message, ...]) -> list[tuple[str, str, tuple[str, ...]]]:
    """Each message's identity (role, text, image keys): what a later request repeats."""
    from runtime.serve.chat import image_key

    return [(m.role, m.text, tuple(image_key(i) for i in m.images)) for m in messages]


def _find(service: ChatService, req: ChatRequest) -> Conversation | None:
    """The idle faithful conversation that shares the most leading messages with the
    request (at least one; ties: the most recently used), else None.  Agents that send the
    same system prompt may share one this way — still exact, only reuse suffers; an
    explicit conversation id keeps them apart."""
    sig = signature(req.messages)
    best, best_key = None, (0, 0.0)
    for conv in service.conversations.values():
        hosted = service.host.episodes.episodes.get(conv.conversation_id)
        if conv.mode != "faithful" or conv.explicit or hosted is None or hosted.busy:
            continue
        n = 0
        while n < min(len(sig), len(conv.signature)) and sig[n] == conv.signature[n]:
            n += 1
        if n >= 1 and (n, hosted.last_used) > best_key:
            best, best_key = conv, (n, hosted.last_used)
    return best


async def _open(service: ChatService, req: ChatRequest, key: str | None) -> Conversation:
    from runtime.serve.chat import Conversation

    host = service.host
    new_id, n = host.new_id("chat")
    conv_id = key if key is not None else new_id
    system = "\n".join(m.text for m in req.messages if m.role == "system")
    config = attrs.evolve(host.config.agent, profile="chat", grammar=False, policy="faithful",
                          system_prompt=system, decode_tokens=None)
    images = [p for m in req.messages for p in m.parts if isinstance(p, ImagePart)]
    screen = images[-1].size if images else (1, 1)
    await host.episodes.open(conv_id, config, "", screen, seed=0,
                             evictable=service._evictable)
    conv = Conversation(conv_id, key is not None, system, "", mode="faithful")
    service.conversations[conv_id] = conv
    return conv
