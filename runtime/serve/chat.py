"""Chat completions (OpenAI-compatible) for agents that bring their own prompts.

Every request is mapped to a conversation — an episode of the host, on its own sequence —
and answered through that episode's ``EpisodeDriver``, so chat clients get the scheduler,
the memory budget and the overlap kvagent's own agent gets.

**Terminal mode** (the default): the conversation is re-laid into kvagent's terminal layout
— ``[system][first user text][one line per assistant answer][last K screenshots][generation
prompt]`` — so terminal-slot reuses everything but the new screenshot, and after answering
the host prefetches what the next request will certainly hold: the answer as a history line
and the retained screenshots.  It changes the prompt the model sees (the client's message
order is not kept; user text after the first user message is not shown).  A request maps to
steps when it has one assistant answer per image but the last, and ends with a user message
holding an image; anything else is answered in faithful mode.

**Faithful mode**: the prompt is exactly the client's messages through the model's chat
format (``runtime/serve/faithful.py``).

Mapping a request to its conversation: an explicit id (the ``X-Kvagent-Conversation`` header
or the ``user`` field) names it; otherwise the host looks for a live conversation whose last
answer and retained screenshots the request repeats.  A request that does not continue what
its conversation holds (an edited answer, other screenshots) restarts it from its own
content: outputs never depend on a wrong prediction.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import attrs
import structlog

from cachepolicy.engine.sampling import SamplingParams
from runtime.driver import DriverStep
from runtime.pool import PooledEpisode
from runtime.profiles import get as get_profile
from runtime.serve.host import ModelHost
from runtime.serve.messages import ChatRequest, ImagePart, Message
from scheduler.transaction import StepOptions

log = structlog.get_logger("kvagent.serve")

CONVERSATION_HEADER = "x-kvagent-conversation"


def image_key(image: ImagePart) -> str:
    """Identity of a client's image: its PNG bytes (a client resends retained screenshots
    byte for byte; one that re-encodes them only loses reuse, never exactness)."""
    return hashlib.blake2b(image.png, digest_size=16).hexdigest()


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
    conversation_id: str
    explicit: bool  # the client named it
    system: str
    instruction: str
    answers: list[str] = attrs.Factory(list)  # the history lines, the last one predicted
    keys: list[str] = attrs.Factory(list)  # the log's screenshots, in order
    mode: str = "terminal"
    #: faithful mode: each message of the last request (role, text, image keys)
    signature: list[tuple[str, str, tuple[str, ...]]] = attrs.Factory(list)

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


@attrs.frozen
class ChatOutcome:
    conversation_id: str
    mode: str
    step: DriverStep
    text: str
    finish_reason: str  # stop | length


class ChatService:
    def __init__(self, host: ModelHost) -> None:
        self.host = host
        self.conversations: dict[str, Conversation] = {}

    def _evictable(self, hosted: PooledEpisode) -> bool:
        """Chat conversations have no end: an idle one gives its slot to a new one."""
        return hosted.episode_id in self.conversations

    async def complete(self, req: ChatRequest, key: str | None, *,
                       on_token: Callable[[int], None] | None = None) -> ChatOutcome:
        arrived = time.perf_counter()  # the request's bytes (its screenshot) are in hand
        self.forget_closed()
        mode = req.mode or self.host.config.mode
        turns = terminal_turns(req.messages) if mode == "terminal" else None
        if turns is None:
            from runtime.serve.faithful import complete_faithful
            return await complete_faithful(self, req, key, arrived=arrived, on_token=on_token)
        conv = self._find(turns, key)
        if conv is None or not conv.continues(turns):
            conv = await self._start(turns, key, conv)
        options = self.options(req, on_token)
        step = await self.host.episodes.step(conv.conversation_id, turns.images[-1].png,
                                             arrived_at=arrived, options=options)
        session = self.host.episodes.get(conv.conversation_id).driver.session
        conv.keys.append(turns.keys[-1])
        conv.answers.append(session.history_text or "")  # what the prefetch now appends
        self.host.metrics.step("chat", step.metrics)
        text = step.act.record.output_text
        return ChatOutcome(conv.conversation_id, "terminal", step, text,
                           finish_reason(self.host, step, options))

    def _find(self, turns: TerminalTurns, key: str | None) -> Conversation | None:
        if key is not None:
            return self.conversations.get(key)
        if not turns.answers:
            return None  # a first request: nothing to continue
        for conv in self.conversations.values():
            if (not conv.explicit and conv.mode == "terminal" and conv.answers
                    and conv.answers[-1] == turns.answers[-1]
                    and conv.continues(turns)):
                return conv
        return None

    async def _start(self, turns: TerminalTurns, key: str | None,
                     old: Conversation | None) -> Conversation:
        """A new conversation holding the request's past steps (or a restart of ``old``)."""
        if old is not None:
            log.info("chat_restart", conversation_id=old.conversation_id,
                     reason="the request does not continue what the conversation holds")
            await self.close(old.conversation_id)
        new_id, n = self.host.new_id("chat")
        conv_id = key if key is not None else new_id
        config = attrs.evolve(self.host.config.agent, profile="chat", grammar=False,
                              system_prompt=turns.system, decode_tokens=None,
                              window=max(self.host.config.agent.window, 1))
        screen = turns.images[-1].size
        # seed 0: a request and its seed alone decide the sampling, whatever the conversation
        await self.host.episodes.open(conv_id, config, turns.instruction, screen, seed=0,
                                      evictable=self._evictable)
        conv = Conversation(conv_id, key is not None, turns.system, turns.instruction)
        self.conversations[conv_id] = conv
        driver = self.host.episodes.get(conv_id).driver
        for image, answer, k in zip(turns.images, turns.answers, turns.keys):
            await driver.observe(image.png, answer)  # earlier turns: told, not decided
            conv.keys.append(k)
            conv.answers.append(answer)
        return conv

    def options(self, req: ChatRequest, on_token: Callable[[int], None] | None) -> StepOptions:
        """The request's decoding: its budget, sampling and stop strings."""
        s = req.sampling
        seed = s.seed if s.seed is not None else 0
        return StepOptions(decode_tokens=s.max_tokens, stop_at_eog=True, stop=s.stop,
                           sampling=SamplingParams(temperature=s.temperature, top_p=s.top_p,
                                                   seed=seed % (1 << 63)),
                           on_token=on_token)

    async def close(self, conversation_id: str) -> None:
        self.conversations.pop(conversation_id, None)
        await self.host.episodes.close(conversation_id)

    def forget_closed(self) -> None:
        """Drop conversations whose episode the host closed (evicted for a new one)."""
        for cid in [c for c in self.conversations if c not in self.host.episodes.episodes]:
            del self.conversations[cid]


