"""Terminal chat mode: a conversation re-laid into kvagent's terminal layout.

The request — read as agent steps (``conversation.terminal_turns``) — becomes, under the
server's default (``CHAT_POLICY``, chrono-slot), ``[system][first user text][one line per
answer whose screenshot left the window][each of the last K screenshots followed by its
answer's line][generation prompt]``; under an explicit ``--policy``, that policy's layout
(terminal-slot: ``[system][first user text][one line per answer][last K screenshots]
[generation prompt]``).  Either way the step reuses everything but the new screenshot
(chrono-slot while the window fills: the request appends to the last one), and after
answering the pool prefetches what the next request will certainly hold: the answer as a
line and the retained screenshots.  It changes the prompt the model sees (answers the
client no longer sends are kept as lines; user text after the first user message is not
shown).

A request names its conversation (an explicit key, scoped to the caller's API key) or is
matched to the caller's implicit one whose last answer and retained screenshots it repeats.
A conversation that fails its first step is closed at once (it never answered: its slot must
not stay taken).  A request that does not continue what its
conversation holds (an edited answer, other screenshots) restarts it from its own content:
outputs never depend on a wrong prediction.
"""

from __future__ import annotations

import anyio
import attrs
import structlog

from runtime.config import AgentConfig
from runtime.driver import DriverStep
from runtime.pool import EpisodePool
from runtime.serve.conversation import Conversation, TerminalTurns
from runtime.serve.conversations import Conversations
from runtime.serve.ids import new_id
from runtime.serve.owners import Owner
from scheduler.transaction import StepOptions

log = structlog.get_logger("kvagent.serve")

#: The chat API's terminal-mode policy when the server is given none: exact, and laid out
#: chronologically — each retained screenshot followed by its answer's line, as OSWorld's
#: agents send them — so that while a conversation's window fills each request's prompt
#: extends the last one's and is appended, where terminal-slot's history lines precede the
#: window and re-prefill it from the second request on (``cachepolicy/policies/
#: chrono_slot.py``).  Its window cannot pin screenshots: with ``--pin-first`` the chat
#: keeps terminal-slot.
CHAT_POLICY = "chrono-slot"


def chat_policy(policy: str | None, pinned: int) -> str | None:
    """``ServeConfig.chat_policy`` from ``kvagent serve``'s ``--policy`` (None: not given)
    and ``--pin-first``: ``CHAT_POLICY`` when neither asks for anything, else None (the
    chat runs the episodes' policy)."""
    return CHAT_POLICY if policy is None and pinned == 0 else None


class TerminalChat:
    """Answers terminal-mode requests; ``agent`` is the server's agent configuration (the
    window, sampling defaults) that conversations are opened with."""

    def __init__(self, pool: EpisodePool, conversations: Conversations, agent: AgentConfig,
                 *, policy: str | None = None) -> None:
        self._pool, self._conversations = pool, conversations
        self._agent = agent
        self._policy = policy or agent.policy  # ServeConfig.chat_policy, else the episodes'

    async def complete(self, turns: TerminalTurns, key: str | None, owner: Owner,
                       options: StepOptions, *, arrived_at: float) -> tuple[str, DriverStep]:
        """Answer ``turns`` in ``owner``'s conversation ``key`` names (or the one it
        continues); returns the conversation's id and the decided step."""
        conv = self._find(turns, key, owner)
        opened = conv is None or not conv.continues(turns)
        if opened:
            conv = await self._start(turns, key, owner, conv)
        assert conv is not None
        try:
            step = await self._pool.step(conv.conversation_id, turns.images[-1].png,
                                         arrived_at=arrived_at, options=options)
        except BaseException:
            if opened:  # opened here and never answered: its slot must not stay taken
                with anyio.CancelScope(shield=True):
                    await self._conversations.close(conv.conversation_id)
            raise
        conv.stepped = True
        conv.keys.append(turns.keys[-1])
        # what the prefetch now appends
        conv.answers.append(self._pool.get(conv.conversation_id).driver.session.history_text
                            or "")
        return conv.conversation_id, step

    def _find(self, turns: TerminalTurns, key: str | None,
              owner: Owner) -> Conversation | None:
        if key is not None:
            return self._conversations.named(owner, key)
        if not turns.answers:
            return None  # a first request: nothing to continue
        for conv in self._conversations.implicit("terminal", owner):
            if conv.answers and conv.answers[-1] == turns.answers[-1] and conv.continues(turns):
                return conv
        return None

    async def _start(self, turns: TerminalTurns, key: str | None, owner: Owner,
                     old: Conversation | None) -> Conversation:
        """A new conversation holding the request's past steps (or a restart of ``old``)."""
        if old is not None:
            log.info("chat_restart", conversation_id=old.conversation_id,
                     reason="the request does not continue what the conversation holds")
            await self._conversations.close(old.conversation_id)
        config = attrs.evolve(self._agent, profile="chat", grammar=False,
                              policy=self._policy,
                              system_prompt=turns.system, decode_tokens=None,
                              window=max(self._agent.window, 1))
        conv = Conversation(new_id("chat"), owner, key, turns.system, turns.instruction)
        pooled = await self._conversations.open(conv, config, turns.images[-1].size)
        try:
            for image, answer, k in zip(turns.images, turns.answers, turns.keys):
                await pooled.driver.observe(image.png, answer)  # earlier turns: told
                conv.keys.append(k)
                conv.answers.append(answer)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._conversations.close(conv.conversation_id)
            raise
        return conv