def finish_reason(host: ModelHost, step: DriverStep, options: StepOptions) -> str:
    """OpenAI's: ``stop`` (end of generation or a stop string), ``length`` (the budget)."""
    tokens = step.act.record.output_tokens
    if tokens and host.engine.is_end_of_generation(tokens[-1]):
        return "stop"
    return "stop" if len(tokens) < options.decode_tokens else "length"


def completion_body(host: ModelHost, out: ChatOutcome, created: int) -> dict[str, Any]:
    m = out.step.metrics
    return {
        "id": f"chatcmpl-{out.conversation_id}-{m.step}", "object": "chat.completion",
        "created": created, "model": host.model_name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": out.text},
                     "finish_reason": out.finish_reason}],
        "usage": {"prompt_tokens": m.context_tokens, "completion_tokens": m.decode_tokens,
                  "total_tokens": m.context_tokens + m.decode_tokens},
        "kvagent": kvagent_fields(out),
    }


def kvagent_fields(out: ChatOutcome) -> dict[str, Any]:
    """kvagent's per-request measurements (an extension field clients ignore)."""
    m = out.step.metrics
    return {"conversation_id": out.conversation_id, "mode": out.mode, "step": out.step.act.index,
            "prefill_tokens": m.prefill_tokens, "reused_tokens": m.reused_tokens,
            "critical_path_prefill_tokens": m.critical_path_prefill_tokens,
            "prefetch_prefill_tokens": m.prefetch_prefill_tokens,
            "new_content_tokens": m.new_content_tokens, "encode_s": m.encode_s,
            "prefill_s": m.prefill_s, "decode_s": m.decode_s,
            "critical_path_s": m.critical_path_s}


def validate_model(host: ModelHost, req: ChatRequest) -> None:
    if req.model != host.model_name:
        from runtime.serve.http.errors import not_found
        raise not_found(f"the model {req.model!r} does not exist; this server serves "
                        f"{host.model_name!r}", param="model", code="model_not_found")


async def parse_request(host: ModelHost, body: dict[str, Any]) -> ChatRequest:
    from runtime.serve.http.chat_requests import parse_chat

    req = await anyio.to_thread.run_sync(parse_chat, body, host.config.limits)
    validate_model(host, req)
    if req.sampling.max_tokens > host.config.engine.n_ctx_per_seq // 2:  # the prompt needs room too
        req = attrs.evolve(req, sampling=attrs.evolve(req.sampling,
                                                      max_tokens=host.config.engine.n_ctx_per_seq // 2))
    return req


async def chat_completions(host: ModelHost, body: dict[str, Any],
                           headers: Any = None) -> Any:
    from runtime.serve.http.streaming import chat_response

    req = await parse_request(host, body)
    key = (headers.get(CONVERSATION_HEADER) if headers is not None else None) or req.user
    return await chat_response(host, req, key)

